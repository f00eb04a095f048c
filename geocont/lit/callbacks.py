"""GeometryMonitor: the thin Lightning callback that schedules the continuity metrics.

When metrics are computed:
- grad_init/*: once, from the first step's gradients, before any update (under 16-mixed: the first
  step the GradScaler applies; the weights are still W(0) until then);
- the cumulative gradient sum_t G_l(t): every step just before the optimizer step (Lightning's
  on_before_optimizer_step, after the module unscaled the gradients under 16-mixed and before it clips
  them), nothing for a step that is not applied;
- weight/*, grad_cum/*, delta_gw/*, update_ratio: at the end of every validation run (every
  epoch, or every `train.metrics_every_n_steps` steps), and once more at the end of training
  whatever stopped it (train() runs a last validation, or calls `emit` directly for a diverged run).
The maths is in geocont.metrics; this file only decides when and where results go.
"""

from __future__ import annotations

import time

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from geocont.lit.loggers import log_to_loggers
from geocont.lit.module import found_inf, loss_scaler
from geocont.metrics.geometry import delta_gw_metrics, direction_metrics, weight_metrics
from geocont.metrics.spectral import exact_float32


def stack(params: list[nn.Parameter] | list[Tensor]) -> Tensor:
    """Same-shape per-layer matrices as one (L, m, n) fp32 tensor, detached, on the weights' device."""
    return torch.stack([p.detach().float() for p in params])


class GeometryMonitor(pl.Callback):
    def __init__(self):
        self.last_event_step = -1

    # -- setup ------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Only checks here: Lightning calls `setup` before the strategy moves and casts the model, so any
        # state built from the weights now would sit on the CPU in the pre-cast dtype (on_fit_start below).
        if stage == "fit":
            groups = pl_module.model.weight_groups()
            if not groups or any(len(ws) < 2 for ws in groups.values()):
                raise ValueError("continuity needs at least two layers per weight group (model.depth >= 2)")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Snapshot W(0) and allocate the accumulators from the weights as training will see them.

        Runs after the strategy placed and cast the model: everything lives on the weights' device, and
        the snapshot is of the cast weights (so update_ratio is 0 when no update survives rounding).
        Accumulators stay fp32 whatever the parameters' precision.
        """
        if not hasattr(self, "groups"):
            self._allocate(pl_module)
        self.scaler = loss_scaler(trainer)

    def _allocate(self, pl_module: pl.LightningModule) -> None:
        self.groups: dict[str, list[nn.Parameter]] = pl_module.model.weight_groups()
        self.initial = {role: stack(ws) for role, ws in self.groups.items()}
        # One (L, m, n) accumulator per role, added to through per-layer views: no copy at metric time.
        self.grad_sum = {role: torch.zeros_like(self.initial[role]) for role in self.groups}
        self.grad_views = {role: list(acc.unbind(0)) for role, acc in self.grad_sum.items()}
        self.grad_init: dict[str, float] | None = None
        self.grad_basis: dict[str, Tensor] = {}  # warm start for the cumulative gradient's v1 (a subspace)
        self.metrics_s = 0.0  # wall time spent computing geometry metrics (run.json's metrics_s)

    # -- every step -------------------------------------------------------------------------
    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        """This step's gradients into the cumulative sum (true-size: GeoModule unscales them under 16-mixed)."""
        skipped = self._skipped(pl_module, optimizer)  # None, or a device flag: this step is not applied
        if self.grad_init is None:
            if self.scaler is not None and bool(skipped):  # one sync a step, until the scale fits
                return
            self._log_grad_init(trainer)
        for role, ws in self.groups.items():
            grads = [w.grad.float() for w in ws]
            if skipped is not None:  # adds nothing then (NaN * 0 is NaN: select)
                grads = [torch.where(skipped, 0.0, g) for g in grads]
            torch._foreach_add_(self.grad_views[role], grads)

    def _skipped(self, pl_module: pl.LightningModule, optimizer) -> Tensor | None:
        if self.scaler is None:  # set when the module defers its loss checks to the device (see GeoModule)
            return getattr(pl_module, "stopped", None)
        # what GradScaler.step reads; GeoModule has ORed its non-finite-loss flag into it
        return sum(flag.to(self.scaler._scale.device) for flag in found_inf(self.scaler, optimizer)) > 0

    def _log_grad_init(self, trainer: pl.Trainer) -> None:
        with exact_float32():
            self.grad_init = direction_metrics("grad_init", self._grad_stacks())
        self._log(trainer, self.grad_init)

    def _grad_stacks(self) -> dict[str, Tensor]:
        return {role: stack([w.grad for w in ws]) for role, ws in self.groups.items()}

    # -- metrics events ---------------------------------------------------------------------
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.emit(trainer)

    @torch.no_grad()
    def emit(self, trainer: pl.Trainer, extra: dict[str, float] | None = None) -> dict[str, float]:
        """Compute every geometry metric now (once per step) and send it, with `extra`, to the loggers."""
        step = trainer.global_step
        if step == self.last_event_step:
            if extra:
                self._log(trainer, extra)
            return dict(extra or {})
        self.last_event_step = step
        values = self.geometry()
        values.update(extra or {})
        self._log(trainer, values)
        return values

    def geometry(self) -> dict[str, float]:
        t0 = time.perf_counter()
        with exact_float32():
            weights = {role: stack(ws) for role, ws in self.groups.items()}
            values = weight_metrics(weights, self.initial)
            values.update(direction_metrics("grad_cum", self.grad_sum, warm=self.grad_basis))
            values.update(delta_gw_metrics(values, list(self.groups)))
        self.metrics_s += time.perf_counter() - t0  # .item() inside the metrics synchronises: wall time is true
        return values

    def _log(self, trainer: pl.Trainer, values: dict[str, float]) -> None:
        log_to_loggers(trainer, values, flush=True)  # each event also updates the store's partial file
