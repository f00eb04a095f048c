"""Which tensors of a checkpoint are which projection role, layer by layer.

Roles are named as in the rest of geocont: q, k, v, o, gate, up, down. BERT-style encoders map onto the same
names: query -> q, key -> k, value -> v, attention output -> o, intermediate (the up-projection into the
activation) -> up, output -> down. Phi-3 stores q, k, v stacked along the rows of one qkv_proj, and gate, up in
one gate_up_proj (gate first, as Phi3MLP's chunk(2) reads it); they are split by rows using config.json.

GGUF files (llama.cpp's names, blk.N.attn_q.weight ...) have their own layouts, looked up by the metadata's
general.architecture: Mistral converts to llama; Phi-3 keeps q, k, v fused in attn_qkv and gate, up in ffn_up.

Any other layout: `--map ROLE=REGEX` (repeatable), a regex that fully matches the tensor names of that role with
one group capturing the layer index, e.g. `--map 'q=transformer\\.h\\.(\\d+)\\.attn\\.q\\.weight'`. Matrices are read
in PyTorch's (out x in) orientation: v1 lives in the input space, u1 in the output space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from geocont.analyze.checkpoint import dtype_problem
from geocont.analyze.tensors import Checkpoint, TensorInfo, capped
from geocont.config import ROLES, ConfigError


@dataclass(frozen=True)
class Layout:
    """How one family of checkpoints names its per-layer projection weights."""

    prefix: str  # regex for the start of a name; its one group is the layer index
    roles: dict[str, str]  # role -> rest of the tensor name
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)  # rest of name -> roles stacked along rows


# Text decoders under any wrapper (model., language_model.model., model.language_model.); a vision tower's
# encoder.layers never matches.
_DECODER = r"(?:[\w.]*language_model\.)?(?:model\.)?layers\.(\d+)\."
LLAMA = Layout(
    _DECODER,
    {
        "q": "self_attn.q_proj.weight",
        "k": "self_attn.k_proj.weight",
        "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight",
        "gate": "mlp.gate_proj.weight",
        "up": "mlp.up_proj.weight",
        "down": "mlp.down_proj.weight",
    },
)
PHI3 = Layout(
    _DECODER,
    {"o": "self_attn.o_proj.weight", "down": "mlp.down_proj.weight"},
    fused={"self_attn.qkv_proj.weight": ("q", "k", "v"), "mlp.gate_up_proj.weight": ("gate", "up")},
)
BERT = Layout(
    r"(?:\w+\.)?encoder\.layer\.(\d+)\.",
    {
        "q": "attention.self.query.weight",
        "k": "attention.self.key.weight",
        "v": "attention.self.value.weight",
        "o": "attention.output.dense.weight",
        "up": "intermediate.dense.weight",
        "down": "output.dense.weight",
    },
)
ARCHITECTURES: dict[str, Layout] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA,
    "gemma": LLAMA,
    "gemma2": LLAMA,
    "gemma3": LLAMA,
    "gemma3_text": LLAMA,
    "phi3": PHI3,
    "bert": BERT,
    "roberta": BERT,
    "xlm-roberta": BERT,
}
SUPPORTED = ", ".join(sorted(ARCHITECTURES))

# llama.cpp's tensor names (gguf.constants.TENSOR_NAMES), keyed by general.architecture
_BLOCK = r"blk\.(\d+)\."
GGUF_DECODER = Layout(
    _BLOCK,
    {
        "q": "attn_q.weight",
        "k": "attn_k.weight",
        "v": "attn_v.weight",
        "o": "attn_output.weight",
        "gate": "ffn_gate.weight",
        "up": "ffn_up.weight",
        "down": "ffn_down.weight",
    },
)
GGUF_PHI3 = Layout(
    _BLOCK,
    {"o": "attn_output.weight", "down": "ffn_down.weight"},
    fused={"attn_qkv.weight": ("q", "k", "v"), "ffn_up.weight": ("gate", "up")},
)
GGUF_BERT = Layout(_BLOCK, {r: n for r, n in GGUF_DECODER.roles.items() if r != "gate"})
GGUF_ARCHITECTURES: dict[str, Layout] = {
    "llama": GGUF_DECODER,  # also Mistral: llama.cpp converts it to llama
    "qwen2": GGUF_DECODER,
    "qwen3": GGUF_DECODER,
    "gemma": GGUF_DECODER,
    "gemma2": GGUF_DECODER,
    "gemma3": GGUF_DECODER,
    "phi3": GGUF_PHI3,
    "bert": GGUF_BERT,
}
GGUF_SUPPORTED = ", ".join(sorted(GGUF_ARCHITECTURES))


@dataclass(frozen=True)
class Slot:
    """One role's matrix in one layer: where it is and which rows of the stored tensor it is."""

    layer: int
    name: str
    info: TensorInfo
    rows: tuple[int, int] | None
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """Stored bytes read for this matrix (quantized GGUF data is smaller than the float32 it becomes)."""
        return self.shape[0] * self.info.row_bytes


