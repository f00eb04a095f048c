"""The paper's reference tables and the store's runs set beside them.

The values live in reference.json beside this file (one row per paper config, with the config keys
that identify it and the store metric behind each column). `paper_table` matches store runs to
those rows by config (model kind, residual, activation, norm; every other field is ignored, so the
caller picks the sweep) and gives mean and std over seeds in the paper's unit next to the paper's
value. `geocont results table --paper` and the HTML report both use it.

Runs with a loss spike (a `train/spike` metric) are counted per row; the formatted table marks the
columns a spike distorts (the cumulative gradient and what derives from it) with `*`.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from geocont.catalog import SPIKE
from geocont.config import ConfigError
from geocont.tables import spiked_runs

REFERENCE_PATH = Path(__file__).parent / "reference.json"
TABLES = ("mlp", "transformer")


@functools.cache
def reference() -> dict[str, Any]:
    """The parsed reference file (cached: it never changes while a process runs)."""
    return json.loads(REFERENCE_PATH.read_text())


def table_spec(which: str) -> dict[str, Any]:
    """The reference table `which` ("mlp" or "transformer"): title, match keys, columns, rows."""
    if which not in TABLES:
        raise ConfigError([f"--paper: unknown table {which!r}; allowed: {', '.join(TABLES)}"])
    return reference()["tables"][which]


def pretrained_reference(model: str = "Llama-3.1-8B") -> list[dict[str, Any]]:
    """Per-projection values the paper reports for a pretrained model: [{label, role, space, value}]."""
    return reference()["pretrained"][model]["values"]


def paper_table(runs: pl.DataFrame | pl.LazyFrame, which: str) -> pl.DataFrame:
    """One row per paper config: matched runs, then `<label> mean`, `<label> std`, `<label> paper` per column.

    `runs` is `geocont.store.runs(...)` (one row per run). Means and stds are over the completed
    runs that match the row's config (usually the seeds of one variant), in the paper's unit
    (val/acc x 100). `runs` counts those completed runs; `diverged` counts matched diverged runs;
    `spiked` counts the completed runs that had a loss spike.
    A column with no finite value gives null (e.g. a metric the sweep did not log).
    """
    spec = table_spec(which)
    frame = runs.collect() if isinstance(runs, pl.LazyFrame) else runs
    records = [_table_row(frame, spec, row) for row in spec["rows"]]
    return pl.DataFrame(records, schema=_table_schema(spec))


def _table_schema(spec: dict[str, Any]) -> dict[str, pl.DataType]:
    schema: dict[str, pl.DataType] = {"config": pl.String, "runs": pl.Int64, "diverged": pl.Int64, "spiked": pl.Int64}
    for col in spec["columns"]:
        for part in ("mean", "std", "paper"):
            schema[f"{col['label']} {part}"] = pl.Float64
    return schema


def _table_row(frame: pl.DataFrame, spec: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    matched = matching_runs(frame, spec["model_kind"], row["match"])
    has_status = "status" in matched.columns
    completed = matched.filter(pl.col("status") == "completed") if has_status else matched
    diverged = matched.filter(pl.col("status") == "diverged").height if has_status else 0
    out: dict[str, Any] = {"config": row["config"], "runs": completed.height, "diverged": diverged}
    out["spiked"] = spiked_runs(completed)
    for col in spec["columns"]:
        values = _finite(completed, col["metric"], col["scale"])
        label = col["label"]
        out[f"{label} mean"] = sum(values) / len(values) if values else None
        out[f"{label} std"] = _std(values)
        paper = row["values"].get(label)
        out[f"{label} paper"] = float(paper) if paper is not None else None
    return out


def matching_runs(frame: pl.DataFrame, model_kind: str, match: dict[str, Any]) -> pl.DataFrame:
    """Runs whose model kind and every `match` key equal the row's; a missing config column matches nothing."""
    keys = {"model.kind": model_kind, **match}
    if any(key not in frame.columns for key in keys):
        return frame.clear()
    return frame.filter(*[pl.col(key) == value for key, value in keys.items()])


def _finite(frame: pl.DataFrame, metric: str, scale: float) -> list[float]:
    if metric not in frame.columns:
        return []
    return [float(v) * scale for v in frame[metric].to_list() if v is not None and math.isfinite(v)]


def _std(values: list[float]) -> float | None:
    """Sample standard deviation over seeds (ddof 1); None for fewer than two values."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def format_paper_table(table: pl.DataFrame, which: str) -> pl.DataFrame:
    """The table as text for people: 'mean ± std' cells next to the paper's value, in the paper's precision."""
    spec = table_spec(which)
    rows = []
    for rec in table.iter_rows(named=True):
        spiked = rec.get("spiked") or 0
        out = {"config": rec["config"], "runs": str(rec["runs"])}
        for col in spec["columns"]:
            label, digits = col["label"], col.get("digits", 3)
            out[label] = _cell(rec[f"{label} mean"], rec[f"{label} std"], digits, rec["runs"], rec["diverged"])
            if spiked and spike_distorts(col["metric"]) and rec[f"{label} mean"] is not None:
                out[label] += " *"
            paper = rec[f"{label} paper"]
            out[f"{label} (paper)"] = f"{paper:.{digits}f}" if paper is not None else _paper_blank(spec, rec["config"])
        if any((r.get("spiked") or 0) for r in table.iter_rows(named=True)):
            out["spikes"] = f"{spiked}/{rec['runs']} *" if spiked else ""
        rows.append(out)
    return pl.DataFrame(rows, schema={name: pl.String for name in (rows[0] if rows else {"config": 0})})


def spike_distorts(metric: str) -> bool:
    """Whether one huge step swamps this metric: the cumulative gradient, Delta_GW and the update ratio."""
    return metric.startswith(("grad_cum/", "delta_gw/", "update_ratio")) or metric == SPIKE


def _cell(mean: float | None, std: float | None, digits: int, runs: int, diverged: int) -> str:
    if mean is None:
        return "diverged" if runs == 0 and diverged else "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def _paper_blank(spec: dict[str, Any], config: str) -> str:
    row = next(r for r in spec["rows"] if r["config"] == config)
    return "NaN (diverged)" if row.get("diverged") else "–"
