"""Checkpoints for the `geocont analyze` tests, written offline: tiny transformers models of every supported
architecture, a checkpoint with planted structure whose answer is known, and helpers to break checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from geocont.config import ConfigError

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, vocab_size=64)
TINY_VISION = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14
)

# model_type -> (config class, model class, extra config); built lazily because transformers imports slowly
TRANSFORMERS_MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"num_key_value_heads": 1, "head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"num_key_value_heads": 2, "pad_token_id": 0}),
    "bert": ("BertConfig", "BertModel", {}),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", {"pad_token_id": 1}),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", {"pad_token_id": 1}),
}


def tiny_transformers_checkpoint(model_type: str, folder: Path, max_shard_size: str | None = None, seed: int = 0):
    """Save a randomly initialised tiny model of `model_type` with transformers; return the in-memory model."""
    import transformers

    torch.manual_seed(seed)
    if model_type == "gemma3":  # multimodal: a vision tower whose layers must not be mistaken for the decoder's
        config = transformers.Gemma3Config(
            text_config={**TINY, "num_key_value_heads": 2, "head_dim": 16},
            vision_config=TINY_VISION,
            mm_tokens_per_image=4,
        )
        model = transformers.Gemma3ForConditionalGeneration(config)
    else:
        config_cls, model_cls, extra = TRANSFORMERS_MODELS[model_type]
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**TINY, **extra))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return model


def reference_roles(model) -> dict[str, list[torch.Tensor]]:
    """Each role's per-layer weights taken from the model's modules (not from the files), Phi-3 split by hand."""
    if hasattr(model, "encoder") or hasattr(getattr(model, "roberta", None), "encoder"):
        encoder = model.encoder if hasattr(model, "encoder") else model.roberta.encoder
        parts = {
            "q": "attention.self.query",
            "k": "attention.self.key",
            "v": "attention.self.value",
            "o": "attention.output.dense",
            "up": "intermediate.dense",
            "down": "output.dense",
        }
        return {role: [layer.get_submodule(path).weight for layer in encoder.layer] for role, path in parts.items()}
    layers = model.get_decoder().layers
    cfg = model.config.get_text_config()
    if hasattr(layers[0].self_attn, "qkv_proj"):  # Phi-3: q, k, v stacked by rows; gate then up
        d = cfg.hidden_size // cfg.num_attention_heads
        q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
        qkv = [layer.self_attn.qkv_proj.weight for layer in layers]
        gate_up = [layer.mlp.gate_up_proj.weight for layer in layers]
        return {
            "q": [w[:q] for w in qkv],
            "k": [w[q : q + kv] for w in qkv],
            "v": [w[q + kv :] for w in qkv],
            "o": [layer.self_attn.o_proj.weight for layer in layers],
            "gate": [w[: w.shape[0] // 2] for w in gate_up],
            "up": [w[w.shape[0] // 2 :] for w in gate_up],
            "down": [layer.mlp.down_proj.weight for layer in layers],
        }
    paths = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj"}
    paths |= {"gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    return {role: [layer.get_submodule(path).weight for layer in layers] for role, path in paths.items()}


def llama_config(layers: int, hidden: int, inter: int, heads: int, kv_heads: int, vocab: int = 64) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
    }


def llama_shapes(hidden: int, inter: int, heads: int, kv_heads: int) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection of a Llama layer."""
    kv = kv_heads * hidden // heads
    return {
        "q": (hidden, hidden),
        "k": (kv, hidden),
        "v": (kv, hidden),
        "o": (hidden, hidden),
        "gate": (inter, hidden),
        "up": (inter, hidden),
        "down": (hidden, inter),
    }


LLAMA_NAMES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
SHARED_INPUT = ("q", "k", "gate", "up")  # planted: one v1 shared by all layers (the paper's input-space roles)
SHARED_OUTPUT = ("o", "down")  # planted: one u1 shared by all layers


def planted_matrix(shape: tuple[int, int], u: torch.Tensor, v: torch.Tensor, spike: float, gen: torch.Generator):
    """spike * u v^T on top of N(0, 1/max(m, n)) noise, whose top singular value is ~1 + sqrt(min/max)."""
    m, n = shape
    noise = torch.randn(m, n, generator=gen) / math.sqrt(max(m, n))
    return noise + spike * torch.outer(u, v)