@dataclass(frozen=True)
class Plan:
    architecture: str
    roles: dict[str, list[Slot]]  # role -> slots in layer order


def plan(ckpt: Checkpoint, roles: list[str] | None = None, role_map: list[str] | None = None) -> Plan:
    """Every matrix to analyse, validated (layers, shapes, dtypes) before any is read; ConfigError otherwise."""
    cfg = _text_config(ckpt.config)
    if role_map:
        arch, found = "custom (--map)", _match_map(ckpt, _parse_map(role_map))
    else:
        arch, layout = _architecture(ckpt)
        found = _match_layout(ckpt, layout, cfg)
    order = [r for r in ROLES if r in found] + [r for r in found if r not in ROLES]
    if roles:
        unknown = [r for r in roles if r not in found]
        if unknown:
            raise ConfigError([f"--roles: unknown role {r!r}; this checkpoint has {', '.join(order)}" for r in unknown])
        order = [r for r in order if r in roles]
    found = {r: found[r] for r in order}
    problems = _check(found, cfg, layers=None if role_map else cfg.get("num_hidden_layers"))
    if problems:
        raise ConfigError(capped(problems))
    return Plan(architecture=arch, roles=found)


def parse_roles(text: str | None) -> list[str] | None:
    """`--roles q,k,gate` -> ["q", "k", "gate"]; None or empty -> all roles."""
    if not text:
        return None
    return [r.strip() for r in text.split(",") if r.strip()] or None


def _text_config(config: dict | None) -> dict:
    """A multimodal config (Gemma 3) keeps the language model's sizes in text_config."""
    config = config or {}
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


HINT = f"supported: {SUPPORTED}; for anything else pass --map ROLE=REGEX"


def check_supported(config: dict | None, path) -> None:
    """ConfigError unless config.json names a supported model_type (no config: decided later from tensor names)."""
    if config is not None and config.get("model_type") not in ARCHITECTURES:
        raise ConfigError([f"{path}: model_type {config.get('model_type')!r} is not supported ({HINT})"])


def _architecture(ckpt: Checkpoint) -> tuple[str, Layout]:
    if ckpt.format == "gguf":
        return _gguf_architecture(ckpt)
    if ckpt.config is None:  # a bare .safetensors file: recognise the naming itself
        for name, layout in (("llama-style (guessed from names)", LLAMA), ("bert-style (guessed from names)", BERT)):
            if any(
                re.fullmatch(layout.prefix + re.escape(rest), t) for t in ckpt.tensors for rest in layout.roles.values()
            ):
                return name, layout
        raise ConfigError([f"{ckpt.source}: no config.json and no known tensor naming ({HINT})"])
    check_supported(ckpt.config, ckpt.root / "config.json")
    return ckpt.config["model_type"], ARCHITECTURES[ckpt.config["model_type"]]


