"""A Lightning logger that feeds the results store (the source of truth), and the helper that logs to all."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities import rank_zero_only

from geocont import store


class StoreLogger(Logger):
    """Collects every logged scalar as a long row (run_id, epoch, step, name, value).

    Rows are written to `<run>/metrics.partial.parquet` on `flush()` (at most every
    `flush_interval_s`: it is a progress view for `sweep status`, and rewriting it after every
    event of a fast run would cost more than the run's metrics) and moved to `metrics.parquet` by
    `publish()` once the run has a final status, so an earlier complete result of the same run is
    never replaced by a partial one.
    """

    def __init__(self, folder: Path, run_id: str, flush_interval_s: float = 2.0):
        super().__init__()
        self.folder = folder
        self.run_id = run_id
        self.rows: list[dict[str, Any]] = []
        self.latest: dict[str, float] = {}  # last logged value of every metric
        self.flush_interval_s = flush_interval_s
        self._last_flush = -math.inf

    @property
    def name(self) -> str:
        return "store"

    @property
    def version(self) -> str:
        return self.run_id

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass  # the resolved config is written to config.yaml by train()

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        # Lightning passes a 0-based `epoch`; the store counts epochs from 1 (the epoch in progress).
        epoch = int(metrics.get("epoch", 0)) + 1
        for name, value in metrics.items():
            if name != "epoch":
                self.rows.append(
                    {"run_id": self.run_id, "epoch": epoch, "step": int(step or 0), "name": name, "value": float(value)}
                )
                self.latest[name] = float(value)

    def final_values(self) -> dict[str, float]:
        """Last logged value of every metric."""
        return dict(self.latest)

    def flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= self.flush_interval_s:
            self._last_flush = now
            store.write_metrics(self.folder, self.rows, name="metrics.partial.parquet")

    def publish(self) -> None:
        store.write_metrics(self.folder, self.rows)
        (self.folder / "metrics.partial.parquet").unlink(missing_ok=True)


def log_to_loggers(trainer, values: dict[str, float], flush: bool = False, step: int | None = None) -> None:
    """Straight to every logger of the trainer at `step`, by default its current one (self.log's bookkeeping
    costs about a millisecond a call on CPU, as much as a small model's whole step). `flush` also writes the
    store's file."""
    metrics = {**values, "epoch": trainer.current_epoch}
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step if step is None else step)
        if flush and isinstance(logger, StoreLogger):
            logger.flush()
