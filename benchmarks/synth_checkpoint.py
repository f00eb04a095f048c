"""Write a synthetic Llama-shaped checkpoint (bf16 safetensors shards + index + config.json) for bench_analyze.py.

Weights are N(0, 0.02^2). With `planted`, each projection also gets a rank-one spike theta * u v^T whose strength
grows with depth from 1.2x to 3x the BBP threshold theta_c = sigma * (m n)^(1/4) (where a spike starts to stand
out of the noise): early layers have s1/s2 barely above 1 (flagged), later ones clear gaps (up to ~2), as in trained
models. q, k, gate, up share one v across layers (input-space continuity), o, down share one u (output space), v
gets fresh directions per layer (chance level) -- the paper's pattern, with a known answer.

    python benchmarks/synth_checkpoint.py 1b /tmp/llama-1b [--planted]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from geocont.analyze.roles import LLAMA  # the Hugging Face names of a Llama layer's projections

SIGMA = 0.02
SHARD_BYTES = 2 * 1024**3
INPUT_SHARED = ("q", "k", "gate", "up")
OUTPUT_SHARED = ("o", "down")


@dataclass(frozen=True)
class Shapes:
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int

    def projections(self) -> dict[str, tuple[int, int]]:
        d = self.hidden_size // self.num_attention_heads
        kv = self.num_key_value_heads * d
        h, f = self.hidden_size, self.intermediate_size
        return {"q": (h, h), "k": (kv, h), "v": (kv, h), "o": (h, h), "gate": (f, h), "up": (f, h), "down": (h, f)}

    def projection_bytes(self) -> int:
        return 2 * self.num_hidden_layers * sum(m * n for m, n in self.projections().values())

    def total_bytes(self) -> int:
        return self.projection_bytes() + 2 * 2 * self.vocab_size * self.hidden_size


SHAPES = {
    "8b": Shapes(32, 4096, 14336, 32, 8, 128256),  # Llama-3.1-8B
    "1b": Shapes(16, 2048, 8192, 32, 8, 32000),  # Llama-3.2-1B's layers, a 32000 vocab
    "tiny": Shapes(4, 256, 512, 8, 2, 1000),
}


def spike_strength(layer: int, layers: int, m: int, n: int) -> float:
    """1.2x .. 3x the BBP threshold, increasing with depth."""
    return (1.2 + 1.8 * layer / max(1, layers - 1)) * SIGMA * (m * n) ** 0.25


def layer_tensors(shapes: Shapes, layer: int, shared: dict, planted: bool, gen: torch.Generator) -> dict:
    tensors = {f"model.layers.{layer}.input_layernorm.weight": torch.ones(shapes.hidden_size, dtype=torch.bfloat16)}
    for role, (m, n) in shapes.projections().items():
        W = torch.randn(m, n, generator=gen).mul_(SIGMA)
        if planted:
            u = shared[role][0] if role in OUTPUT_SHARED else unit(m, gen)
            v = shared[role][1] if role in INPUT_SHARED else unit(n, gen)
            W.addr_(u, v, alpha=spike_strength(layer, shapes.num_hidden_layers, m, n))
        tensors[f"model.layers.{layer}.{LLAMA.roles[role]}"] = W.to(torch.bfloat16)
    return tensors


def unit(d: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(d, generator=gen)
    return x / x.norm()


def write_checkpoint(folder: Path, shapes: Shapes, planted: bool = False, seed: int = 0) -> Path:
    """The embeddings in one shard, then shards of about SHARD_BYTES of layers, written one at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    shared = {role: (unit(m, gen), unit(n, gen)) for role, (m, n) in shapes.projections().items()}
    L = shapes.num_hidden_layers
    per_shard = max(1, SHARD_BYTES // (shapes.projection_bytes() // L))
    chunks = [range(i, min(i + per_shard, L)) for i in range(0, L, per_shard)]
    weight_map = {}
    for i in range(len(chunks) + 1):
        name = f"model-{i + 1:05d}-of-{len(chunks) + 1:05d}.safetensors"
        if i == 0:  # not analysed, but part of the files a real checkpoint has
            V, D = shapes.vocab_size, shapes.hidden_size
            tensors = {
                "model.embed_tokens.weight": torch.zeros(V, D, dtype=torch.bfloat16),
                "lm_head.weight": torch.zeros(V, D, dtype=torch.bfloat16),
                "model.norm.weight": torch.ones(D, dtype=torch.bfloat16),
            }
        else:
            tensors = {}
            for layer in chunks[i - 1]:
                tensors |= layer_tensors(shapes, layer, shared, planted, gen)
        save_file(tensors, folder / name, metadata={"format": "pt"})
        weight_map |= {t: name for t in tensors}
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", **asdict(shapes)}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--planted", action="store_true")
    args = parser.parse_args()
    shapes = SHAPES[args.shape]
    start = time.perf_counter()
    write_checkpoint(args.folder, shapes, planted=args.planted)
    gib = shapes.total_bytes() / 1024**3
    print(f"wrote {args.folder} ({gib:.1f} GiB) in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
