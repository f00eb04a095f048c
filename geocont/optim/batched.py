"""Batched Adam, AdamW and SGD for packed trials: every hyperparameter is per member.

Each parameter is (K, ...), member k's slice param[k] being one trial's tensor (contiguous, since the
leading dim is the outermost). A step runs torch's own fused kernel (`torch._fused_adam_`,
`_fused_adamw_`, `_fused_sgd_`: what `torch.optim.Adam(fused=True)` calls) once per member, on that
member's slices of every parameter, gradient and moment, with that member's lr, betas, eps and weight
decay. Member k therefore takes exactly the update `torch.optim.*(fused=True)` would take on its solo
tensors (same kernel, same inputs, same float arithmetic), and the pack costs one pass over the weights,
as a solo run does. (The first version composed the update from ~8 foreach ops over the stacked tensors:
~4 ms a trial-step against ~1.2 ms here on one CPU thread, paper MLP; benchmarks/bench_pack.py.)

`active` (K,) bool is the divergence mask: `freeze(finite)` clears a member whose loss turned non-finite,
and from that step on its parameters and optimizer state (moments, step count) stay exactly as they
were while the others go on. The kernels' own `found_inf` argument does it: member k's call gets
`found_inf = not active[k]` (a device scalar, so nothing is read on the host) and returns before
touching anything, so a frozen member's NaN gradient is never even read; its step count is not advanced.

The hyperparameters are (K,) float64 tensors in the param group (state_dict carries them), kept on the
CPU: they are only ever scalar arguments of the kernels, read as Python floats (exactly the config's
values, as torch.optim gets them) each step. The step counts and `active` live on the parameters' device.

The algorithms are torch.optim's as geocont.lit.module.build_optimizer configures them: SGD's momentum
is beta1 (no dampening, no Nesterov), Adam's weight decay is L2 added to the gradient, AdamW's is
decoupled. tests/test_batched_optim.py checks each member against torch.optim run on it alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from geocont.config import OptimConfig

DEFAULT_EPS = 1e-8  # torch.optim.Adam's


class BatchedOptimizer(torch.optim.Optimizer):
    """One param group of (K, ...) tensors; its (K,) hyperparameters, step counts and `active` mask.

    They all live in the param group, so state_dict / load_state_dict carry them with the moments.
    """

    def __init__(self, params, K: int, **hyper: float | Sequence[float] | Tensor):
        params = list(params)
        bad = [tuple(p.shape) for p in params if p.dim() == 0 or p.shape[0] != K]
        if bad:
            raise ValueError(f"every parameter needs a leading member dim of size K={K}; got shapes {bad}")
        device = params[0].device
        if device.type not in _get_fused_kernels_supported_devices() or not all(p.is_floating_point() for p in params):
            raise ValueError(f"the fused kernels need floating parameters on cpu, cuda..., not {device}")
        group = {name: _per_member(value, K) for name, value in hyper.items()}
        # float32, as torch.optim keeps a fused optimizer's step count (the kernels read it as float)
        group["step"] = torch.zeros(K, dtype=torch.float32, device=device)
        group["active"] = torch.ones(K, dtype=torch.bool, device=device)
        super().__init__(params, group)
        self.K = K
        # id(tensor) -> (tensor, its data_ptr, its K member views): the parameters' and state's views are
        # made once, not every step (making 4 x K views of ~35 tensors cost more than the kernels' calls)
        self._views: dict[int, tuple[Tensor, int, tuple[Tensor, ...]]] = {}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._views.clear()  # the state tensors are new ones

    @property
    def active(self) -> Tensor:
        return self.param_groups[0]["active"]

    def freeze(self, finite: Tensor) -> Tensor:
        """Stop, for good, the members whose `finite` (K,) is False; returns the active mask."""
        self.active.logical_and_(finite.to(self.active.device))
        return self.active

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad if p.grad.is_contiguous() else p.grad.contiguous() for p in params]
            group["step"] += group["active"]  # a frozen member's count stays
            state = self._state(params)
            self._update(
                [self._members(params), _members(grads), *(self._members(s) for s in state)],
                group["step"].unbind(0),  # member k's count, read by each of its kernel calls
                {name: group[name].tolist() for name in self.hyper_names},  # Python floats, as torch.optim's
                (~group["active"]).float().unbind(0),  # member k's found_inf: 1 skips its update
            )
        return loss

    hyper_names: tuple[str, ...] = ()

    def _state(self, params: list[Tensor]) -> list[list[Tensor]]:
        """The per-parameter state tensors the kernel takes, made (zeros) on first use."""
        raise NotImplementedError

    def _update(self, tensors: list[list[list[Tensor]]], steps, hyper: dict[str, list[float]], found_inf) -> None:
        """One kernel call per member k on tensors[i][k] (params, grads, state...) with hyper[name][k]."""
        raise NotImplementedError

    def _members(self, tensors: list[Tensor]) -> list[list[Tensor]]:
        """_members of long-lived tensors (parameters, state), their views kept from step to step."""
        views = []
        for t in tensors:
            cached = self._views.get(id(t))
            if cached is None or cached[0] is not t or cached[1] != t.data_ptr():  # new, or `.data` replaced
                cached = self._views[id(t)] = (t, t.data_ptr(), t.unbind(0))
            views.append(cached[2])
        return [list(ts) for ts in zip(*views)]


def _members(tensors: list[Tensor]) -> list[list[Tensor]]:
    """K lists, list k holding every tensor's slice k (a contiguous view of a contiguous tensor)."""
    return [list(ts) for ts in zip(*(t.unbind(0) for t in tensors))]


