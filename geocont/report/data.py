"""Report data: read one store once, label each run's variant, aggregate over seeds.

Everything here is polars over `geocont.store.runs()` / `metrics()`; the figures get small
aggregated frames (one row per variant, x and metric), never the raw per-run rows, which keeps
the HTML small and the browser fast for sweeps of hundreds of runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from geocont import catalog, kinds, store
from geocont.config import ConfigError
from geocont.metrics import spikes
from geocont.tables import config_column

# Config columns that never define a variant: the seed (aggregated over), bookkeeping, tracking.
NOT_VARIANT = re.compile(r"^(train\.seed|tracking\..*|preset|run_id|sweep|status|name|node|error|started|finished)$")
ROLE_METRIC = re.compile(r"^weight/(?P<role>[a-z]+)/(?P<space>v1|u1)_continuity$")
PAPER_KEYS = ("model.residual", "model.activation", "model.norm")
# One huge step swamps the cumulative gradient (and so Delta_GW) and Adam's second moments (the update ratio).
SPIKE = catalog.SPIKE
SPIKE_DISTORTS = re.compile(r"^(grad_cum|delta_gw)/|^update_ratio|^train/loss$")
ACTIVATION_NAMES = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "tanh": "Tanh", "none": "None", "radial": "Radial"}


@dataclass
class Sweep:
    """One sweep's runs (one row each, with `variant`) and long metrics of its completed runs."""

    name: str
    kind: str  # model.kind of the first run (geocont.kinds)
    runs: pl.DataFrame
    metrics: pl.DataFrame  # run_id, variant, x, name, value (finite values of completed runs only)
    x: str  # "epoch", or "step" when every run logs within one epoch (language models)
    variants: list[str]  # variants with a completed run (what figures draw), in the paper's order
    all_variants: list[str]  # every variant, failed and diverged ones too (the status table)
    variant_keys: list[str]  # config columns that vary across the sweep (seed excluded)
    spikes: pl.DataFrame  # run_id, variant, seed, step, x, ratio, found_by: every loss spike of a finished run

    @property
    def model_kind(self) -> kinds.ModelKind:
        return kinds.get(self.kind)

    @property
    def completed(self) -> pl.DataFrame:
        return self.runs.filter(pl.col("status") == "completed")


def load_sweeps(store_dir: Path, sweep: str | None = None) -> list[Sweep]:
    """Every sweep in the store (or the one named) with at least one finished run."""
    names = [sweep] if sweep else store.sweep_names(store_dir)
    runs = store.runs(store_dir, sweep).collect()
    if runs.is_empty():
        where = f"sweep {sweep!r} in " if sweep else ""
        known = ", ".join(store.sweep_names(store_dir)) or "none"
        raise ConfigError([f"--store {store_dir}: no finished runs for {where}this store (sweeps: {known})"])
    long = _long_metrics(store_dir, runs)
    return [_sweep(name, runs.filter(pl.col("sweep") == name), long) for name in names if name in set(runs["sweep"])]


def _long_metrics(store_dir: Path, runs: pl.DataFrame) -> pl.DataFrame:
    """The metrics.parquet of each finished run (the store's documented layout), with its sweep.

    store.metrics() would parse every config.yaml a second time to join config columns that runs()
    already has; with hundreds of runs that parse is most of the report's time.
    """
    files = [store.run_dir(store_dir, s, r) / "metrics.parquet" for s, r in runs.select("sweep", "run_id").rows()]
    files = [str(f) for f in files if f.is_file()]
    if not files:
        return pl.DataFrame(schema={**store.METRIC_SCHEMA, "sweep": pl.String})
    frame = pl.read_parquet(files, schema=store.METRIC_SCHEMA, include_file_paths="_file")
    return frame.with_columns(sweep=pl.col("_file").str.split("/").list.get(-3)).drop("_file")


