"""Llama-style decoder: token embedding -> pre-norm blocks (RoPE attention, gated MLP) -> norm -> LM head.

One readable file in the order data flows. The ablation switches of the paper's transformer table are
config names: the MLP activation (silu | relu | gelu | none, where none leaves the bilinear product
gate(x) * up(x)), residual on/off, and RMSNorm on/off (off replaces every norm, the final one too).

Every projection is its own bias-free Linear, so `weight_groups()` hands the metrics one matrix per
layer and role: q, k, v, o (attention) and gate, up, down (MLP), PyTorch orientation (out x in).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from geocont.kinds.transformer import ROLES, TransformerConfig
from geocont.models.layers import make_activation, make_norm

DEFAULT_INIT_STD = 0.02  # GPT-2 / Llama reference init
ROPE_BASE = 10000.0


class RotaryEmbedding(nn.Module):
    """cos/sin tables for rotary position embeddings, grown on demand and cached as fp32 buffers."""

    def __init__(self, head_dim: int, base: float = ROPE_BASE):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self.register_buffer("cos", torch.empty(0, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(0, head_dim), persistent=False)

    def forward(self, T: int) -> tuple[Tensor, Tensor]:
        # Rebuilt in fp32 when too short, or after a cast (bf16 angles would blur far positions).
        if self.cos.shape[0] < T or self.cos.dtype != torch.float32:
            device = self.cos.device
            inv_freq = self.base ** (-torch.arange(0, self.head_dim, 2, device=device) / self.head_dim)  # (hd/2,)
            angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)  # (T, hd/2)
            angles = torch.cat([angles, angles], dim=-1)  # (T, hd): the two halves share a frequency
            self.cos, self.sin = angles.cos(), angles.sin()
        return self.cos[:T], self.sin[:T]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each (i, i + hd/2) pair of x (B, H, T, hd) by angle t * freq_i (the rotate-half layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    """Causal self-attention with RoPE; kv_heads < heads shares each K/V head across a group of queries."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.head_dim = cfg.width // cfg.heads
        self.q = nn.Linear(cfg.width, cfg.heads * self.head_dim, bias=False)
        self.k = nn.Linear(cfg.width, cfg.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(cfg.width, cfg.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(cfg.heads * self.head_dim, cfg.width, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        v = self.v(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.o(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with act = silu; act = none leaves the plain product."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.width, cfg.mlp_width, bias=False)
        self.up = nn.Linear(cfg.width, cfg.mlp_width, bias=False)
        self.down = nn.Linear(cfg.mlp_width, cfg.width, bias=False)
        self.act = make_activation(cfg.activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm block: h + attn(norm(h)), then h + mlp(norm(h)); without residuals each sublayer replaces h."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.residual = cfg.residual
        self.attn_norm = make_norm(cfg.norm, cfg.width)
        self.attn = Attention(cfg)
        self.mlp_norm = make_norm(cfg.norm, cfg.width)
        self.mlp = GatedMLP(cfg)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        a = self.attn(self.attn_norm(h), cos, sin)
        h = h + a if self.residual else a
        m = self.mlp(self.mlp_norm(h))
        return h + m if self.residual else m


class Llama(nn.Module):
    """Decoder-only LM: idx (B, T) -> logits (B, T, vocab). Untied embedding and head, as in Llama."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int):
        super().__init__()
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.cfg = cfg
        self.embed = nn.Embedding(vocab_size, cfg.width)
        self.rope = RotaryEmbedding(cfg.width // cfg.heads)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = make_norm(cfg.norm, cfg.width)
        self.head = nn.Linear(cfg.width, vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """normal(0, init_std) for every block projection (0.02 when unset); embedding and head at 0.02.

        The embedding and head stay at the reference scale so that `init_std` varies only the matrices
        whose continuity is measured. Norm gains start at one (their own init).
        """
        std = self.cfg.init_std or DEFAULT_INIT_STD
        for weights in self.weight_groups().values():
            for w in weights:
                nn.init.normal_(w, mean=0.0, std=std)
        nn.init.normal_(self.embed.weight, mean=0.0, std=DEFAULT_INIT_STD)
        nn.init.normal_(self.head.weight, mean=0.0, std=DEFAULT_INIT_STD)

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        cos, sin = self.rope(T)  # (T, hd) each
        h = self.embed(idx)  # (B, T, C)
        for block in self.blocks:
            h = block(h, cos, sin)
        return self.head(self.norm(h))  # (B, T, vocab)

    def weight_groups(self) -> dict[str, list[nn.Parameter]]:
        """Role -> that role's weight in every layer, depth order: q, k, v, o, gate, up, down."""
        groups: dict[str, list[nn.Parameter]] = {role: [] for role in ROLES}
        for block in self.blocks:
            for role in ("q", "k", "v", "o"):
                groups[role].append(getattr(block.attn, role).weight)
            for role in ("gate", "up", "down"):
                groups[role].append(getattr(block.mlp, role).weight)
        return groups

    def num_parameters(self, embeddings: bool = True) -> int:
        """Trainable parameter count; embeddings=False leaves out the token embedding and LM head."""
        skip = set() if embeddings else {id(self.embed.weight), id(self.head.weight)}
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)


def build(cfg: TransformerConfig, data: Any) -> Llama:
    """The kind's network builder (geocont.kinds.transformer): the vocabulary from the data module."""
    return Llama(cfg, vocab_size=data.vocab_size)
