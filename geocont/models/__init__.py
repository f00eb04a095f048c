"""Model registry: build_model(cfg, ...) picks the class by `model.kind`."""

from __future__ import annotations

from torch import nn

from geocont.config import MLPConfig, RunConfig


def build_model(cfg: RunConfig, *, in_features: int = 0, num_classes: int = 0, vocab_size: int = 0) -> nn.Module:
    """The network a run config names; the data module supplies the input/output sizes."""
    if isinstance(cfg.model, MLPConfig):
        from geocont.models.mlp import ResidualMLP

        return ResidualMLP(cfg.model, in_features=in_features, num_classes=num_classes)
    from geocont.models.llama import Llama

    return Llama(cfg.model, vocab_size=vocab_size)
