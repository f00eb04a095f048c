"""Batched Adam, AdamW and SGD for packed trials: every hyperparameter is per member.

Each parameter is (K, ...), member k's slice being one trial's tensor. lr, beta1, beta2, eps and
weight_decay are (K,) tensors broadcast over that leading dim, so K trials with K learning rates take
one step with a handful of foreach ops over the parameter list, never a Python loop over members.

`active` (K,) bool is the divergence mask: `freeze(finite)` clears a member whose loss turned
non-finite, and from that step on its parameters and optimizer state (moments, step count) stay
exactly as they were while the others go on. Freezing goes through the per-member coefficients (a
frozen member's weight decay is 0, its betas 1, its gradient replaced by 0, its update's denominator
inf: every update is then x * 1 + 0, exact), so it costs no extra pass over the parameters; the
gradient is replaced, not multiplied, because a frozen member's gradient may be NaN (NaN * 0 is NaN).

Cost (benchmarks/bench_pack.py, one CPU thread, paper MLP): Adam here makes 8 passes over the
parameters where torch's fused kernel makes one, about 4 ms a member-step against 0.8 ms. A fused
per-member kernel would need a custom kernel or torch.compile (55 s to compile here, still 2.5x fused).

The algorithms are torch.optim's as geocont.lit.module.build_optimizer configures them: SGD's momentum
is beta1 (no dampening, no Nesterov), Adam's weight decay is L2 added to the gradient, AdamW's is
decoupled. tests/test_batched_optim.py checks each member against torch.optim run on it alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from geocont.config import OptimConfig

DEFAULT_EPS = 1e-8  # torch.optim.Adam's; OptimConfig may grow an `eps` field, read when present


class BatchedOptimizer(torch.optim.Optimizer):
    """One param group of (K, ...) tensors; its (K,) hyperparameters, step count and `active` mask.

    They all live in the param group, so state_dict / load_state_dict carry them with the moments.
    Every update is in place: a step allocates nothing after the first (a fresh multi-megabyte
    temporary per op costs the CPU page faults each step), and the masked gradient goes to a scratch
    buffer per parameter that is not part of the state.
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
        self.scratch: dict[Tensor, list[Tensor]] = {}
        self._read_flags()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._read_flags()

    def _read_flags(self) -> None:
        # read once on the host, never per step (a GPU would sync): skips the weight-decay pass when unused
        self.decays = bool((self.param_groups[0]["weight_decay"] != 0).any())

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

    def _buffers(self, params: list[Tensor], n: int) -> list[list[Tensor]]:
        """n scratch tensors per parameter, made on first use: n lists of len(params)."""
        for p in params:
            if p not in self.scratch:
                self.scratch[p] = [torch.empty_like(p) for _ in range(n)]
        return [[self.scratch[p][i] for p in params] for i in range(n)]

    def _masked_grads(self, params: list[Tensor], out: list[Tensor]) -> list[Tensor]:
        """The gradients with frozen members' slices zeroed, into `out`. where, not a product: NaN * 0 is NaN."""
        on = _per_param(self.active, params)
        zero = params[0].new_zeros(())
        for o, mask, p in zip(out, on, params):
            torch.where(mask, p.grad, zero, out=o)
        return out

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


def _per_param(h: Tensor, params: list[Tensor]) -> list[Tensor]:
    """(K,) -> one (K, 1, ..., 1) view per parameter, broadcasting over member k's slice (in its dtype)."""
    if h.dtype != torch.bool:
        h = h.to(params[0].dtype)
    by_dim: dict[int, Tensor] = {}
    for p in params:
        if p.dim() not in by_dim:
            by_dim[p.dim()] = h.view(-1, *([1] * (p.dim() - 1)))
    return [by_dim[p.dim()] for p in params]


class BatchedAdam(BatchedOptimizer):
    """Adam (decoupled=False) or AdamW (decoupled=True) with (K,) lr, betas, eps and weight decay."""

    def __init__(self, params, K: int, lr=1e-3, beta1=0.9, beta2=0.999, eps=DEFAULT_EPS, weight_decay=0.0,
                 decoupled: bool = False):  # fmt: skip
        super().__init__(params, K, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        if not bool((self.param_groups[0]["lr"] > 0).all()):  # the update divides by the step size
            raise ValueError(f"every member's lr must be positive, got {self.param_groups[0]['lr'].tolist()}")
        self.decoupled = decoupled

    def _update(self, group: dict, params: list[Tensor]) -> None:
        m, v = self._moments(params)
        grads, work = self._buffers(params, 2)
        grads = self._masked_grads(params, grads)
        group["step"] += self.active.to(group["step"].dtype)  # a frozen member's count stays
        lr, wd = self._frozen_as(group["lr"], 0.0), self._frozen_as(group["weight_decay"], 0.0)
        beta1, beta2 = self._frozen_as(group["beta1"], 1.0), self._frozen_as(group["beta2"], 1.0)
        if self.decays and self.decoupled:
            torch._foreach_mul_(params, _per_param(1 - lr * wd, params))
        elif self.decays:
            torch._foreach_addcmul_(grads, params, _per_param(wd, params))  # g + wd * p
        torch._foreach_lerp_(m, grads, _per_param(1 - beta1, params))
        torch._foreach_mul_(v, _per_param(beta2, params))
        for w, g, c in zip(work, grads, _per_param(1 - beta2, params)):
            torch.mul(g, c, out=w)
        torch._foreach_addcmul_(v, work, grads)  # v + ((1 - beta2) g) g, torch.optim's order
        # torch.optim's update is p - step_size * m / (sqrt(v) / c2 + eps) with bias corrections c1, c2 of
        # each member's own step count (clamped: a member frozen before its first step has count 0).
        # Here the denominator sqrt(v) * scale + shift = (sqrt(v) / c2 + eps) / step_size is built in
        # two passes, and the update is one addcdiv. A frozen member's scale 0 and shift inf make its
        # denominator inf and its update exactly 0.
        steps = group["step"].clamp_min(1)
        step_size = group["lr"] / (1 - group["beta1"] ** steps)  # (K,)
        correction2_sqrt = (1 - group["beta2"] ** steps).sqrt()
        scale = self._frozen_as(1 / (correction2_sqrt * step_size), 0.0)
        shift = self._frozen_as(group["eps"] / step_size, math.inf)
        for w, s, scl, sh in zip(work, v, _per_param(scale, params), _per_param(shift, params)):
            torch.sqrt(s, out=w)
            torch.addcmul(sh, w, scl, out=w)
        torch._foreach_addcdiv_(params, m, work, value=-1.0)

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
        (grads,) = self._buffers(params, 1)
        grads = self._masked_grads(params, grads)
        group["step"] += self.active.to(group["step"].dtype)
        lr, wd = self._frozen_as(group["lr"], 0.0), self._frozen_as(group["weight_decay"], 0.0)
        momentum = self._frozen_as(group["beta1"], 1.0)
        if self.decays:
            torch._foreach_addcmul_(grads, params, _per_param(wd, params))  # g + wd * p
        # torch.optim starts the buffer as the first gradient: momentum * 0 + g is exactly that
        bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
        torch._foreach_mul_(bufs, _per_param(momentum, params))
        torch._foreach_add_(bufs, grads)
        torch._foreach_addcmul_(params, bufs, _per_param(lr, params), value=-1.0)  # p - lr * buf


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
