"""A toy third model kind, an MLP-Mixer over image patches, registered from outside geocont.

It exists to show that a family is one module plus one registration: tests/test_model_kinds.py
trains it, sweeps it on Ray (GEOCONT_KINDS=toy_mixer), tabulates and reports it without any other
file knowing it. Two weight roles: `token` (mixing across the 16 patches) and `channel` (across
features), so its metrics are per role like a transformer's.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from torch import Tensor, nn

from geocont import kinds
from geocont.fields import Depth, ModelSection, PositiveInt
from geocont.kinds.base import ModelKind, Section, lines

ROLES = ("token", "channel")
TOKENS = 16  # a 4 x 4 grid of patches


class MixerConfig(ModelSection):
    kind: Literal["mixer"] = "mixer"
    depth: Depth = 4
    width: PositiveInt = 32
    activation: Literal["relu", "none"] = "relu"
    residual: bool = True


class MixerBlock(nn.Module):
    def __init__(self, cfg: MixerConfig):
        super().__init__()
        self.token = nn.Linear(TOKENS, TOKENS)
        self.channel = nn.Linear(cfg.width, cfg.width)
        self.act = nn.ReLU() if cfg.activation == "relu" else nn.Identity()
        self.residual = cfg.residual

    def forward(self, h: Tensor) -> Tensor:  # (B, tokens, width)
        mixed = self.act(self.token(h.transpose(1, 2))).transpose(1, 2)
        h = h + mixed if self.residual else mixed
        out = self.act(self.channel(h))
        return h + out if self.residual else out


class Mixer(nn.Module):
    def __init__(self, cfg: MixerConfig, in_features: int, num_classes: int):
        super().__init__()
        side = math.isqrt(in_features)
        self.patch = side // 4
        self.embed = nn.Linear(self.patch * self.patch, cfg.width)
        self.blocks = nn.ModuleList(MixerBlock(cfg) for _ in range(cfg.depth))
        self.head = nn.Linear(cfg.width, num_classes)
        self.side = side

    def forward(self, x: Tensor) -> Tensor:
        b, p = x.shape[0], self.patch
        img = x.reshape(b, self.side, self.side)[:, : 4 * p, : 4 * p]
        patches = img.reshape(b, 4, p, 4, p).permute(0, 1, 3, 2, 4).reshape(b, TOKENS, p * p)
        h = self.embed(patches)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(1))

    def weight_groups(self) -> dict[str, list[nn.Parameter]]:
        return {role: [getattr(b, role).weight for b in self.blocks] for role in ROLES}


def build(cfg: MixerConfig, data: Any) -> Mixer:
    return Mixer(cfg, data.in_features, data.num_classes)


def parameters(cfg) -> int:
    m = cfg.model
    return m.depth * (TOKENS * TOKENS + m.width * m.width) + 1000 * m.width


MIXER = kinds.register(
    ModelKind(
        name="mixer",
        config=MixerConfig,
        data=("digits", "mnist"),
        network="toy_mixer:build",
        lightning="geocont.lit.module:Classifier",
        parameters=parameters,
        roles=ROLES,
        dashboard=(
            Section("Continuity per role", lines(*(f"weight/{r}/v1_continuity" for r in ROLES))),
            Section("Accuracy and loss", lines("val/acc", "train/loss")),
        ),
        report=("role_continuity", "delta_heatmap", "training"),
    )
)
