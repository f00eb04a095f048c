"""Packed trials in Lightning: K same-shape classifiers trained as one batched model (geocont.pack).

`PackedClassifier` is the LightningModule of a pack and `PackedMonitor` its geometry callback. Each
member logs to its own loggers (`Member.loggers`: its store logger, TensorBoard, wandb) with exactly
the names, steps and epochs a solo run of its config logs, so a member's metrics.parquet reads like a
solo run's. What differs from the solo path (GeoModule, GeometryMonitor), and why:
- a member whose loss turns non-finite is frozen on the device (BatchedOptimizer.freeze) while the
  others go on; it is found when the loss buffer is read (every `log_every_n_steps` steps, as on a
  GPU solo run) and then gets its final metrics at its last finite weights, at its own step count;
- the backward runs on the sum of the active members' losses: members share no parameter, so each
  gets its solo gradient;
- metrics are computed for all K members at once (geocont.metrics.packed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.loggers import Logger
from torch import Tensor, nn

from geocont.config import OptimConfig
from geocont.data.packed import PackedBatches
from geocont.lit.chunked import ChunkedSteps
from geocont.lit.loggers import StoreLogger
from geocont.metrics import packed as packed_metrics
from geocont.metrics.geometry import delta_gw_metrics
from geocont.metrics.spectral import exact_float32
from geocont.optim.batched import build_batched_optimizer
from geocont.optim.step import member_losses

LossHook = Callable[[int, float], None]
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s, which a solo run's clipping uses


@dataclass
class Member:
    """One trial of a pack as its Lightning objects see it: where it logs and how far it got."""

    loggers: list[Logger]
    store: StoreLogger
    loss_hooks: list[LossHook] = field(default_factory=list)
    diverged_at: int | None = None  # updates applied before its first non-finite loss
    diverged_epoch: int | None = None  # the (0-based) epoch it diverged in
    last_event_step: int = -1  # the step of its last geometry event
    on_metrics: Callable[[int, int, dict[str, float]], None] | None = None  # (epoch from 1, step, latest values)

    @property
    def active(self) -> bool:
        return self.diverged_at is None

    def log(self, values: dict[str, float], step: int, epoch: int, flush: bool = False) -> None:
        metrics = {**values, "epoch": epoch}  # Lightning's 0-based epoch; the store logger adds one
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)
        if flush:
            self.store.flush()


class PackedClassifier(ChunkedSteps, pl.LightningModule):
    def __init__(
        self,
        model: nn.Module,
        optims: list[OptimConfig],
        members: list[Member],
        log_every_n_steps: int = 10,
        grad_clip: float | None = None,
    ):
        super().__init__()
        self.model = model
        self.optims = optims
        self.members = members
        self.log_every_n_steps = log_every_n_steps
        self.grad_clip = grad_clip
        self.automatic_optimization = False  # the step is member_losses, freeze, backward, step

    @property
    def K(self) -> int:
        return len(self.members)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_batched_optimizer(self.model.parameters(), self.optims)

    def on_fit_start(self) -> None:
        self.losses = torch.empty(self.log_every_n_steps, self.K, device=self.device)
        self.loss_steps: list[int] = []

    # -- training ---------------------------------------------------------------------------
    def _step(self, batch, batch_idx: int) -> None:
        x, y = batch  # (K, B, ...), (K, B)
        step = self.trainer.global_step
        optimizer = self.optimizers()
        losses = member_losses(self.model, x, y)
        active = optimizer.optimizer.freeze(torch.isfinite(losses.detach()))
        optimizer.zero_grad(set_to_none=True)
        # where, not a product: a frozen member's NaN loss must not reach the sum (NaN * 0 is NaN)
        self.manual_backward(torch.where(active, losses, 0.0).sum())  # the monitor sees the gradients
        if self.grad_clip is not None:
            clip_per_member(self.model.parameters(), self.grad_clip)
        optimizer.step()
        self.losses[len(self.loss_steps)].copy_(losses.detach())
        self.loss_steps.append(step)
        if batch_idx % self.log_every_n_steps == 0 or len(self.loss_steps) == self.log_every_n_steps:
            self.read_losses(log=batch_idx % self.log_every_n_steps == 0)

    def read_losses(self, log: bool = False) -> None:
        """The buffered (step, K) losses to the host (one sync): divergence, hooks, train/loss when `log`."""
        if not self.loss_steps:
            return
        rows = self.losses[: len(self.loss_steps)].tolist()
        steps, self.loss_steps = self.loss_steps, []
        for step, row in zip(steps, rows):
            for member, value in zip(self.members, row):
                if not member.active:
                    continue
                if not math.isfinite(value):
                    self._diverge(member, step)
                    continue
                for hook in member.loss_hooks:
                    hook(step + 1, value)  # step + 1: the store's step counts the update this loss produced
        if log:
            for member, value in zip(self.members, rows[-1]):
                if member.active:
                    member.log({"train/loss": value}, self.trainer.global_step, self.trainer.current_epoch)
        if not any(m.active for m in self.members):
            self.trainer.should_stop = True

    def _diverge(self, member: Member, step: int) -> None:
        # A solo run stops here and logs its final metrics at this step; the member's weights have been
        # frozen since this step, so its metrics now are the ones the solo run logs.
        member.diverged_at, member.diverged_epoch = step, self.trainer.current_epoch
        monitor = next(c for c in self.trainer.callbacks if isinstance(c, PackedMonitor))
        values = monitor.geometry(self.model)[self.members.index(member)]
        member.log({**values, "train/loss": math.nan}, step, self.trainer.current_epoch, flush=True)

    def on_validation_start(self) -> None:
        self.read_losses()  # before validation logs at the current step: the buffered steps are older

    def on_train_epoch_end(self) -> None:
        self.read_losses()

    def on_train_end(self) -> None:
        self.read_losses()

    # -- validation -------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self.val_loss = torch.zeros(self.K, device=self.device)
        self.val_correct = torch.zeros(self.K, device=self.device)
        self.val_count = 0

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self.model(x)  # (K, B, C)
        size = y.shape[1]
        # batch means weighted by batch size: how Lightning averages a solo run's logged val/loss, val/acc
        self.val_loss += F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1) * size
        self.val_correct += (logits.argmax(-1) == y).float().mean(1) * size
        self.val_count += size

    def on_validation_epoch_end(self) -> None:
        # Lightning logs a solo run's epoch-level values at its count of batches that stepped, which is
        # one below global_step during fit (docs/contracts.md) and equal to it in a later validate().
        step = self.trainer.fit_loop.epoch_loop._batches_that_stepped
        loss, acc = (self.val_loss / self.val_count).tolist(), (self.val_correct / self.val_count).tolist()
        for member, member_loss, member_acc in zip(self.members, loss, acc):
            if member.active:
                member.log({"val/loss": member_loss, "val/acc": member_acc}, step, self.trainer.current_epoch)


@torch.no_grad()
def clip_per_member(parameters, max_norm: float) -> None:
    """clip_grad_norm_ for each member alone: member k's gradients scaled by its own global norm."""
    grads = [p.grad for p in parameters if p.grad is not None]  # each (K, ...)
    norms = torch.stack([g.flatten(1).float().norm(dim=1) for g in grads]).norm(dim=0)  # (K,)
    scale = (max_norm / (norms + CLIP_EPS)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))


