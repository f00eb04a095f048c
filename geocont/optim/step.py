"""One training step of K packed classifiers, in plain torch (any loop or LightningModule can call it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from geocont.optim.batched import BatchedOptimizer


def member_losses(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Per-member mean cross-entropy (K,) of a packed classifier on x (K, B, ...) and labels y (K, B)."""
    logits = model(x)  # (K, B, C)
    K, B, C = logits.shape
    # cross_entropy is log_softmax then nll_loss: the log_softmax runs on (K * B, C) rows, each member's
    # block laid out as its solo logits, and the mean over each member's batch is its solo nll_loss, so
    # every member's loss and gradient are its solo run's bit for bit (one transposed (K, C, B)
    # cross_entropy reduced the head's bias gradient, and the batch mean, in another order)
    logp = F.log_softmax(logits.reshape(K * B, C), dim=1).view(K, B, C)
    return torch.stack([F.nll_loss(lp, t) for lp, t in zip(logp.unbind(0), y.unbind(0))])


def classifier_step(model: nn.Module, optimizer: BatchedOptimizer, x: Tensor, y: Tensor) -> Tensor:
    """Losses (K,) before the update; every active member with a finite loss takes one optimizer step.

    The backward runs on the sum of the losses: members share no parameter, so each member's gradient
    is its own loss's, as in its solo run. A member whose loss is non-finite is frozen for good first
    (`optimizer.freeze`), so that step and every later one leave it at its last finite weights, as a solo
    run that stops at its first non-finite loss; the others go on. Its updates applied before the
    first non-finite loss are `optimizer.param_groups[0]["step"][k]` (the solo run's `diverged_at`).
    Nothing here reads a value on the host: on a GPU the step never waits for the device.
    """
    losses = member_losses(model, x, y)
    active = optimizer.freeze(torch.isfinite(losses.detach()))
    optimizer.zero_grad(set_to_none=True)
    # where, not a product: a frozen member's NaN loss must not reach the sum (NaN * 0 is NaN)
    torch.where(active, losses, 0.0).sum().backward()
    optimizer.step()
    return losses.detach()
