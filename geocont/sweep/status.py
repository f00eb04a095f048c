"""What `geocont sweep status` shows, read from the store alone (no Ray): one Row per trial, and counts.

A trial is completed / failed / diverged when its run.json says so, `started` when its folder exists
without one (running now, or left by a killed driver: `resume` reruns it), `pending` otherwise.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from geocont import store as results
from geocont.config import ConfigError, read_text
from geocont.sweep.grid import expand
from geocont.sweep.live import Row
from geocont.sweep.spec import SweepConfig, sweep_from_text


def stored_sweep(store: str | Path, name: str) -> tuple[SweepConfig, str]:
    """The sweep as launched (`<store>/<name>/sweep.yaml`) and its text."""
    results.check_sweep_name(name, "SWEEP_NAME")
    spec = Path(store) / name / "sweep.yaml"
    if not spec.is_file():
        known = [s for s in results.sweep_names(store) if (Path(store) / s / "sweep.yaml").is_file()]
        raise ConfigError([f"{name}: no sweep of that name in {store}; sweeps there: {', '.join(known) or 'none'}"])
    text = read_text(spec)
    return sweep_from_text(text, str(spec)), text


def sweep_rows(store: str | Path, name: str) -> tuple[SweepConfig, list[Row], dict[str, int]]:
    sweep, _ = stored_sweep(store, name)
    finals = _final_values(store, name)
    if sweep.search is None:
        rows = [_row(store, name, t.run_id, t.name, finals) for t in expand(sweep)]
        return sweep, rows, _counts(rows)
    from geocont.sweep.optuna_search import search_counts_from_store

    infos = results.list_run_infos(store, name)
    rows = [_row(store, name, info["run_id"], info.get("name") or info["run_id"], finals) for info in infos]
    metric, sign = sweep.search.metric, (-1 if sweep.search.mode == "max" else 1)
    rows.sort(key=lambda r: (metric not in r.values, sign * r.values.get(metric, 0.0)))  # best first
    return sweep, rows, search_counts_from_store(Path(store), sweep)


def _row(store: str | Path, sweep: str, run_id: str, name: str, finals: dict[str, dict]) -> Row:
    info = results.read_run_info(store, sweep, run_id)
    folder = results.run_dir(store, sweep, run_id)
    if info is not None:
        values = finals.get(run_id, {})
        epoch = info.get("epochs")
        return Row(name, run_id, info["status"], epoch, 1, info.get("node") or "", values, info.get("error") or "")
    if not folder.is_dir():
        return Row(name, run_id)
    epoch, values = _partial(folder / "metrics.partial.parquet")
    return Row(name, run_id, "started", epoch, values=values)


def _final_values(store: str | Path, sweep: str) -> dict[str, dict[str, float]]:
    frame = results.runs(store, sweep).collect()
    metrics = [c for c in frame.columns if "/" in c or c == "update_ratio"]
    return {row["run_id"]: {m: row[m] for m in metrics if row[m] is not None} for row in frame.iter_rows(named=True)}


def _partial(path: Path) -> tuple[int | None, dict[str, float]]:
    """Progress of a run in flight: its latest epoch and metric values so far."""
    if not path.is_file():
        return None, {}
    try:
        frame = pl.read_parquet(path)
    except Exception:  # being replaced right now; status is a snapshot, the next one will read it
        return None, {}
    if frame.is_empty():
        return None, {}
    last = frame.sort("step", "epoch").group_by("name", maintain_order=True).agg(pl.col("value").last())
    return int(frame["epoch"].max()), dict(zip(last["name"], last["value"]))


def _counts(rows: list[Row]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return counts