def write_planted(
    folder: Path, layers: int = 4, hidden: int = 96, inter: int = 160, seed: int = 0, spike: float = 6.0
) -> Path:
    """A Llama-named checkpoint with a known answer.

    q, k, gate, up: every layer has the same leading right singular vector (v1 continuity ~1), its u1 random.
    o, down: the same leading left singular vector (u1 continuity ~1), v1 random. v: a spike with a random
    direction per layer on both sides (both near chance). Spikes of 6 over a noise edge of ~2 give s1/s2 ~ 3;
    smaller spikes give smaller gaps (3: s1/s2 ~ 1.6), where rounding the weights moves v1 further.
    """
    gen = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    shapes = llama_shapes(hidden, inter, heads=4, kv_heads=4)

    def unit(d: int) -> torch.Tensor:
        x = torch.randn(d, generator=gen)
        return x / x.norm()

    shared = {role: (unit(shape[0]), unit(shape[1])) for role, shape in shapes.items()}
    tensors = {}
    for layer in range(layers):
        for role, shape in shapes.items():
            u, v = unit(shape[0]), unit(shape[1])
            if role in SHARED_INPUT:
                v = shared[role][1]
            elif role in SHARED_OUTPUT:
                u = shared[role][0]
            W = planted_matrix(shape, u, v, spike=spike, gen=gen)
            tensors[f"model.layers.{layer}.{LLAMA_NAMES[role]}.weight"] = W.to(torch.bfloat16)
    tensors["model.embed_tokens.weight"] = torch.randn(64, hidden, generator=gen).to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(llama_config(layers, hidden, inter, heads=4, kv_heads=4)))
    return folder


def shard_by_layer(folder: Path) -> None:
    """Rewrite a one-file checkpoint as one shard per layer plus model.safetensors.index.json."""
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    groups: dict[str, dict] = {}
    for name, tensor in tensors.items():
        key = name.split(".")[2] if ".layers." in name else "rest"
        groups.setdefault(key, {})[name] = tensor
    weight_map = {}
    for i, (key, group) in enumerate(sorted(groups.items())):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, folder / shard)
        weight_map |= {name: shard for name in group}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


# ---------------------------------------------------------------------------------------------
# GGUF: HF-named tensors converted as llama.cpp's convert_hf_to_gguf.py converts them

GGUF_ARCH = {  # transformers model_type -> GGUF general.architecture
    "llama": "llama",
    "mistral": "llama",  # llama.cpp converts Mistral to llama (rows of q and k permuted as well)
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "bert": "bert",
}
ROTARY_PERMUTED = ("llama",)  # LlamaModel.modify_tensors permutes attn_q / attn_k; the others keep HF's order


def permute_rotary(W: torch.Tensor, heads: int) -> torch.Tensor:
    """convert_hf_to_gguf's LlamaModel.permute: within each head, the rows of the two rotary halves interleave."""
    return W.reshape(heads, 2, W.shape[0] // heads // 2, *W.shape[1:]).swapaxes(1, 2).reshape(W.shape)


def write_gguf(
    path: Path,
    arch: str,
    config: dict,
    tensors: dict[str, torch.Tensor],
    qtype: str = "F32",
    split_max_tensors: int = 0,
    skip_metadata: tuple[str, ...] = (),
) -> Path:
    """A GGUF file (or split set) of HF-named float tensors: llama.cpp's names (gguf's TensorNameMap), q/k rows
    permuted for llama, the per-layer matrices stored as `qtype` (quantized by the gguf package), the rest F32."""
    import gguf

    L, H = config["num_hidden_layers"], config["num_attention_heads"]
    Hkv = config.get("num_key_value_heads") or H
    name_map = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), L)
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    metadata = {
        "block_count": (writer.add_block_count, L),
        "embedding_length": (writer.add_embedding_length, config["hidden_size"]),
        "feed_forward_length": (writer.add_feed_forward_length, config["intermediate_size"]),
        "head_count": (writer.add_head_count, H),
        "head_count_kv": (writer.add_head_count_kv, Hkv),
        "key_length": (writer.add_key_length, config.get("head_dim")),
    }
    for key, (add, value) in metadata.items():
        if key not in skip_metadata and value is not None:
            add(value)
    quant = gguf.GGMLQuantizationType[qtype]
    for hf_name, tensor in tensors.items():
        base, _, suffix = hf_name.rpartition(".")
        name = name_map.get_name(base)
        if name is None:
            continue
        W = tensor.detach().float()
        if arch in ROTARY_PERMUTED and name.endswith((".attn_q", ".attn_k")):
            W = permute_rotary(W, H if name.endswith(".attn_q") else Hkv)
        data = W.numpy()
        if W.dim() == 2 and name.startswith("blk.") and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(f"{name}.{suffix}", gguf.quants.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(f"{name}.{suffix}", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def planted_gguf(path: Path, qtype: str = "F32", spike: float = 6.0, **kwargs) -> Path:
    """write_planted's checkpoint (Llama names, known answer) as a GGUF file, written beside a safetensors copy."""
    from safetensors.torch import load_file

    folder = write_planted(path.parent / f"{path.stem}-safetensors", spike=spike)
    config = json.loads((folder / "config.json").read_text())
    return write_gguf(path, "llama", config, load_file(folder / "model.safetensors"), qtype=qtype, **kwargs)


def assert_one_line_error(spec: Path, message: str) -> None:
    """`geocont analyze SPEC --out ... --format json` fails with one-line problems naming `message`, writing nothing."""
    from geocont.analyze import analyze_command

    out = spec.parent / "out.parquet"
    with pytest.raises(ConfigError) as err:
        analyze_command(str(spec), out=out, format="json")
    assert message in str(err.value)
    assert all("\n" not in line for line in err.value.problems) and len(err.value.problems) <= 11
    assert not out.exists()
