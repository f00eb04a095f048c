"""Packed residual MLP: K same-shape trials trained as one batched model in one process.

    x (K, B, in) -> input projection -> L blocks -> head -> logits (K, B, classes)

Member k is exactly the solo `ResidualMLP` k: every layer holds one parameter of shape (K, out, in)
(biases and norm gains (K, out)) and runs as one batched matmul (baddbmm), so a step costs a few large
kernels instead of K times many small ones. One parameter per layer, not one (K, L, d, d) tensor sliced
per layer: a slice's backward writes a full-size gradient, which measured twice as slow (docs/stack.md).

What may differ between members, and what may not (`geocont.pack.pack_key` is the rule in code):
- may differ: the seed (hence the initial weights, the data split and the batch order), `init_std`
  (it only changes the initial weights, which `from_members` copies from each solo model) and every
  optimizer hyperparameter (lr, beta1, beta2, eps, weight_decay: geocont.optim.batched takes them per member);
- may not: depth, width, residual, activation, norm, bias, the data set and its sizes, the batch size, the
  step budget, precision and the optimizer's algorithm: they change shapes, the forward function or the
  number of steps, and the batch dimension K needs every member to run the same ops on the same shapes.

Members never mix: matmuls are batched over K, norms and Radial reduce over the feature dim only, and
the loss is a sum of per-member means, so member k's gradient is its solo gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from geocont.config import MLPConfig
from geocont.models.layers import make_activation
from geocont.models.mlp import ResidualMLP


class _BatchedLinear(torch.autograd.Function):
    """y = x W^T + b per member, with a backward that writes dW in the weight's own layout.

    Autograd's bmm backward gives d(W^T) = x^T dy, (K, in, out), whose transpose then has to be copied
    into the (K, out, in) gradient: on the CPU that strided copy took a quarter of the packed step.
    Computing dW = dy^T x directly is the same sum, in the layout nn.Linear's own backward produces.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        if bias is None:
            return torch.bmm(x, weight.mT)  # (K, B, out)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.mT)  # fuses the bias as addmm does for nn.Linear

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None  # (K, B, in)
        grad_w = torch.bmm(grad.mT, x) if ctx.needs_input_grad[1] else None  # (K, out, in)
        grad_b = grad.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None  # (K, out)
        return grad_x, grad_w, grad_b


class PackedLinear(nn.Module):
    """K independent nn.Linear layers: weight (K, out, in), bias (K, out) or None."""

    def __init__(self, K: int, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(K, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(K, out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return _BatchedLinear.apply(x, self.weight, self.bias)  # (K, B, in) -> (K, B, out)


class PackedLayerNorm(nn.Module):
    """K nn.LayerNorms: normalise over the feature dim of each sample, then each member's gain and shift."""

    def __init__(self, K: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(K, dim))
        self.bias = nn.Parameter(torch.zeros(K, dim))

    def forward(self, x: Tensor) -> Tensor:
        # One layer_norm per member with its own gain and shift: nn.LayerNorm's own fused kernel, so values
        # and gradients are the solo ones bit for bit. One shared call followed by the affine rounds
        # differently, and over a few hundred steps that ulp grew into a different run (train/loss 0.3 apart).
        d = x.shape[-1:]
        return torch.stack([F.layer_norm(x[k], d, self.weight[k], self.bias[k], self.eps) for k in range(len(x))])


class PackedRMSNorm(nn.Module):
    """K geocont RMSNorms (fp32 normalisation, then each member's gain)."""

    def __init__(self, K: int, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(K, dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)  # (K, B, d)
        return out.type_as(x) * self.weight.unsqueeze(1)


def _no_norm(K: int, dim: int) -> nn.Module:
    return nn.Identity()


# The same keys as layers.NORMS; each takes (K, dim). Activations need no packed form: they are
# elementwise, or (Radial) reduce over the feature dim only.
PACKED_NORMS = {
    "none": _no_norm,
    "layernorm": PackedLayerNorm,
    "rmsnorm": PackedRMSNorm,
}


def make_packed_norm(name: str, K: int, dim: int) -> nn.Module:
    if name not in PACKED_NORMS:
        raise ValueError(f"unknown norm {name!r}; allowed: {', '.join(PACKED_NORMS)}")
    return PACKED_NORMS[name](K, dim)


class PackedBlock(nn.Module):
    def __init__(self, cfg: MLPConfig, K: int):
        super().__init__()
        self.norm = make_packed_norm(cfg.norm, K, cfg.width)
        self.linear = PackedLinear(K, cfg.width, cfg.width, bias=cfg.bias)
        self.act = make_activation(cfg.activation)
        self.residual = cfg.residual

    def forward(self, h: Tensor) -> Tensor:
        out = self.act(self.linear(self.norm(h)))  # (K, B, width)
        return h + out if self.residual else out


class PackedMLP(nn.Module):
    """K ResidualMLPs of one shape; parameter names are the solo ones, each with a leading K dim."""

    def __init__(self, cfg: MLPConfig, K: int, in_features: int, num_classes: int):
        super().__init__()
        self.cfg, self.K = cfg, K
        self.input = PackedLinear(K, in_features, cfg.width)
        self.blocks = nn.ModuleList(PackedBlock(cfg, K) for _ in range(cfg.depth))
        self.head = PackedLinear(K, cfg.width, num_classes)

    @classmethod
    def from_members(cls, models: list[ResidualMLP]) -> PackedMLP:
        """Stack K solo models (each seeded and initialised on its own) into one pack.

        The members' configs may differ only in `init_std` (already spent on their weights): the first
        member's config, with init_std cleared, describes the pack.
        """
        first = models[0]
        shape = first.cfg.model_copy(update={"init_std": None})
        for k, m in enumerate(models):
            if m.cfg.model_copy(update={"init_std": None}) != shape:
                raise ValueError(f"member {k}'s model config differs from member 0's in more than init_std")
        in_features, num_classes = first.input.in_features, first.head.out_features
        packed = cls(shape, len(models), in_features, num_classes).to(first.input.weight)
        states = [m.state_dict() for m in models]
        with torch.no_grad():
            for name, tensor in packed.state_dict().items():
                tensor.copy_(torch.stack([s[name] for s in states]))  # (K, *solo shape)
        return packed

    def forward(self, x: Tensor) -> Tensor:
        h = self.input(x.flatten(2))  # (K, B, width)
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # (K, B, classes)

    def member_state_dict(self, k: int) -> dict[str, Tensor]:
        """Member k in the solo ResidualMLP's layout: `ResidualMLP.load_state_dict` takes it as is."""
        return {name: tensor[k].detach().clone() for name, tensor in self.state_dict().items()}

    def weight_groups(self) -> dict[str, list[nn.Parameter]]:
        """The solo model's groups with each matrix packed: role '' -> L parameters of shape (K, width, width).

        geocont.metrics.packed.packed_stack turns a group into the (K, L, m, n) stack its metrics take.
        """
        return {"": [b.linear.weight for b in self.blocks]}
