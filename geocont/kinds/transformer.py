"""The Llama-style decoder: its `model:` section, its weight roles and its ModelKind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import model_validator

from geocont.fields import Depth, ModelSection, PositiveFloat, PositiveInt
from geocont.kinds.base import ModelKind, Section, lines

if TYPE_CHECKING:
    from geocont.config import RunConfig

# The projection roles of a transformer block, in the order tables list them; metric names use them
# (`weight/q/v1_continuity`), as do checkpoint analysis, reports and dashboards.
ROLES = ("q", "k", "v", "o", "gate", "up", "down")
LMActivation = Literal["silu", "relu", "gelu", "none"]
BYTE_VOCAB = 256


class TransformerConfig(ModelSection):
    """Llama-style decoder: RMSNorm pre-norm blocks, RoPE attention, gated MLP."""

    kind: Literal["transformer"] = "transformer"
    depth: Depth = 8
    width: PositiveInt = 512
    heads: PositiveInt = 8
    kv_heads: PositiveInt = 8
    mlp_width: PositiveInt = 1376
    activation: LMActivation = "silu"
    residual: bool = True
    norm: Literal["rmsnorm", "none"] = "rmsnorm"
    init_std: PositiveFloat | None = None

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerConfig:
        if self.width % self.heads:
            raise ValueError(f"model.width ({self.width}) must be divisible by model.heads ({self.heads})")
        if (self.width // self.heads) % 2:
            raise ValueError(f"model.width / model.heads must be even for RoPE, got {self.width // self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model.heads ({self.heads}) must be divisible by model.kv_heads ({self.kv_heads})")
        return self


def parameters(cfg: RunConfig) -> int:
    """Attention projections and gated MLP per block, plus the embedding and the head."""
    m = cfg.model
    vocab = cfg.data.vocab_size if cfg.data.tokenizer == "bpe" else BYTE_VOCAB
    block = 4 * m.width * m.width + 3 * m.width * m.mlp_width
    return m.depth * block + 2 * vocab * m.width


def _per_role(template: str) -> tuple[str, ...]:
    return tuple(template.format(role=r) for r in ROLES)


TRANSFORMER = ModelKind(
    name="transformer",
    config=TransformerConfig,
    data=("stdlib", "text", "wikitext103"),
    network="geocont.models.llama:build",
    lightning="geocont.lit.module:LanguageModel",
    parameters=parameters,
    roles=ROLES,
    x_axis="step",
    dashboard=(
        Section("Per-projection continuity, input space (v1)", lines(*_per_role("weight/{role}/v1_continuity")), 4),
        Section("Per-projection continuity, output space (u1)", lines(*_per_role("weight/{role}/u1_continuity")), 4),
        Section(
            "Per-projection Delta_GW", lines(*_per_role("delta_gw/{role}/v1"), *_per_role("delta_gw/{role}/u1")), 4
        ),
        Section("Update ratio per projection", lines("update_ratio", *_per_role("update_ratio/{role}")), 4),
        Section("Perplexity and loss", lines("val/ppl", "val/loss", "train/loss")),
    ),  # fmt: skip
    # Per-role gradient curves would be 42 panels: Delta_GW is one role x space heatmap instead.
    report=("role_continuity", "projection_heatmap", "delta_heatmap", "training"),
    paper_table="transformer",
    norm_labels={"rmsnorm": "Norm", "none": "NoNorm"},
    role_note="Q, K, Gate and Up read the residual stream into a nonlinearity (v1); O and Down write into it (u1); "
    "V has neither.",
)