def _per_member(value: float | Sequence[float] | Tensor, K: int) -> Tensor:
    t = torch.as_tensor(value, dtype=torch.float64, device="cpu")
    if t.dim() == 0:
        return t.expand(K).clone()
    if t.shape != (K,):
        raise ValueError(f"a per-member hyperparameter needs K={K} values, got shape {tuple(t.shape)}")
    return t.clone()


def _zeros_state(optimizer: torch.optim.Optimizer, params: list[Tensor], names: tuple[str, ...]) -> list[list[Tensor]]:
    for p in params:
        if not optimizer.state[p]:
            optimizer.state[p] = {name: torch.zeros_like(p, memory_format=torch.preserve_format) for name in names}
    return [[optimizer.state[p][name] for p in params] for name in names]


class BatchedAdam(BatchedOptimizer):
    """Adam (decoupled=False) or AdamW (decoupled=True) with (K,) lr, betas, eps and weight decay."""

    hyper_names = ("lr", "beta1", "beta2", "eps", "weight_decay")

    def __init__(self, params, K: int, lr=1e-3, beta1=0.9, beta2=0.999, eps=DEFAULT_EPS, weight_decay=0.0,
                 decoupled: bool = False):  # fmt: skip
        super().__init__(params, K, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        if not bool((self.param_groups[0]["lr"] >= 0).all()):
            raise ValueError(f"every member's lr must be >= 0, got {self.param_groups[0]['lr'].tolist()}")
        self.decoupled = decoupled

    def _state(self, params):
        return _zeros_state(self, params, ("exp_avg", "exp_avg_sq"))

    def _update(self, tensors, steps, hyper, found_inf):
        kernel = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
        params, grads, exp_avgs, exp_avg_sqs = tensors
        for k in range(self.K):
            kernel(
                params[k], grads[k], exp_avgs[k], exp_avg_sqs[k], [], [steps[k]] * len(params[k]),
                lr=hyper["lr"][k], beta1=hyper["beta1"][k], beta2=hyper["beta2"][k], eps=hyper["eps"][k],
                weight_decay=hyper["weight_decay"][k], amsgrad=False, maximize=False, found_inf=found_inf[k],
            )  # fmt: skip


class BatchedSGD(BatchedOptimizer):
    """SGD with (K,) lr, momentum (beta1, as build_optimizer sets it) and L2 weight decay.

    The momentum buffer starts at zero rather than as a copy of the first gradient (torch.optim's
    first step): momentum * 0 + g is exactly g, and a member's first step is then no special case (a
    per-member "first step" flag would have to be read from the device).
    """

    hyper_names = ("lr", "beta1", "weight_decay")

    def __init__(self, params, K: int, lr=1e-3, beta1=0.0, weight_decay=0.0):
        super().__init__(params, K, lr=lr, beta1=beta1, weight_decay=weight_decay)

    def _state(self, params):
        return _zeros_state(self, params, ("momentum_buffer",))

    def _update(self, tensors, steps, hyper, found_inf):
        params, grads, bufs = tensors
        for k in range(self.K):
            momentum = hyper["beta1"][k]
            torch._fused_sgd_(
                params[k], grads[k], bufs[k] if momentum != 0 else [], weight_decay=hyper["weight_decay"][k],
                momentum=momentum, lr=hyper["lr"][k], dampening=0.0, nesterov=False, maximize=False,
                is_first_step=False, found_inf=found_inf[k],
            )  # fmt: skip


def build_batched_optimizer(params, cfgs: Sequence[OptimConfig]) -> BatchedOptimizer:
    """build_optimizer for a pack: one optimizer whose member k follows cfgs[k].

    The members must share the algorithm (`name`); every other field may differ.
    """
    names = {c.name for c in cfgs}
    if len(names) != 1:
        raise ValueError(f"a pack needs one optimizer algorithm, got {sorted(names)}")
    K, name = len(cfgs), cfgs[0].name

    def per(field: str) -> list[float]:
        return [getattr(c, field) for c in cfgs]

    if name == "sgd":
        return BatchedSGD(params, K, lr=per("lr"), beta1=per("beta1"), weight_decay=per("weight_decay"))
    return BatchedAdam(params, K, lr=per("lr"), beta1=per("beta1"), beta2=per("beta2"), eps=per("eps"),
                       weight_decay=per("weight_decay"), decoupled=name == "adamw")  # fmt: skip
