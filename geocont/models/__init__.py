"""build_model(cfg, ...): the network of a run config, built by its model kind (geocont.kinds)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from torch import nn

from geocont import kinds
from geocont.config import RunConfig


def build_model(
    cfg: RunConfig, datamodule: Any = None, *, in_features: int = 0, num_classes: int = 0, vocab_size: int = 0
) -> nn.Module:
    """The network `cfg.model` names; the data module (or the sizes given) supplies input and output sizes."""
    sizes = datamodule or SimpleNamespace(in_features=in_features, num_classes=num_classes, vocab_size=vocab_size)
    return kinds.get(cfg.model.kind).build_network(cfg.model, sizes)