class PackedMonitor(pl.Callback):
    """GeometryMonitor for a pack: one batched metric call for all K members, values sent to each."""

    def __init__(self):
        self.metrics_s = 0.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PackedClassifier) -> None:
        if hasattr(self, "groups"):
            return
        self.groups = pl_module.model.weight_groups()  # role -> L packed matrices (K, m, n)
        self.initial = {role: packed_metrics.packed_stack(ws) for role, ws in self.groups.items()}
        self.grad_sum = {role: torch.zeros_like(w0) for role, w0 in self.initial.items()}  # (K, L, m, n)
        self.grad_views = {role: list(acc.unbind(1)) for role, acc in self.grad_sum.items()}
        self.grad_basis: dict[str, Tensor] = {}
        self.logged_init = False
        # (K, 1, 1) view of the optimizer's active mask, which freeze() updates in place: looked up once,
        # not through Lightning's optimizer wrapper on every step
        self.active = pl_module.optimizers().optimizer.active.view(-1, 1, 1)

    @torch.no_grad()
    def on_after_backward(self, trainer: pl.Trainer, pl_module: PackedClassifier) -> None:
        if not self.logged_init:
            self.logged_init = True
            stacks = {role: packed_metrics.packed_stack([w.grad for w in ws]) for role, ws in self.groups.items()}
            with exact_float32():
                per_member = packed_metrics.direction_metrics("grad_init", stacks)
            for member, values in zip(pl_module.members, per_member):
                member.log(values, trainer.global_step, trainer.current_epoch, flush=True)
        # A frozen member's slice of the gradient is NaN, not 0 (its loss left the sum, but 0 * inf = NaN
        # in the backward through its blown-up activations); it adds nothing, as its solo run stopped.
        for role, ws in self.groups.items():
            torch._foreach_add_(self.grad_views[role], [torch.where(self.active, w.grad.float(), 0.0) for w in ws])

    def on_validation_end(self, trainer: pl.Trainer, pl_module: PackedClassifier) -> None:
        if not trainer.sanity_checking:
            self.emit(trainer, pl_module)

    def emit(self, trainer: pl.Trainer, pl_module: PackedClassifier) -> None:
        """Every active member's geometry at the current step, once per step."""
        step = trainer.global_step
        todo = [(k, m) for k, m in enumerate(pl_module.members) if m.active and m.last_event_step != step]
        if not todo:
            return
        values = self.geometry(pl_module.model)
        for k, member in todo:
            member.last_event_step = step
            member.log(values[k], step, trainer.current_epoch, flush=True)
            if member.on_metrics is not None:  # progress (a sweep's live view), after the event is logged
                member.on_metrics(trainer.current_epoch + 1, step, dict(member.store.latest))

    @torch.no_grad()
    def geometry(self, model: nn.Module) -> list[dict[str, float]]:
        t0 = time.perf_counter()
        with exact_float32():
            weights = {role: packed_metrics.packed_stack(ws) for role, ws in self.groups.items()}
            values = packed_metrics.weight_metrics(weights, self.initial)
            grads = packed_metrics.direction_metrics("grad_cum", self.grad_sum, warm=self.grad_basis)
            for member, grad in zip(values, grads):
                member.update(grad)
                member.update(delta_gw_metrics(member, list(self.groups)))
        self.metrics_s += time.perf_counter() - t0
        return values


class PackedData(pl.LightningDataModule):
    """The members' data modules as one: batch i of every member, stacked (geocont.data.packed)."""

    def __init__(self, members: list[pl.LightningDataModule]):
        super().__init__()
        self.members = members

    def _attach(self) -> None:
        for dm in self.members:  # so each member's batches are placed for the trainer's device
            dm.trainer = self.trainer

    def train_dataloader(self) -> PackedBatches:
        self._attach()
        return PackedBatches([dm.train_dataloader() for dm in self.members])

    def val_dataloader(self) -> PackedBatches:
        self._attach()
        return PackedBatches([dm.val_dataloader() for dm in self.members])
