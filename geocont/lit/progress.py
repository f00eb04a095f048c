"""ProgressHook: after every metrics event, the latest value of every metric to a hook.

A sweep's trial hands its hook to Ray Tune (the live view); tests and notebooks can watch a run the
same way. Its own callback, beside the GeometryMonitor, so computing metrics and reporting them stay
apart. Listed after the monitor, it sees that event's geometry values.
"""

from __future__ import annotations

from collections.abc import Callable

import pytorch_lightning as pl

from geocont.lit.loggers import StoreLogger

MetricsHook = Callable[[int, int, dict[str, float]], None]  # (epoch counted from 1, step, values)


class ProgressHook(pl.Callback):
    def __init__(self, hook: MetricsHook, store: StoreLogger):
        self.hook = hook
        self.store = store

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        seen = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        self.hook(trainer.current_epoch + 1, trainer.global_step, {**seen, **self.store.latest})
