"""The terminal view of a sweep: a live rich table while it runs, and the same table for `sweep status`.

SweepView is fed by the Tune callback in geocont.sweep.fit (events: start, result, retry, complete, error)
on Tune's driver thread, and drawn by rich's refresh thread: both go through one lock. Without a
terminal (CI, a pipe) it prints one line per finished trial instead of redrawing.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from geocont import catalog, store

METRICS = catalog.LIVE
# A run's loss spikes (geocont.metrics.spikes): the metric's value is the last spike's loss / level.
# Shown in its own column, beside the metrics, whenever a trial has one: its grad_cum / delta_gw are
# then dominated by that step.
SPIKE = catalog.SPIKE
STYLES = {
    "running": "cyan",
    "retrying": "yellow",
    "completed": "green",
    "diverged": "magenta",
    "failed": "red",
    "pending": "dim",
    "started": "yellow",
    "skipped": "dim green",
}
ORDER = ("running", "retrying", "started", "failed", "diverged", "completed", "skipped", "pending")


@dataclass
class Row:
    """One trial as shown: identity, state, and its latest metric values."""

    name: str
    run_id: str
    status: str = "pending"
    epoch: int | None = None
    attempts: int = 0
    node: str = ""
    values: dict[str, float] = field(default_factory=dict)
    error: str = ""
    updated: float = 0.0


class SweepView:
    """Trials by status, epoch and key metrics, redrawn while Tune runs."""

    def __init__(self, console: Console | None = None, live: bool | None = None):
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal if live is None else live
        self.sweep, self.metrics, self.total = "", METRICS, 0
        self.rows: dict[str, Row] = {}
        self.started = time.monotonic()
        self._lock = threading.Lock()

    # -- fed by the runner ----------------------------------------------------------------------
    def begin(self, sweep: Any, trials: list[Any], pending: set[str]) -> None:
        """The sweep (a SweepConfig) and its trials; those not pending are already in the store."""
        metric = sweep.search.metric if sweep.search is not None else None
        with self._lock:
            self.sweep, self.started = sweep.name, time.monotonic()
            self.total = sweep.search.n_trials if sweep.search is not None else len(trials)
            self.metrics = tuple(dict.fromkeys([*([metric] if metric else []), *METRICS]))
            for t in trials:
                self.rows[t.run_id] = Row(t.name, t.run_id, "pending" if t.run_id in pending else "skipped")

    def event(self, kind: str, trial: dict[str, Any], result: dict[str, Any]) -> None:
        with self._lock:
            row = self.rows.setdefault(trial["run_id"], Row(trial["name"], trial["run_id"]))
            row.updated = time.monotonic()
            if kind == "start":
                row.status, row.attempts = "running", row.attempts + 1
            elif kind == "result":
                self._update(row, result)
            elif kind == "retry":
                row.status, row.error = "retrying", result.get("error", "")
            elif kind == "complete":
                self._update(row, result)
                row.status = result.get("run_status", "completed")
            elif kind == "error":
                row.status, row.error = "failed", result.get("error", "")
        if not self.live and kind in ("complete", "error", "retry"):
            self.console.print(self._line(row), highlight=False, soft_wrap=True)

    def _update(self, row: Row, result: dict[str, Any]) -> None:
        row.epoch = result.get("epoch", row.epoch)
        row.node = result.get("node", row.node)
        row.values.update({k: result[k] for k in (*self.metrics, SPIKE) if isinstance(result.get(k), int | float)})

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if not self.live:
            yield
            return
        with Live(self, console=self.console, refresh_per_second=4, transient=False):
            yield

    # -- drawing --------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return store.status_counts(row.status for row in self.rows.values())

    def __rich__(self) -> Group:
        with self._lock:
            rows = [Row(**vars(r)) for r in self.rows.values()]
            counts = self.counts()
        limit = max(5, self.console.size.height - 8)
        shown = sorted(rows, key=lambda r: (ORDER.index(r.status) if r.status in ORDER else 0, -r.updated))[:limit]
        elapsed = time.monotonic() - self.started
        header = Text(f"sweep {self.sweep}  {elapsed:5.0f} s  ") + summary(counts)
        hidden = len(rows) - len(shown)
        parts: list[Any] = [header, table(shown, self.metrics)]
        if hidden:
            parts.append(Text(f"... {hidden} more", style="dim"))
        return Group(*parts)

    def _line(self, row: Row) -> Text:
        done = sum(n for s, n in self.counts().items() if s not in ("pending", "running", "retrying"))
        shown = [m for m in self.metrics if m in row.values][:3]
        values = "  ".join(f"{m}={format_metric(row.values[m])}" for m in shown)
        if SPIKE in row.values:
            values += f"  loss spike {format_spike(row.values[SPIKE])}"
        status = Text(f"{row.status:9}", style=STYLES.get(row.status, ""))
        line = Text(f"[{done}/{max(self.total, len(self.rows))}] ") + status
        return line + Text(f" {row.name}  {values}  {row.error}".rstrip())


def summary(counts: dict[str, int]) -> Text:
    """'12 completed  2 running  7 pending', coloured by status."""
    text = Text()
    for status in ORDER:
        if counts.get(status):
            text += Text(f"{counts[status]} {status}  ", style=STYLES[status])
    return text


def table(rows: list[Row], metrics: Iterable[str], run_ids: bool = False) -> Table:
    """The trial table shared by the live view and `geocont sweep status`."""
    metrics = [m for m in metrics if any(m in r.values for r in rows)]
    spikes = any(SPIKE in r.values for r in rows)
    grid = Table(box=None, pad_edge=False, header_style="bold")
    grid.add_column("trial")
    if run_ids:
        grid.add_column("run_id", style="dim")
    grid.add_column("status")
    grid.add_column("epoch", justify="right")
    for m in metrics:
        grid.add_column(m, justify="right")
    if spikes:
        grid.add_column("spike", justify="right", style="magenta")
    grid.add_column("node", style="dim")
    grid.add_column("note", style="dim", overflow="fold")
    for r in rows:
        cells = [r.name, *([r.run_id] if run_ids else []), Text(r.status, style=STYLES.get(r.status, ""))]
        cells += ["" if r.epoch is None else str(r.epoch), *[format_metric(r.values.get(m)) for m in metrics]]
        if spikes:
            cells.append(format_spike(r.values.get(SPIKE)))
        note = r.error or (f"attempt {r.attempts}" if r.attempts > 1 else "")
        grid.add_row(*cells, r.node, note)
    return grid


def format_spike(ratio: float | None) -> str:
    """'x1.3e+05': the last spike's loss over its running level ('' for a trial without one)."""
    return "" if ratio is None else f"x{ratio:.2g}"


def format_metric(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"
