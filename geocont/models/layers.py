"""Building blocks shared by every model: activation and norm registries, Radial, RMSNorm.

Variants are names in the config, looked up here when a model is built. Every activation takes no
arguments and every norm takes the feature width, so callers never branch on the variant.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Radial(nn.Module):
    """sigma_rad(x) = x * tanh(||x||) over the feature dimension.

    Nonlinear yet rotation-equivariant (R sigma(x) = sigma(R x) for orthogonal R): the paper's
    counter-example showing that nonlinearity alone does not pin layers to a shared frame.
    """

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.tanh(x.norm(dim=-1, keepdim=True))


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (Llama); matches torch.nn.RMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 for bf16 stability, then cast back.
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "none": nn.Identity,
    "radial": Radial,
}


def _no_norm(dim: int) -> nn.Module:
    return nn.Identity()


NORMS = {
    "none": _no_norm,
    "layernorm": nn.LayerNorm,
    "rmsnorm": RMSNorm,
}


def make_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; allowed: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def make_norm(name: str, dim: int) -> nn.Module:
    if name not in NORMS:
        raise ValueError(f"unknown norm {name!r}; allowed: {', '.join(NORMS)}")
    return NORMS[name](dim)