def _sweep(name: str, runs: pl.DataFrame, long: pl.DataFrame) -> Sweep:
    keys = varying_keys(runs)
    runs = runs.with_columns(variant=pl.Series([variant_label(r, keys) for r in runs.iter_rows(named=True)]))
    runs = runs.sort("variant")
    kind = str(runs["model.kind"][0]) if "model.kind" in runs.columns else kinds.DEFAULT
    completed = runs.filter(pl.col("status") == "completed").select("run_id", "variant")
    rows = long.filter(pl.col("sweep") == name).join(completed, on="run_id", how="inner")
    rows = rows.filter(pl.col("value").is_finite())
    x = "epoch" if _epochs_per_run(rows) > 1 else "step"
    # The final log may repeat the last epoch's values: keep one value per (run, x, metric), the latest.
    rows = (
        rows.sort("step", "epoch")
        .group_by("run_id", "variant", x, "name", maintain_order=True)
        .agg(pl.col("value").last())
        .rename({x: "x"})
    )
    every = sorted(set(runs["variant"]), key=lambda v: _variant_order(runs, v, keys))
    drawn = set(completed["variant"])
    variants = [v for v in every if v in drawn]
    found = _spikes(long.filter(pl.col("sweep") == name), runs, x)
    return Sweep(name, kind, runs, rows, x, variants, every, keys, found)


def _spikes(long: pl.DataFrame, runs: pl.DataFrame, x: str) -> pl.DataFrame:
    """One row per loss spike: run, variant, seed, step, x (epoch or step), loss / level, and where it was found.

    Runs trained with the detector carry `train/spike` rows ("training"). For runs without any, older
    stores included, the detector runs here over the logged train/loss ("logged loss"), its window and
    warm-up scaled to the logging interval: a blow-up lasts dozens of steps, so the samples catch it.
    """
    seed = pl.col("train.seed") if "train.seed" in runs.columns else pl.lit(None, dtype=pl.Int64)
    who = runs.select("run_id", "variant", seed.alias("seed"))
    found = long.filter((pl.col("name") == SPIKE) & pl.col("value").is_finite())
    found = found.select("run_id", "step", pl.col(x).alias("x"), pl.col("value").alias("ratio"))
    logged = long.filter((pl.col("name") == "train/loss") & ~pl.col("run_id").is_in(found["run_id"].unique()))
    frames = [found.with_columns(found_by=pl.lit("training")), _detected(logged, x)]
    return (
        pl.concat(frames, how="vertical_relaxed")
        .join(who, on="run_id", how="inner")
        .select("run_id", "variant", "seed", "step", "x", "ratio", "found_by")
        .sort("variant", "seed", "step")
    )


