"""LightningModules: a classifier and a language model over any geocont network.

training_step computes the loss and logs it; everything else (geometry metrics, divergence
bookkeeping for the store) is a callback or a named helper.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_fabric.plugins.precision.amp import _optimizer_handles_unscaling
from torch import Tensor, nn

from geocont.config import OptimConfig
from geocont.lit.chunked import ChunkedSteps
from geocont.lit.loggers import log_to_loggers


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The configured optimizer, with PyTorch's fused kernel wherever the parameters allow it.

    Same algorithm, one kernel per step instead of a dozen small ops per parameter: on CPU the paper
    MLP's epoch is a quarter shorter than with the default per-tensor kernels (142 vs 190 ms).
    """
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.beta1, weight_decay=cfg.weight_decay, fused=fused)
    kind = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    return kind(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused
    )


def loss_scaler(trainer: pl.Trainer) -> torch.amp.GradScaler | None:
    """The GradScaler of fp16 loss scaling (precision 16-mixed), or None."""
    return getattr(trainer.precision_plugin, "scaler", None)


def found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The per-device overflow flags of this step, which GradScaler.step reads (set by unscale_)."""
    return list(scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())


LossHook = Callable[[int, float], None]


class GeoModule(ChunkedSteps, pl.LightningModule):
    """Shared training logic; subclasses define `loss(batch)` and, for validation, `stats(output, batch)`.

    The step never waits for the device. Each step's loss stays on the device in a small buffer that
    is read once every `log_every_n_steps` steps (train/loss, the loss hooks, the divergence check).
    A non-finite loss must never be applied, and asking `torch.isfinite(loss)` on the host would sync
    a GPU every step; instead a sticky device flag (`stopped`) is raised and handed to the fused
    optimizer as `found_inf`, which skips the update on the device, so the weights stay the last finite
    ones until the next buffer read ends the run as `diverged`. On the CPU reading a tensor costs no
    sync, so there the check stays eager (`defer_checks` False): no NaN step is even backpropagated.
    See docs/gpu.md.
    """

    DEFER_ON_CPU = False  # tests set it to run the accelerator's deferred path on a CPU

    def __init__(
        self, model: nn.Module, optim: OptimConfig, log_every_n_steps: int = 10, grad_clip: float | None = None
    ):
        super().__init__()
        self.model = model
        self.optim_cfg = optim
        self.log_every_n_steps = log_every_n_steps
        self.grad_clip = grad_clip
        self.loss_hooks: list[LossHook] = []  # called with (step, loss) for every finite step, in order
        self.diverged = False
        self.diverged_at: int | None = None  # updates applied before the first non-finite loss
        # The step is the plain loop's three calls (zero_grad, backward, step) instead of Lightning's
        # closure and the hooks around it: about 0.25 ms (4 %) of the paper MLP's step on CPU. Mixed
        # precision and step counting still go through Lightning (manual_backward, the wrapped optimizer).
        self.automatic_optimization = False

    def loss(self, batch) -> tuple[Tensor, Tensor]:
        """(loss, the model's output) for one batch."""
        raise NotImplementedError

    def stats(self, output: Tensor, batch) -> dict[str, Tensor]:
        """Validation statistics beside val/loss (computed in validation only)."""
        return {}

    def on_fit_start(self) -> None:
        # Here, not in __init__: the strategy has placed the model, so these live on its device.
        # CUDA only: there the fused optimizers take `found_inf`; elsewhere (MPS) the unfused ones refuse it
        self.defer_checks = self.device.type == "cuda" or self.DEFER_ON_CPU
        self.losses = torch.empty(self.log_every_n_steps, device=self.device)
        self.loss_steps: list[int] = []  # global step (updates applied before it) of each buffered loss
        # fp16 loss scaling (16-mixed): the step unscales the gradients itself, before anyone reads them
        self.scaler = loss_scaler(self.trainer)
        if self.defer_checks:
            self.stopped = torch.zeros((), dtype=torch.bool, device=self.device)
            self.found_inf = torch.zeros((), dtype=torch.float32, device=self.device)

    def _step(self, batch, batch_idx: int) -> Tensor | None:
        """One optimizer step on one batch; `batch_idx` counts the epoch's batches."""
        loss, _ = self.loss(batch)
        step = self.trainer.global_step
        if not self.defer_checks and not torch.isfinite(loss):
            self._diverge(step)
            return None
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        if self.defer_checks:
            self._raise_stop_flag(loss, optimizer.optimizer)
        self.manual_backward(loss)
        if self.scaler is not None:  # from here on the gradients are true-size (the monitor, clipping)
            self._unscale(optimizer.optimizer)
        optimizer.step()  # calls on_before_optimizer_step: the monitor's (it sums the gradients), then ours (clips)
        self._buffer_loss(step, loss)
        if batch_idx % self.log_every_n_steps == 0 or len(self.loss_steps) == self.log_every_n_steps:
            self.read_losses(log=batch_idx % self.log_every_n_steps == 0)
        return loss.detach()

    def _unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if not _optimizer_handles_unscaling(optimizer):
            return  # Lightning unscales this one itself, before on_before_optimizer_step (its own test)
        self.scaler.unscale_(optimizer)
        if self.defer_checks:  # a non-finite loss skips the step the way the scaler's own inf check does
            for flag in found_inf(self.scaler, optimizer):
                torch.maximum(flag, self.stopped.to(flag), out=flag)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Lightning calls this after the callbacks' hook of the same name: the monitor sums unclipped gradients.
        # Not Lightning's clip_gradients: under 16-mixed it refuses fused optimizers (they unscale inside
        # their step), though the gradients are already unscaled here (_step).
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self.grad_clip)

    def _raise_stop_flag(self, loss: Tensor, optimizer: torch.optim.Optimizer) -> None:
        torch.logical_or(self.stopped, ~torch.isfinite(loss.detach()), out=self.stopped)
        self.found_inf.copy_(self.stopped)
        optimizer.found_inf = self.found_inf  # read by the fused kernels (a GradScaler sets its own, then drops it)

    def _buffer_loss(self, step: int, loss: Tensor) -> None:
        self.losses[len(self.loss_steps)].copy_(loss.detach())  # device to device: no sync
        self.loss_steps.append(step)

    def read_losses(self, log: bool = False) -> None:
        """Bring the buffered losses to the host (one sync): hooks, divergence, and train/loss when `log`."""
        if not self.loss_steps:
            return
        values = self.losses[: len(self.loss_steps)].tolist()
        steps, self.loss_steps = self.loss_steps, []
        for step, value in zip(steps, values):
            if not math.isfinite(value):
                self._diverge(step)
                return
            for hook in self.loss_hooks:
                hook(step + 1, value)  # step + 1: the store's step counts the update this loss produced
        if log:
            log_to_loggers(self.trainer, {"train/loss": values[-1]})

    def on_validation_start(self) -> None:
        # before validation logs at the current step: the buffered steps' values (spikes) are older
        if not self.trainer.sanity_checking:
            self.read_losses()

    def on_train_epoch_end(self) -> None:
        self.read_losses()

    def on_train_end(self) -> None:
        self.read_losses()

    def _diverge(self, step: int) -> None:
        # A non-finite loss ends the run as `diverged`: nothing from it on was applied; stop cleanly.
        if not self.diverged:
            self.diverged, self.diverged_at = True, step
        self.trainer.should_stop = True

    def validation_step(self, batch, batch_idx: int) -> Tensor:
        loss, output = self.loss(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=len(batch[0]))
        for name, value in self.stats(output, batch).items():
            self.log(name, value, on_epoch=True, prog_bar=True, batch_size=len(batch[0]))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(self.model.parameters(), self.optim_cfg)