def _gguf_architecture(ckpt: Checkpoint) -> tuple[str, Layout]:
    from geocont.analyze.gguf_file import missing_metadata

    arch, file = ckpt.config.get("model_type"), ckpt.config["gguf_file"]
    if arch is None:
        raise ConfigError([f"{file}: GGUF metadata general.architecture is missing (GGUF: {GGUF_SUPPORTED}; or --map)"])
    if arch not in GGUF_ARCHITECTURES:
        raise ConfigError(
            [f"{file}: GGUF architecture {arch!r} is not supported (GGUF: {GGUF_SUPPORTED}; for anything else --map)"]
        )
    problems = missing_metadata(ckpt.config)
    if problems:
        raise ConfigError(problems)
    return f"{arch} (GGUF)", GGUF_ARCHITECTURES[arch]


def _parse_map(entries: list[str]) -> dict[str, re.Pattern]:
    patterns: dict[str, re.Pattern] = {}
    problems: list[str] = []
    for entry in entries:
        role, sep, regex = entry.partition("=")
        role = role.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][\w-]*", role):
            problems.append(
                f"--map {entry!r}: expected ROLE=REGEX, e.g. 'q=model\\.layers\\.(\\d+)\\.attn\\.q\\.weight'"
            )
            continue
        try:
            pattern = re.compile(regex)
        except re.error as err:
            problems.append(f"--map {entry!r}: invalid regex ({err})")
            continue
        if pattern.groups != 1:
            problems.append(
                f"--map {entry!r}: the regex needs exactly one group (the layer index), has {pattern.groups}"
            )
        elif role in patterns:
            problems.append(f"--map {entry!r}: role {role!r} is mapped twice")
        else:
            patterns[role] = pattern
    if problems:
        raise ConfigError(problems)
    return patterns


def _match_map(ckpt: Checkpoint, patterns: dict[str, re.Pattern]) -> dict[str, list[Slot]]:
    found: dict[str, list[Slot]] = {}
    problems: list[str] = []
    for role, pattern in patterns.items():
        for name, info in ckpt.tensors.items():
            m = pattern.fullmatch(name)
            if m is None:
                continue
            if not m.group(1) or not m.group(1).isdigit():
                problems.append(
                    f"--map {role}: group of {pattern.pattern!r} captured {m.group(1)!r} in {name}, not a layer number"
                )
                continue
            found.setdefault(role, []).append(_slot(int(m.group(1)), name, info, None))
        if role not in found:
            problems.append(f"--map {role}={pattern.pattern}: matches no tensor in {ckpt.source}")
    if problems:
        raise ConfigError(capped(problems))
    return found


def _match_layout(ckpt: Checkpoint, layout: Layout, cfg: dict) -> dict[str, list[Slot]]:
    plain = {rest: role for role, rest in layout.roles.items()}
    head = re.compile(layout.prefix + r"(.+)")
    found: dict[str, list[Slot]] = {}
    for name, info in ckpt.tensors.items():
        m = head.fullmatch(name)
        if m is None:
            continue
        layer, rest = int(m.group(1)), m.group(2)
        if rest in plain:
            found.setdefault(plain[rest], []).append(_slot(layer, name, info, None))
        elif rest in layout.fused:
            parts = layout.fused[rest]
            start = 0
            for role, size in zip(parts, _fused_sizes(name, info, parts, cfg)):
                found.setdefault(role, []).append(_slot(layer, name, info, (start, start + size)))
                start += size
    missing = [r for r in [*layout.roles, *(r for parts in layout.fused.values() for r in parts)] if r not in found]
    if missing:
        raise ConfigError(
            [
                f"{ckpt.source}: no tensor for role {r} (looked for names like {_example(layout)}{_rest_of(layout, r)})"
                for r in missing
            ]
        )
    return found


def _example(layout: Layout) -> str:
    return "blk.N." if layout.prefix == _BLOCK else "layers.N."