def _detected(losses: pl.DataFrame, x: str) -> pl.DataFrame:
    """Spikes found by geocont.metrics.spikes over each run's logged (sampled) train/loss."""
    rows = []
    for (run_id,), run in losses.sort("step").group_by("run_id", maintain_order=True):
        run = run.unique("step", keep="last", maintain_order=True)  # a final log may repeat the last step
        steps = run["step"].to_list()
        every = max(1, int(pl.Series(steps).diff().median() or 1)) if len(steps) > 1 else 1
        window = max(10, spikes.DEFAULT_WINDOW // every)
        warmup = max(5, spikes.DEFAULT_WARMUP // every)
        at = dict(zip(steps, run[x].to_list()))
        for spike in spikes.detect(run["value"].to_list(), steps=steps, window=window, warmup=warmup):
            ratio = spike["loss"] / spike["level"]
            rows.append({"run_id": run_id, "step": spike["step"], "x": at[spike["step"]], "ratio": ratio})
    schema = {"run_id": pl.String, "step": pl.Int64, "x": pl.Int64, "ratio": pl.Float64}
    return pl.DataFrame(rows, schema=schema).with_columns(found_by=pl.lit("logged loss"))


def mark_spikes(sweep: Sweep, frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (curves) with a `spike` column: true at the first point of a distorted metric's curve at or
    after a spike of that variant (any seed), where the curve first carries the spike's effect."""
    if sweep.spikes.is_empty() or frame.is_empty():
        return frame
    points = frame.filter(pl.col("metric").str.contains(SPIKE_DISTORTS.pattern)).select("variant", "metric", "x")
    hits = (
        sweep.spikes.select("variant", pl.col("x").alias("spike_x"))
        .unique()
        .join(points, on="variant", how="inner")
        .filter(pl.col("x") >= pl.col("spike_x"))
        .group_by("variant", "metric", "spike_x")
        .agg(pl.col("x").min())
        .select("variant", "metric", "x", spike=pl.lit(True))
        .unique()
    )
    return frame.join(hits, on=["variant", "metric", "x"], how="left").with_columns(pl.col("spike").fill_null(False))


def _epochs_per_run(rows: pl.DataFrame) -> int:
    if rows.is_empty():
        return 0
    return int(rows.group_by("run_id").agg(pl.col("epoch").n_unique()).get_column("epoch").max())


def varying_keys(runs: pl.DataFrame) -> list[str]:
    """Config columns with more than one value across the runs: what a variant is made of."""
    config_columns = [c for c in runs.columns if "." in c and "/" not in c and not NOT_VARIANT.match(c)]
    return [c for c in config_columns if config_column(runs, c).cast(pl.String).n_unique() > 1]


def variant_label(run: dict, keys: list[str]) -> str:
    """'Res + ReLU + LN', in the paper's words, then any other varying key as 'key=value'."""
    parts = []
    if "model.residual" in run:
        parts.append("Res" if run["model.residual"] else "NoRes")
    if "model.activation" in run:
        parts.append(ACTIVATION_NAMES.get(run["model.activation"], str(run["model.activation"])))
    norm = _norm_label(run)
    if norm:
        parts.append(norm)
    extras = [_extra_label(key, run.get(key)) for key in keys if key not in PAPER_KEYS]
    label = " + ".join(parts) or "all runs"
    return f"{label}, {', '.join(extras)}" if extras else label


def _norm_label(run: dict) -> str:
    kind = kinds.get(run.get("model.kind") or kinds.DEFAULT)
    return kind.norm_labels.get(run.get("model.norm") or "", "")


def _extra_label(key: str, value: object) -> str:
    if key == "model.init_std":
        return f"init {value:g}" if isinstance(value, float) else "init default"
    short = key.split(".", 1)[1] if key.startswith(("model.", "optim.", "train.", "data.")) else key
    return f"{short}={value}"


KNOWN_ORDER = {
    "model.residual": [True, False],
    "model.activation": ["relu", "gelu", "silu", "tanh", "none", "radial"],
    "model.norm": ["none", "layernorm", "rmsnorm"],
}


def _variant_order(runs: pl.DataFrame, variant: str, keys: list[str]) -> tuple:
    """The paper's order (Res before NoRes, ReLU/GELU/SiLU before None/Radial, no norm first), then by value."""
    row = runs.filter(pl.col("variant") == variant).row(0, named=True)
    order = []
    for key in [*KNOWN_ORDER, *(k for k in keys if k not in KNOWN_ORDER)]:
        value = row.get(key)
        known = KNOWN_ORDER.get(key, [])
        rank = known.index(value) if value in known else len(known)
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
        order.append((value is None, rank, number, str(value)))
    return tuple(order)


# ---------------------------------------------------------------------------------------------
# Aggregates for the figures


def metric_names(sweep: Sweep) -> list[str]:
    return sorted(set(sweep.metrics["name"]))


def curves(sweep: Sweep, names: list[str]) -> pl.DataFrame:
    """Mean and a band of one std over seeds per (variant, x, metric): variant, x, metric, mean, lo, hi, n."""
    rows = sweep.metrics.filter(pl.col("name").is_in(names))
    out = rows.group_by("variant", "x", "name").agg(
        mean=pl.col("value").mean(), std=pl.col("value").std().fill_null(0.0), n=pl.len()
    )
    return (
        out.with_columns(lo=pl.col("mean") - pl.col("std"), hi=pl.col("mean") + pl.col("std"))
        .rename({"name": "metric"})
        .select("variant", "x", "metric", pl.col("mean", "lo", "hi").round(5), "n")
        .sort("metric", "variant", "x")
    )


def finals(sweep: Sweep, names: list[str]) -> pl.DataFrame:
    """Final value per completed run, then mean and std over seeds per (variant, metric)."""
    cols = [n for n in names if n in sweep.runs.columns]
    if not cols:
        return pl.DataFrame(
            schema={
                "variant": pl.String,
                "metric": pl.String,
                "mean": pl.Float64,
                "lo": pl.Float64,
                "hi": pl.Float64,
                "n": pl.UInt32,
            }
        )
    long = sweep.completed.select("variant", *cols).unpivot(index="variant", variable_name="metric")
    long = long.filter(pl.col("value").is_not_null() & pl.col("value").is_finite())
    out = long.group_by("variant", "metric").agg(
        mean=pl.col("value").mean(), std=pl.col("value").std().fill_null(0.0), n=pl.len()
    )
    return (
        out.with_columns(lo=pl.col("mean") - pl.col("std"), hi=pl.col("mean") + pl.col("std"))
        .select("variant", "metric", pl.col("mean", "lo", "hi").round(5), "n")
        .sort("metric", "variant")
    )


ROLE_DELTA = re.compile(r"^delta_gw/(?P<role>[a-z]+)/(?P<space>v1|u1)$")


def projection_grid(sweep: Sweep, pattern: re.Pattern = ROLE_METRIC) -> pl.DataFrame:
    """Final per-projection values (mean over seeds) of the metrics `pattern` matches: variant, role, space, value."""
    names = [n for n in sweep.runs.columns if pattern.match(n)]
    out = finals(sweep, names)
    parts = out["metric"].str.extract_groups(pattern.pattern)
    return out.with_columns(role=parts.struct.field("role"), space=parts.struct.field("space")).select(
        "variant", "role", "space", value=pl.col("mean"), n=pl.col("n")
    )


def status_counts(sweep: Sweep) -> pl.DataFrame:
    """Runs per variant and status (completed / failed / diverged), variants in legend order."""
    counts = sweep.runs.group_by("variant", "status").len().pivot(on="status", index="variant", values="len")
    statuses = [s for s in store.FINAL_STATUSES if s in counts.columns]
    order = {v: i for i, v in enumerate(sweep.all_variants)}
    return (
        counts.select("variant", *statuses)
        .fill_null(0)
        .sort(pl.col("variant").replace_strict(order, return_dtype=pl.Int64))
    )


def is_init_scale(sweep: Sweep) -> bool:
    """A sweep that sets the init scale: its curves are about formation then collapse."""
    return "model.init_std" in sweep.runs.columns and sweep.runs["model.init_std"].is_not_null().any()


# ---------------------------------------------------------------------------------------------
# `geocont analyze --out` files

ANALYSIS_COLUMNS = ("role", "layer", "space", "cos", "gap")


def read_analysis(path: Path) -> pl.DataFrame:
    """Per-pair details written by `geocont analyze --out` (role, layer, space, cos, gap)."""
    if not path.is_file():
        raise ConfigError([f"--analysis {path}: no such file"])
    try:
        frame = pl.read_parquet(path)
    except Exception as err:  # polars raises several types for a file that is not parquet
        raise ConfigError([f"--analysis {path}: not a parquet file ({type(err).__name__})"]) from None
    missing = [c for c in ANALYSIS_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(
            [f"--analysis {path}: missing columns {', '.join(missing)}; expected {', '.join(ANALYSIS_COLUMNS)}"]
        )
    # `geocont analyze` names the spaces input / output; figures use v1 / u1 like the training metrics.
    space = pl.col("space").replace({"input": "v1", "output": "u1"})
    # Pairs whose gap s1/s2 is too small to define v1 are flagged by analyze (`defined`); older files lack it.
    defined = pl.col("defined") if "defined" in frame.columns else pl.lit(True)
    return (
        frame.select(*ANALYSIS_COLUMNS, defined.alias("defined"))
        .with_columns(space=space, cos=pl.col("cos").abs())
        .filter(pl.col("cos").is_finite())
        .with_columns(gap=pl.when(pl.col("gap").is_finite()).then(pl.col("gap").round(4)), cos=pl.col("cos").round(5))
    )