class Classifier(GeoModule):
    def loss(self, batch) -> tuple[Tensor, Tensor]:
        x, y = batch
        logits = self.model(x)  # (B, classes)
        return F.cross_entropy(logits, y), logits

    def stats(self, output: Tensor, batch) -> dict[str, Tensor]:
        return {"val/acc": (output.argmax(-1) == batch[1]).float().mean()}


class LanguageModel(GeoModule):
    def loss(self, batch) -> tuple[Tensor, Tensor]:
        x, y = batch  # (B, T) tokens and next tokens
        logits = self.model(x)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()), logits

    # val/ppl = exp(val/loss), from the validation run's own batch-weighted mean: Lightning's epoch
    # value of val/loss is aggregated only after these hooks, and the sum stays on the device.
    def on_validation_epoch_start(self) -> None:
        self.val_loss_sum = torch.zeros((), device=self.device)
        self.val_count = 0

    def validation_step(self, batch, batch_idx: int) -> Tensor:
        loss = super().validation_step(batch, batch_idx)
        self.val_loss_sum += loss.detach().float() * len(batch[0])
        self.val_count += len(batch[0])
        return loss

    def on_validation_epoch_end(self) -> None:
        if self.val_count and not self.trainer.sanity_checking:
            mean = float(self.val_loss_sum) / self.val_count
            log_to_loggers(self.trainer, {"val/ppl": math.exp(min(mean, 50.0))})  # capped: exp overflows
