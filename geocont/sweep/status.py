"""What `geocont sweep status` shows, read from the store alone (no Ray): one Row per trial, and counts.

A trial is completed / failed / diverged when its run.json says so, `started` when its folder exists
without one (running now, or left by a killed driver: `resume` reruns it), `pending` otherwise.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from geocont import store
from geocont.sweep.grid import expand
from geocont.sweep.live import Row
from geocont.sweep.load import stored_sweep
from geocont.sweep.spec import SweepConfig
from geocont.sweep.study import search_counts_from_store


def sweep_rows(store_dir: str | Path, name: str) -> tuple[SweepConfig, list[Row], dict[str, int]]:
    sweep, _ = stored_sweep(store_dir, name)
    finals = _final_values(store_dir, name)
    if sweep.search is None:
        rows = [_row(store_dir, name, t.run_id, t.name, finals) for t in expand(sweep)]
        return sweep, rows, store.status_counts(row.status for row in rows)
    infos = store.list_run_infos(store_dir, name)
    rows = [_row(store_dir, name, info["run_id"], info.get("name") or info["run_id"], finals) for info in infos]
    metric, sign = sweep.search.metric, (-1 if sweep.search.mode == "max" else 1)
    rows.sort(key=lambda r: (metric not in r.values, sign * r.values.get(metric, 0.0)))  # best first
    return sweep, rows, search_counts_from_store(Path(store_dir), sweep)


def _row(store_dir: str | Path, sweep: str, run_id: str, name: str, finals: dict[str, dict]) -> Row:
    info = store.read_run_info(store_dir, sweep, run_id)
    folder = store.run_dir(store_dir, sweep, run_id)
    if info is not None:
        values = finals.get(run_id, {})
        epoch = info.get("epochs")
        return Row(name, run_id, info["status"], epoch, 1, info.get("node") or "", values, info.get("error") or "")
    if not folder.is_dir():
        return Row(name, run_id)
    epoch, values = _partial(folder / "metrics.partial.parquet")
    return Row(name, run_id, "started", epoch, values=values)


def _final_values(store_dir: str | Path, sweep: str) -> dict[str, dict[str, float]]:
    frame = store.runs(store_dir, sweep).collect()
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
