"""Tables over the results store for the terminal: per-run rows and per-variant aggregates."""

from __future__ import annotations

import json
import math

import polars as pl

from geocont import catalog
from geocont.config import LATER_FIELDS, OptimConfig, TrainConfig

IGNORED_CONFIG = ("train.seed", "tracking.", "preset")


def spiked_runs(frame: pl.DataFrame) -> int:
    """How many of the runs in `frame` had at least one loss spike."""
    return frame.get_column(catalog.SPIKE).is_not_null().sum() if catalog.SPIKE in frame.columns else 0


def config_column(frame: pl.DataFrame, name: str) -> pl.Series:
    """A config column as runs read it: a field added later (config.LATER_FIELDS) is missing from the
    config.yaml of runs written before it existed, which means its default, not a different value."""
    column = frame.get_column(name)
    section, _, key = name.partition(".")
    if (section, key) in LATER_FIELDS:
        model = {"optim": OptimConfig, "train": TrainConfig}[section]
        default = model.model_fields[key].default
        if default is not None:
            column = column.fill_null(default)
    return column


def varying_config_columns(frame: pl.DataFrame) -> list[str]:
    """Config columns whose value differs between runs (what distinguishes the variants), seed excluded."""
    columns = []
    for name in frame.columns:
        if "." not in name or name.startswith(IGNORED_CONFIG) or "/" in name:
            continue
        if config_column(frame, name).n_unique() > 1:
            columns.append(name)
    return columns


def role_table(final: dict[str, float], roles: tuple[str, ...]) -> pl.DataFrame | None:
    """Per-role weight continuity of a run whose kind has weight roles (None for a model without roles)."""
    rows = [
        {
            "role": role,
            "weight v1": final.get(f"weight/{role}/v1_continuity"),
            "weight u1": final.get(f"weight/{role}/u1_continuity"),
            "sigma2 v": final.get(f"weight/{role}/sigma2_continuity"),
            "grad_cum v1": final.get(f"grad_cum/{role}/v1_continuity"),
            "delta_gw v1": final.get(f"delta_gw/{role}/v1"),
        }
        for role in roles
        if f"weight/{role}/v1_continuity" in final
    ]
    return pl.DataFrame(rows) if rows else None


def runs_table(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per run: sweep, id, status, the varying config, seed, the key metrics present, and
    `train/spike` (the last spike's loss / level) when any run had a spike."""
    variant = varying_config_columns(frame)
    metrics = [m for m in (*catalog.TABLE, catalog.SPIKE) if m in frame.columns]
    seed = ["train.seed"] if "train.seed" in frame.columns else []
    columns = ["sweep", "run_id", "status", *variant, *seed, *metrics]
    return frame.select(columns).sort(["sweep", *variant, *seed])


def aggregate_table(frame: pl.DataFrame) -> pl.DataFrame:
    """Mean and std over seeds of each key metric, one row per variant, completed runs only; `spiked`
    (runs with a loss spike) when any run had one: their grad_cum and delta_gw describe that step."""
    done = frame.filter(pl.col("status") == "completed")
    variant = ["sweep", *varying_config_columns(frame)]
    metrics = [m for m in catalog.TABLE if m in done.columns]
    aggs = [pl.len().alias("runs")]
    if catalog.SPIKE in done.columns:
        aggs.append(pl.col(catalog.SPIKE).is_not_null().sum().alias("spiked"))
    for m in metrics:
        aggs += [pl.col(m).mean().alias(f"{m} mean"), pl.col(m).std().alias(f"{m} std")]
    return done.group_by(variant).agg(aggs).sort(variant)


def mean_std_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """Fold '<m> mean' / '<m> std' column pairs into one '<m>' text column '0.959 ± 0.004', in place."""
    columns = []
    for column in frame.columns:
        if column.endswith(" mean") and f"{column[:-5]} std" in frame.columns:
            name = column[: -len(" mean")]
            pairs = zip(frame.get_column(column).to_list(), frame.get_column(f"{name} std").to_list())
            columns.append(pl.Series(name, [_pm(m, s) for m, s in pairs]))
        elif not (column.endswith(" std") and f"{column[:-4]} mean" in frame.columns):
            columns.append(frame.get_column(column))
    return pl.DataFrame(columns)


def _pm(mean: float | None, std: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{mean:.3f}" if std is None or math.isnan(std) else f"{mean:.3f} ± {std:.3f}"


def render(frame: pl.DataFrame, fmt: str) -> str:
    """The frame as a markdown table, CSV or JSON records."""
    if fmt == "csv":
        return frame.write_csv()
    if fmt == "json":
        return json.dumps(frame.to_dicts(), indent=2, default=str)
    return markdown(frame)


def markdown(frame: pl.DataFrame) -> str:
    cells = [[_cell(v) for v in row] for row in frame.iter_rows()]
    header = frame.columns
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in cells)])


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
