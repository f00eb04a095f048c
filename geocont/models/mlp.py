"""Residual MLP: the paper's toy model (16 blocks of width 256 on MNIST).

    x (B, in) -> input projection -> L blocks -> head -> logits (B, classes)
    block with residual:    h = h + act(W_l(norm(h)))
    block without residual: h = act(W_l(norm(h)))

The L hidden matrices W_l (width x width) are the stack whose geometry the metrics study; the input
projection and the head have other shapes and roles and are left out of it.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from geocont.kinds.mlp import MLPConfig
from geocont.models.layers import make_activation, make_norm


class Block(nn.Module):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        self.norm = make_norm(cfg.norm, cfg.width)
        self.linear = nn.Linear(cfg.width, cfg.width, bias=cfg.bias)
        self.act = make_activation(cfg.activation)
        self.residual = cfg.residual
        if cfg.init_std is not None:
            nn.init.normal_(self.linear.weight, 0.0, cfg.init_std)
            if self.linear.bias is not None:
                nn.init.zeros_(self.linear.bias)

    def forward(self, h: Tensor) -> Tensor:
        out = self.act(self.linear(self.norm(h)))  # (B, width)
        return h + out if self.residual else out


class ResidualMLP(nn.Module):
    def __init__(self, cfg: MLPConfig, in_features: int, num_classes: int):
        super().__init__()
        self.cfg = cfg
        self.input = nn.Linear(in_features, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.head = nn.Linear(cfg.width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.input(x.flatten(1))  # (B, width)
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # (B, classes)

    def weight_groups(self) -> dict[str, list[nn.Parameter]]:
        """The same-role matrices whose continuity is measured: one group, the hidden blocks."""
        return {"": [b.linear.weight for b in self.blocks]}


def build(cfg: MLPConfig, data: Any) -> ResidualMLP:
    """The kind's network builder (geocont.kinds.mlp): sizes from the data module."""
    return ResidualMLP(cfg, in_features=data.in_features, num_classes=data.num_classes)
