"""Which figures and tables a sweep gets, in reading order.

MLP sweeps: weight continuity (v1, u1, sigma2) vs epoch, gradient coherence and Delta_GW, final
Delta_GW bars, update ratio and accuracy, the init-scale dynamics when the sweep sets the init
scale, and the paper's MLP table beside the reproduced values. Transformer sweeps: per-projection
continuity curves and a role x space heatmap, training curves, the paper's transformer table.
`geocont analyze` outputs: a per-pair heatmap per checkpoint, beside the paper's Llama-3.1-8B row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from geocont.metrics import spikes
from geocont.paper import format_paper_table, paper_table, pretrained_reference, table_spec
from geocont.report import data
from geocont.report.figures import Figure, bars_figure, curves_figure, heatmap_figure, paper_figure, role_sort, slug

MLP_CONTINUITY = ["weight/v1_continuity", "weight/u1_continuity", "weight/sigma2_continuity"]
GRADIENT = re.compile(r"^grad_cum/(?:[a-z]+/)?(v1|u1)_continuity$|^delta_gw/(?:[a-z]+/)?(v1|u1)$")
DELTA = re.compile(r"^delta_gw/(?:[a-z]+/)?(v1|u1)$")
GRAD_INIT = re.compile(r"^grad_init/(?:[a-z]+/)?(v1|u1)_continuity$")  # measured once: bars, not curves
TRAINING = ["update_ratio", "val/acc", "val/ppl", "val/loss", "train/loss"]
INIT_SCALE = ["weight/v1_continuity", "grad_cum/v1_continuity", "update_ratio"]


@dataclass
class Table:
    title: str
    caption: str
    frame: pl.DataFrame  # every cell already text
    collapsed: bool = False  # long tables start folded (<details>) so the figures stay near the top


@dataclass
class Section:
    id: str
    title: str
    summary: str
    blocks: list[Figure | Table] = field(default_factory=list)  # in reading order

    @property
    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]

    @property
    def tables(self) -> list[Table]:
        return [b for b in self.blocks if isinstance(b, Table)]


def sweep_section(sweep: data.Sweep) -> Section:
    n_runs, n_done = sweep.runs.height, sweep.completed.height
    keys = ", ".join(sweep.variant_keys) or "none (one config)"
    summary = (
        f"{sweep.kind} sweep: {n_runs} finished runs ({n_done} completed), {len(sweep.variants)} variants "
        f"varying {keys}; bands are mean ± std over seeds."
    )
    section = Section(slug(sweep.name), f"Sweep {sweep.name}", summary)
    status = data.status_counts(sweep)
    section.blocks.append(Table("Runs per variant and status", "", _text(status), collapsed=status.height > 12))
    figures = [FIGURES[name] for name in sweep.model_kind.report]
    for builder in (_spike_table, *figures, _paper, paper_comparison):
        block = builder(sweep)
        if block is not None:
            section.blocks.append(block)
    return section


def _present(sweep: data.Sweep, names: list[str]) -> list[str]:
    have = set(data.metric_names(sweep))
    return [n for n in names if n in have]


def _x_title(sweep: data.Sweep) -> str:
    return "epoch" if sweep.x == "epoch" else "step"


def _sweep_curves(
    sweep: data.Sweep,
    key: str,
    title: str,
    caption: str,
    names: list[str],
    columns: int,
    frame: pl.DataFrame | None = None,
    peaks: bool = False,
) -> Figure:
    """A curves figure of `names` over the sweep's variants; `frame` defaults to their mean ± std curves.

    Where a loss spike distorts a drawn metric, a red triangle marks it and the caption says so.
    """
    frame = data.mark_spikes(sweep, data.curves(sweep, names) if frame is None else frame)
    if "spike" in frame.columns and frame["spike"].any():
        caption += SPIKE_NOTE
    fig_id = f"{slug(sweep.name)}-{key}"
    return curves_figure(fig_id, title, caption, frame, names, sweep.variants, _x_title(sweep), columns, peaks)


SPIKE_NOTE = (
    f" Red triangles: a loss spike (a step whose loss exceeded {spikes.DEFAULT_FACTOR:g}x the running "
    f"{spikes.DEFAULT_QUANTILE:.0%} quantile of its last {spikes.DEFAULT_WINDOW} steps) in "
    "at least one seed of that variant; from there on the cumulative gradient, Delta_GW and Adam's update "
    "size are dominated by that step (table 'Loss spikes')."
)


def _spike_table(sweep: data.Sweep) -> Table | None:
    if sweep.spikes.is_empty():
        return None
    frame = sweep.spikes.select(
        "variant",
        pl.col("seed").cast(pl.String),
        pl.col("step").cast(pl.String),
        pl.col("x").cast(pl.String).alias(_x_title(sweep)),
        pl.col("ratio").map_elements(lambda r: f"{r:.3g}", return_dtype=pl.String).alias("loss / running level"),
        pl.col("found_by").alias("found by"),
    )
    caption = (
        f"{frame.height} spike(s) in {sweep.spikes['run_id'].n_unique()} run(s). Final grad_cum, delta_gw and "
        "update_ratio of these runs describe the spike rather than training; `train.grad_clip` bounds such steps. "
        "'training': recorded while the run trained (every step); 'logged loss': found here in the logged "
        "train/loss of a run that has no record (every 10th step; a short spike can fall between samples)."
    )
    return Table("Loss spikes", caption, frame, collapsed=frame.height > 12)


def _continuity_mlp(sweep: data.Sweep) -> Figure | None:
    names = _present(sweep, MLP_CONTINUITY)
    if not names:
        return None
    return _sweep_curves(
        sweep,
        "continuity",
        "Weight continuity vs epoch",
        "Mean |cos| between the leading singular vectors of adjacent layers (v1: input space, u1: output space) "
        "and the sigma2-weighted alignment, per variant; the band is one std over seeds. Random layers sit near "
        "sqrt(2/(pi d)).",
        names,
        columns=3,
    )


def _gradient(sweep: data.Sweep) -> Figure | None:
    names = sorted((n for n in data.metric_names(sweep) if GRADIENT.match(n)), key=_gradient_order)
    if not names:
        return None
    return _sweep_curves(
        sweep,
        "gradient",
        "Gradient coherence and Delta_GW",
        "Continuity of the cumulative gradient sum_t G_l(t) (grad_cum) and Delta_GW = grad_cum - weight "
        "continuity, per epoch. The first backward pass (grad_init) is in the bars below.",
        names,
        columns=4,
    )


def _gradient_order(name: str) -> tuple:
    family = name.split("/", 1)[0]
    return ({"grad_init": 0, "grad_cum": 1, "delta_gw": 2}.get(family, 3), "u1" in name, name)


def _delta_bars(sweep: data.Sweep) -> Figure | None:
    init = sorted((n for n in sweep.runs.columns if GRAD_INIT.match(n)), key=lambda n: ("u1" in n, n))
    delta = sorted((n for n in sweep.runs.columns if DELTA.match(n)), key=lambda n: ("u1" in n, n))
    names = init + delta
    frame = data.finals(sweep, names)
    if frame.is_empty():
        return None
    return bars_figure(
        f"{slug(sweep.name)}-delta-gw",
        "Gradient coherence at init and final Delta_GW per variant",
        "grad_init: continuity of the very first backward pass (residual nets are coherent before any step, "
        "~0.95 in the paper; without residuals it is at chance). Delta_GW at the end of training (mean over "
        "seeds, rule = ± one std): small with symmetry-breaking activations (the weights kept the gradient's "
        "frame), large for None / Radial (rotational drift), non-positive without residuals.",
        frame,
        names,
        sweep.variants,
    )


def _training(sweep: data.Sweep) -> Figure | None:
    names = _present(sweep, TRAINING)
    if not names:
        return None
    return _sweep_curves(
        sweep,
        "training",
        "Update ratio, accuracy / perplexity and loss",
        "update_ratio = ||W(t) - W(0)||_F / ||W(0)||_F averaged over layers: weights follow the gradient's "
        "frame once it dominates W(0). val/acc is a fraction of the validation set.",
        names,
        columns=4,
    )


def _init_scale(sweep: data.Sweep) -> Figure | None:
    names = _present(sweep, INIT_SCALE)
    if not data.is_init_scale(sweep) or not names:
        return None
    frame = data.curves(sweep, names)
    # A dot at each curve's peak: on weight/v1 the end of formation. Every panel gets dots, so none has an
    # empty point layer (Vega warns about the infinite extent of an empty one).
    frame = frame.with_columns(peak=pl.col("mean") == pl.col("mean").max().over("variant", "metric"))
    return _sweep_curves(
        sweep,
        "init-scale",
        "Init-scale dynamics: formation, then collapse",
        "With a tiny init the first updates dominate W(0): weight continuity forms at once from the coherent "
        "residual gradient (dots: each curve's peak), then, without symmetry breaking, the layers drift apart "
        "along the flat rotational directions and continuity collapses.",
        names,
        columns=3,
        frame=frame,
        peaks=True,
    )


def _continuity_roles(sweep: data.Sweep) -> Figure | None:
    by_role = [n for n in data.metric_names(sweep) if data.ROLE_METRIC.match(n)]
    if not by_role:
        return None
    roles = role_sort(sorted({data.ROLE_METRIC.match(n)["role"] for n in by_role}), sweep.model_kind.roles)
    names = [f"weight/{r}/{s}_continuity" for s in ("v1", "u1") for r in roles]
    names = [n for n in names if n in set(by_role)]
    return _sweep_curves(
        sweep,
        "projections",
        "Per-projection weight continuity",
        " ".join(
            [
                "v1 (input space) and u1 (output space) continuity of each weight role across layers.",
                sweep.model_kind.role_note,
            ]
        ).strip(),  # fmt: skip
        names,
        columns=len(roles),
    )


def _projection_heatmap(sweep: data.Sweep) -> Figure | None:
    grid = data.projection_grid(sweep)
    if grid.is_empty():
        return None
    return heatmap_figure(
        f"{slug(sweep.name)}-projection-heatmap",
        "Final continuity per projection",
        "Mean over seeds of the final v1 / u1 continuity, per role and variant.",
        grid,
        x="role",
        y="variant",
        value="value",
        facet="space",
        x_sort=role_sort(grid["role"].unique().to_list(), sweep.model_kind.roles),
        y_sort=sweep.variants,
        facet_sort=["v1", "u1"],
    )


def _delta_heatmap(sweep: data.Sweep) -> Figure | None:
    grid = data.projection_grid(sweep, data.ROLE_DELTA)
    if grid.is_empty():
        return None
    return heatmap_figure(
        f"{slug(sweep.name)}-delta-gw-heatmap",
        "Final Delta_GW per projection",
        "Delta_GW = grad_cum - weight continuity per role and space (mean over seeds): near zero where the weights "
        "kept the coherent gradient's frame, positive where they drifted away from it.",
        grid,
        x="role",
        y="variant",
        value="value",
        facet="space",
        x_sort=role_sort(grid["role"].unique().to_list(), sweep.model_kind.roles),
        y_sort=sweep.variants,
        facet_sort=["v1", "u1"],
        domain=(-1.0, 1.0),
        scheme="redblue",
        legend_title="Delta_GW",
    )


# The figures a model kind can name in its `report` (geocont.kinds.base.ModelKind), in no particular order.
FIGURES = {
    "continuity": _continuity_mlp,
    "gradient": _gradient,
    "delta_bars": _delta_bars,
    "training": _training,
    "init_scale": _init_scale,
    "role_continuity": _continuity_roles,
    "projection_heatmap": _projection_heatmap,
    "delta_heatmap": _delta_heatmap,
}


def _paper(sweep: data.Sweep) -> Table | None:
    which = sweep.model_kind.paper_table
    if which is None:
        return None
    table = paper_table(sweep.runs, which)
    table = table.filter((pl.col("runs") > 0) | (pl.col("diverged") > 0))
    if table.is_empty():
        return None
    spec = table_spec(which)
    caption = (
        f"{spec['title']}: reproduced mean ± std over seeds beside the paper's value. Runs are matched to "
        "the paper's rows by residual, activation and norm only (depth, width, data and epochs may differ). "
        "acc is in percent (val/acc x 100)."
    )
    return Table(f"The paper's table, reproduced ({which})", caption, format_paper_table(table, which))


def paper_comparison(sweep: data.Sweep) -> Figure | None:
    """The reproduced table as a figure (for a paper): one panel per column."""
    which = sweep.model_kind.paper_table
    if which is None:
        return None
    table = paper_table(sweep.runs, which).filter(pl.col("runs") > 0)
    if table.is_empty():
        return None
    columns = [c["label"] for c in table_spec(which)["columns"]]
    rows = []
    for rec in table.iter_rows(named=True):
        for col in columns:
            mean, std, paper = rec[f"{col} mean"], rec[f"{col} std"] or 0.0, rec[f"{col} paper"]
            if mean is not None:
                rows.append(
                    {
                        "config": rec["config"],
                        "column": col,
                        "source": "reproduced",
                        "value": mean,
                        "lo": mean - std,
                        "hi": mean + std,
                    }
                )
            if paper is not None:
                rows.append(
                    {
                        "config": rec["config"],
                        "column": col,
                        "source": "paper",
                        "value": paper,
                        "lo": paper,
                        "hi": paper,
                    }
                )
    return paper_figure(
        f"{slug(sweep.name)}-paper",
        "Reproduced vs the paper",
        "Circles: this store's mean (rule: ± one std over seeds); diamonds: the paper's value.",
        pl.DataFrame(rows),
        table["config"].to_list(),
        columns,
    )


def analysis_section(paths: list[Path]) -> Section | None:
    """Heatmaps of `geocont analyze --out` files and their per-role means beside the paper's Llama-3.1-8B row."""
    if not paths:
        return None
    section = Section(
        "pretrained",
        "Pretrained checkpoints (geocont analyze)",
        "Per adjacent-layer pair |cos| of the leading singular vectors, per projection role.",
    )
    means = []
    for i, path in enumerate(paths):
        frame = data.read_analysis(path)
        roles = role_sort(frame["role"].unique().to_list())
        section.blocks.append(
            heatmap_figure(
                f"analysis-{i}-{slug(path.stem)}",
                f"{path.name}: continuity per layer pair",
                "Each cell is one adjacent pair (layer, layer + 1) of one role; hover for the spectral gap s1/s2 "
                "(v1 is ill-defined when it is close to 1).",
                frame,
                x="layer",
                y="role",
                value="cos",
                facet="space",
                y_sort=roles,
                facet_sort=["v1", "u1"],
                tooltip_extra=("gap:Q",),
            )
        )
        # Like the CLI table: means over the pairs where v1 / u1 is defined (flagged pairs left out).
        defined_cos = pl.col("cos").filter(pl.col("defined")).mean()
        means.append(frame.group_by("role", "space").agg(defined_cos.alias(path.name)))
    section.blocks.append(_analysis_table(means))
    return section


def _analysis_table(means: list[pl.DataFrame]) -> Table:
    merged = means[0]
    for frame in means[1:]:
        merged = merged.join(frame, on=["role", "space"], how="full", coalesce=True)
    ref = pl.DataFrame(pretrained_reference("Llama-3.1-8B")).select(
        "role", "space", pl.col("value").alias("Llama-3.1-8B (paper)")
    )
    merged = merged.join(ref, on=["role", "space"], how="left")
    order = {r: i for i, r in enumerate(role_sort(merged["role"].unique().to_list()))}
    merged = merged.sort(pl.col("role").replace_strict(order, return_dtype=pl.Int64), pl.col("space") == "u1")
    return Table(
        "Mean continuity per role", "Mean over layer pairs, beside the paper's Llama-3.1-8B values.", _text(merged)
    )


def _text(frame: pl.DataFrame) -> pl.DataFrame:
    """Every cell as display text (floats to 3 decimals, missing as '–')."""
    cols = []
    for name, dtype in frame.schema.items():
        col = pl.col(name)
        if dtype.is_float():
            col = col.round(3).cast(pl.String)
        cols.append(col.cast(pl.String).fill_null("–").alias(name))
    return frame.select(cols)