def _rest_of(layout: Layout, role: str) -> str:
    return layout.roles.get(role) or next(rest for rest, parts in layout.fused.items() if role in parts)


def _fused_sizes(name: str, info: TensorInfo, parts: tuple[str, ...], cfg: dict) -> list[int]:
    """Row counts of the roles stacked in a fused tensor, from config.json (Phi-3 layout)."""
    rows = info.shape[0] if info.shape else 0
    if parts == ("gate", "up"):
        sizes = [rows // 2, rows // 2]
    else:
        H, Hkv, d = _heads(cfg)
        sizes = [H * d, Hkv * d, Hkv * d] if H and d else []
    if sum(sizes) != rows or len(info.shape) != 2:
        raise ConfigError(
            [
                f"{info.file}: {name} has shape {list(info.shape)}, which does not split into {'/'.join(parts)} "
                f"rows for {_origin(cfg)} (sizes {sizes or 'unknown'})"
            ]
        )
    return sizes


def _heads(cfg: dict) -> tuple[int | None, int | None, int | None]:
    H, D = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if not isinstance(H, int) or not isinstance(D, int):
        return None, None, None
    Hkv = cfg.get("num_key_value_heads") or H
    d = cfg.get("head_dim") or D // H
    return H, Hkv, d


def _slot(layer: int, name: str, info: TensorInfo, rows: tuple[int, int] | None) -> Slot:
    shape = info.shape if rows is None else (rows[1] - rows[0], *info.shape[1:])
    return Slot(layer=layer, name=name, info=info, rows=rows, shape=tuple(shape))


def _expected_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of each role implied by config.json; empty when the config lacks the sizes."""
    H, Hkv, d = _heads(cfg)
    D, F = cfg.get("hidden_size"), cfg.get("intermediate_size")
    if H is None:
        return {}
    shapes = {"q": (H * d, D), "k": (Hkv * d, D), "v": (Hkv * d, D), "o": (D, H * d)}
    if isinstance(F, int):
        shapes |= {"gate": (F, D), "up": (F, D), "down": (D, F)}
    return shapes


def _origin(cfg: dict) -> str:
    return "the GGUF metadata" if "gguf_file" in cfg else "config.json"


def _check(found: dict[str, list[Slot]], cfg: dict, layers: int | None) -> list[str]:
    """One line per problem: dtypes, 2-D shapes equal across layers and as config.json implies, layers 0..L-1."""
    problems: list[str] = []
    expected = _expected_shapes(cfg)
    for role, slots in found.items():
        slots.sort(key=lambda s: s.layer)
        first = slots[0]
        for s in slots:
            where = f"{s.info.file}: {s.name} ({role}, layer {s.layer})"
            if (problem := dtype_problem(s.info)) is not None:
                problems.append(f"{where}: {problem}")
            if len(s.shape) != 2:
                problems.append(f"{where}: expected a matrix, got shape {list(s.shape)}")
            elif role in expected and s.shape != expected[role]:
                problems.append(f"{where}: shape {list(s.shape)} but {_origin(cfg)} implies {list(expected[role])}")
            elif s.shape != first.shape:
                problems.append(
                    f"{where}: shape {list(s.shape)} differs from layer {first.layer}'s {list(first.shape)}"
                )
        indices = [s.layer for s in slots]
        start, count = (0, layers) if isinstance(layers, int) else (indices[0], len(indices))
        want = list(range(start, start + count))
        if indices != want:
            missing = sorted(set(want) - set(indices))
            extra = sorted((set(indices) - set(want)) | {i for i in indices if indices.count(i) > 1})
            problems.append(
                f"role {role}: layers {missing} missing, {extra} unexpected or repeated "
                f"(want {start}..{start + count - 1})"
            )
        if len(slots) < 2:
            problems.append(f"role {role}: only {len(slots)} layer, continuity needs two adjacent layers")
    return problems
