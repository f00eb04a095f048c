"""The residual MLP, the paper's toy model: its `model:` section and its ModelKind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from geocont.fields import Depth, ModelSection, PositiveFloat, PositiveInt
from geocont.kinds.base import ModelKind, Panel, Section, lines

if TYPE_CHECKING:
    from geocont.config import RunConfig

MLPActivation = Literal["relu", "gelu", "silu", "tanh", "none", "radial"]
MAX_IMAGE_FEATURES = 28 * 28  # MNIST's, the largest input of the image sets


class MLPConfig(ModelSection):
    """Residual MLP: input projection -> `depth` blocks of width `width` -> classifier head."""

    kind: Literal["mlp"] = "mlp"
    depth: Depth = 16
    width: PositiveInt = 256
    residual: bool = True
    activation: MLPActivation = "relu"
    norm: Literal["none", "layernorm", "rmsnorm"] = "none"
    init_std: PositiveFloat | None = None  # None: PyTorch's default init for the hidden blocks
    bias: bool = True


def parameters(cfg: RunConfig) -> int:
    """Hidden blocks plus input projection and head (an upper bound: the largest image set's inputs)."""
    m = cfg.model
    return m.depth * m.width * (m.width + 1) + m.width * (MAX_IMAGE_FEATURES + 11)


MLP = ModelKind(
    name="mlp",
    config=MLPConfig,
    data=("digits", "mnist"),
    network="geocont.models.mlp:build",
    lightning="geocont.lit.module:Classifier",
    parameters=parameters,
    x_axis="epoch",
    dashboard=(
        Section(
            "Weight continuity",
            lines(
                "weight/v1_continuity",
                "weight/u1_continuity",
                "weight/sigma2_continuity",
                "weight/sigma2_continuity_u",
                "weight/spectral_gap",
            ),
        ),
        Section(
            "Gradient coherence and Delta_GW",
            (
                *lines(
                    "grad_init/v1_continuity",
                    "grad_cum/v1_continuity",
                    "grad_cum/u1_continuity",
                    "delta_gw/v1",
                    "delta_gw/u1",
                ),
                Panel("delta_gw/v1", "bar"),
            ),
        ),
        Section("Update ratio", lines("update_ratio")),
        Section("Accuracy and loss", lines("val/acc", "val/loss", "train/loss")),
    ),  # fmt: skip
    report=("continuity", "gradient", "delta_bars", "training", "init_scale"),
    paper_table="mlp",
    norm_labels={"layernorm": "LN", "rmsnorm": "RMSNorm"},
    packed="geocont.models.packed:PackedMLP",
)
