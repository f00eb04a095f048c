"""Batched Adam, AdamW and SGD for packed trials: every hyperparameter is per member.

Each parameter is (K, ...), member k's slice being one trial's tensor. lr, beta1, beta2, eps and
weight_decay are (K,) tensors broadcast over that leading dim, so K trials with K learning rates take
one step with a handful of foreach ops over the parameter list, never a Python loop over members.

`active` (K,) bool is the divergence mask: `freeze(finite)` clears a member whose loss turned
non-finite, and from that step on its parameters and optimizer state (moments, step count) stay
exactly as they were while the others go on. Freezing goes through the per-member coefficients (a
frozen member's lr and weight decay are 0, its betas 1, its gradient replaced by 0: every update is then
x * 1 + 0, exact), so it costs no extra pass over the parameters; the gradient is replaced, not
multiplied, because a frozen member's gradient may be NaN and NaN * 0 is NaN.

The algorithms are torch.optim's as geocont.lit.module.build_optimizer configures them: SGD's momentum
is beta1 (no dampening, no Nesterov), Adam's weight decay is L2 added to the gradient, AdamW's is
decoupled. tests/test_batched_optim.py checks each member against torch.optim run on it alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from geocont.config import OptimConfig

DEFAULT_EPS = 1e-8  # torch.optim.Adam's; OptimConfig may grow an `eps` field, read when present


class BatchedOptimizer(torch.optim.Optimizer):
    """One param group of (K, ...) tensors; its (K,) hyperparameters, step count and `active` mask.

    They all live in the param group, so state_dict / load_state_dict carry them with the moments.
    """

    def __init__(self, params, K: int, **hyper: float | Sequence[float] | Tensor):
        params = list(params)
        bad = [tuple(p.shape) for p in params if p.dim() == 0 or p.shape[0] != K]
        if bad:
            raise ValueError(f"every parameter needs a leading member dim of size K={K}; got shapes {bad}")
        device = params[0].device
        # float64 (where the device has it): per-member scalars such as the bias corrections are then
        # computed as torch.optim computes them in Python floats, and cast once to the parameters' dtype
        dtype = torch.float32 if device.type == "mps" else torch.float64
        group = {name: _per_member(value, K, device, dtype) for name, value in hyper.items()}
        group["step"] = torch.zeros(K, dtype=dtype, device=device)
        group["active"] = torch.ones(K, dtype=torch.bool, device=device)
        super().__init__(params, group)
        self.K = K

    @property
    def active(self) -> Tensor:
        return self.param_groups[0]["active"]

    def freeze(self, finite: Tensor) -> Tensor:
        """Stop, for good, the members whose `finite` (K,) is False; returns the active mask."""
        self.active.logical_and_(finite.to(self.active.device))
        return self.active

    def _frozen_as(self, value: Tensor, neutral: float) -> Tensor:
        """(K,) `value` with frozen members set to the `neutral` value that leaves their state unchanged."""
        return torch.where(self.active, value, torch.full_like(value, neutral))

    def _grads(self, params: list[Tensor]) -> list[Tensor]:
        shape = [self.active.view(-1, *([1] * (p.dim() - 1))) for p in params]
        return [torch.where(on, p.grad, 0.0) for on, p in zip(shape, params)]  # where: NaN stays out

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params)
        return loss

    def _update(self, group: dict, params: list[Tensor]) -> None:
        raise NotImplementedError


def _per_member(value: float | Sequence[float] | Tensor, K: int, device: torch.device, dtype) -> Tensor:
    t = torch.as_tensor(value, dtype=dtype, device=device)
    if t.dim() == 0:
        return t.expand(K).clone()
    if t.shape != (K,):
        raise ValueError(f"a per-member hyperparameter needs K={K} values, got shape {tuple(t.shape)}")
    return t.clone()


def _view(h: Tensor, p: Tensor) -> Tensor:
    """(K,) -> (K, 1, ..., 1) in p's dtype: broadcasts over member k's slice of p."""
    return h.to(p.dtype).view(-1, *([1] * (p.dim() - 1)))


def _views(h: Tensor, params: list[Tensor]) -> list[Tensor]:
    return [_view(h, p) for p in params]


class BatchedAdam(BatchedOptimizer):
    """Adam (decoupled=False) or AdamW (decoupled=True) with (K,) lr, betas, eps and weight decay."""

    def __init__(self, params, K: int, lr=1e-3, beta1=0.9, beta2=0.999, eps=DEFAULT_EPS, weight_decay=0.0,
                 decoupled: bool = False):  # fmt: skip
        super().__init__(params, K, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        self.decoupled = decoupled

    def _update(self, group: dict, params: list[Tensor]) -> None:
        m, v = self._moments(params)
        group["step"] += self.active.to(group["step"].dtype)  # a frozen member's count stays
        lr, wd = self._frozen_as(group["lr"], 0.0), self._frozen_as(group["weight_decay"], 0.0)
        beta1, beta2 = self._frozen_as(group["beta1"], 1.0), self._frozen_as(group["beta2"], 1.0)
        grads = self._grads(params)
        if self.decoupled:
            torch._foreach_mul_(params, _views(1 - lr * wd, params))
        else:
            grads = torch._foreach_add(grads, torch._foreach_mul(params, _views(wd, params)))
        torch._foreach_lerp_(m, grads, _views(1 - beta1, params))
        torch._foreach_mul_(v, _views(beta2, params))
        torch._foreach_add_(v, torch._foreach_mul(torch._foreach_mul(grads, grads), _views(1 - beta2, params)))
        # bias corrections from each member's own step count (clamped: a member frozen before its
        # first step has count 0, and its lr is 0 anyway)
        steps = group["step"].clamp_min(1)
        step_size = lr / (1 - group["beta1"] ** steps)  # (K,)
        correction2_sqrt = (1 - group["beta2"] ** steps).sqrt()
        denom = torch._foreach_div(torch._foreach_sqrt(v), _views(correction2_sqrt, params))
        torch._foreach_add_(denom, _views(group["eps"], params))
        torch._foreach_sub_(params, torch._foreach_div(torch._foreach_mul(m, _views(step_size, params)), denom))

    def _moments(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        for p in params:
            if not self.state[p]:
                self.state[p] = {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        return [self.state[p]["exp_avg"] for p in params], [self.state[p]["exp_avg_sq"] for p in params]


class BatchedSGD(BatchedOptimizer):
    """SGD with (K,) lr, momentum (beta1, as build_optimizer sets it) and L2 weight decay."""

    def __init__(self, params, K: int, lr=1e-3, beta1=0.0, weight_decay=0.0):
        super().__init__(params, K, lr=lr, beta1=beta1, weight_decay=weight_decay)

    def _update(self, group: dict, params: list[Tensor]) -> None:
        group["step"] += self.active.to(group["step"].dtype)
        lr, wd = self._frozen_as(group["lr"], 0.0), self._frozen_as(group["weight_decay"], 0.0)
        momentum = self._frozen_as(group["beta1"], 1.0)
        grads = torch._foreach_add(self._grads(params), torch._foreach_mul(params, _views(wd, params)))
        # torch.optim starts the buffer as the first gradient: momentum * 0 + g is exactly that
        bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
        torch._foreach_mul_(bufs, _views(momentum, params))
        torch._foreach_add_(bufs, grads)
        torch._foreach_sub_(params, torch._foreach_mul(bufs, _views(lr, params)))


def build_batched_optimizer(params, cfgs: Sequence[OptimConfig]) -> BatchedOptimizer:
    """build_optimizer for a pack: one optimizer whose member k follows cfgs[k].

    The members must share the algorithm (`name`); every other field may differ.
    """
    names = {c.name for c in cfgs}
    if len(names) != 1:
        raise ValueError(f"a pack needs one optimizer algorithm, got {sorted(names)}")
    K, name = len(cfgs), cfgs[0].name

    def per(field: str) -> list[float]:
        return [getattr(c, field) if field != "eps" else getattr(c, "eps", DEFAULT_EPS) for c in cfgs]

    if name == "sgd":
        return BatchedSGD(params, K, lr=per("lr"), beta1=per("beta1"), weight_decay=per("weight_decay"))
    return BatchedAdam(params, K, lr=per("lr"), beta1=per("beta1"), beta2=per("beta2"), eps=per("eps"),
                       weight_decay=per("weight_decay"), decoupled=name == "adamw")  # fmt: skip
