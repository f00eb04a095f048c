"""GGUF checkpoints (llama.cpp, Ollama, LM Studio): find the file or split set, index metadata and tensors with the
gguf package's reader, and read one matrix at a time, dequantized by the same package.

A GGUF spec is a .gguf file, one file of a split set NAME-00001-of-0000N.gguf (every part is read), or a folder
holding one model (vision projectors, mmproj*.gguf, are skipped). The metadata stands in for config.json: the keys
{arch}.block_count, embedding_length, feed_forward_length, attention.head_count(_kv) and attention.key_length are
renamed to config.json's, so roles.py checks layer counts and shapes exactly as for safetensors.

Orientation: GGUF lists dimensions fastest first (ne0 = the input size); shapes here are reversed to PyTorch's
(out, in), which is also how a dequantized tensor comes out, since quantization blocks run along rows.

Memory: GGUFReader memory-maps the file but touches only the header; the index keeps plain numbers and the reader
is dropped. A matrix is one seek and read of its byte range into a buffer of its own, dequantized in groups of 16
rows (gguf.quants), so a read holds the stored bytes plus the float32 result, as a safetensors read holds its copy.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np

from geocont.analyze.tensors import Checkpoint, TensorInfo, capped
from geocont.config import ConfigError

MAGIC = b"GGUF"
SPLIT = re.compile(r"(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf")
METADATA = {  # config.json key -> GGUF metadata key after "{arch}."
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
}
REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")  # llama.cpp needs them too
# The gguf package's reader raises these on a truncated or corrupt header (it parses with numpy views of the mmap).
_READ_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError, OSError)


def open_gguf(spec: str, path: Path) -> Checkpoint:
    """Index every tensor of the GGUF model at `path` (file, split part or folder); ConfigError if unusable."""
    files = _model_files(spec, path)
    config: dict = {}
    tensors: dict[str, TensorInfo] = {}
    problems: list[str] = []
    for i, file in enumerate(files):
        fields, infos = _read_header(file)
        if i == 0:  # gguf-split keeps the model's metadata in the first part
            config = _config(fields, file)
        for name, info in infos.items():
            if name in tensors:
                problems.append(f"{file}: tensor {name} is also in {tensors[name].file.name}")
            tensors[name] = info
    if problems:
        raise ConfigError(capped(problems))
    return Checkpoint(source=spec, root=files[0].parent, config=config, tensors=tensors, format="gguf")


def missing_metadata(config: dict) -> list[str]:
    """One line per metadata key that a supported architecture needs and the file lacks."""
    arch, file = config.get("model_type"), config.get("gguf_file")
    return [
        f"{file}: GGUF metadata {arch}.{METADATA[key]} is missing (needed for the layer count and shapes)"
        for key in REQUIRED
        if key not in config
    ]


def dequantize_problem(dtype: str) -> str | None:
    """None when the gguf package can dequantize this type, else a line naming the types it can."""
    if dtype in dequantizable():
        return None
    return f"GGUF type {dtype} cannot be dequantized by the gguf package (it can: {', '.join(dequantizable())})"


@cache
def dequantizable() -> tuple[str, ...]:
    """The types the installed gguf package dequantizes, found by dequantizing one block of zeros of each: its
    list grows release by release, and asking it keeps this module from lagging behind."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    names = []
    for qtype in GGMLQuantizationType:
        if qtype not in GGML_QUANT_SIZES:
            continue
        try:
            dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
        except (NotImplementedError, ValueError, TypeError, AssertionError):
            continue
        names.append(qtype.name)
    return tuple(names)


def read_rows(info: TensorInfo, rows: tuple[int, int] | None) -> np.ndarray:
    """Rows [lo, hi) of a GGUF matrix (all rows when None), dequantized to a float32 (rows, cols) array."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    lo, hi = rows or (0, info.shape[0])
    buf = np.empty((hi - lo, info.row_bytes), dtype=np.uint8)
    view, got = memoryview(buf).cast("B"), 0
    with open(info.file, "rb", buffering=0) as f:
        f.seek(info.offset + lo * info.row_bytes)
        while got < len(view) and (n := f.readinto(view[got:])):
            got += n
    if got < len(view):  # the header was read at validation; the file has been cut since
        raise ConfigError([f"{info.file}: the file ends inside a tensor's data (truncated?)"])
    return dequantize(buf, GGMLQuantizationType[info.dtype]).reshape(hi - lo, info.shape[1])


def _model_files(spec: str, path: Path) -> list[Path]:
    """The files of one GGUF model: [path], every part of its split set, or the one model in a folder."""
    if path.is_dir():
        models = sorted({_first_part(f) for f in path.glob("*.gguf") if not f.name.startswith("mmproj")})
        if len(models) != 1:
            names = ", ".join(m.name for m in models) or "none"
            raise ConfigError([f"{spec}: a folder must hold one GGUF model, found {len(models)} ({names}); pass one"])
        path = models[0]
    if not path.is_file():
        raise ConfigError([f"{spec}: no such file"])
    m = SPLIT.fullmatch(path.name)
    if m is None:
        return [path]
    count = int(m["count"])
    parts = [path.with_name(f"{m['stem']}-{i:05d}-of-{m['count']}.gguf") for i in range(1, count + 1)]
    missing = [
        f"{p}: part {i:05d} of this {count}-part GGUF set is missing" for i, p in enumerate(parts, 1) if not p.is_file()
    ]
    if missing:
        raise ConfigError(capped(missing))
    return parts


def _first_part(file: Path) -> Path:
    m = SPLIT.fullmatch(file.name)
    return file if m is None else file.with_name(f"{m['stem']}-00001-of-{m['count']}.gguf")


def _read_header(file: Path) -> tuple[dict, dict[str, TensorInfo]]:
    """Metadata (key -> Python value) and tensor index of one GGUF file, from its header only."""
    from gguf import GGUFReader

    with open(file, "rb") as f:
        magic = f.read(4)
    if magic != MAGIC:
        raise ConfigError([f"{file}: not a GGUF file (starts with {magic!r}; GGUF files start with {MAGIC!r})"])
    try:
        reader = GGUFReader(file)
        fields = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("tokenizer.")}
        tensors = {
            t.name: TensorInfo(
                file,
                tuple(int(d) for d in reversed(t.shape.tolist())),
                t.tensor_type.name,
                int(t.data_offset),
                t.n_bytes,
            )
            for t in reader.tensors
        }
    except _READ_ERRORS as err:
        raise ConfigError([f"{file}: not a readable GGUF file (truncated or corrupt?): {err}"]) from None
    del reader  # closes the memory map: only the plain index above is kept
    return fields, tensors


def _config(fields: dict, file: Path) -> dict:
    """config.json's keys from the GGUF metadata (those present), and the file they came from (for messages)."""
    arch = fields.get("general.architecture")
    config = {"model_type": arch, "gguf_file": str(file)}
    for key, suffix in METADATA.items():
        value = fields.get(f"{arch}.{suffix}")
        if isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]  # a per-layer array holding one value
        if isinstance(value, int) and not isinstance(value, bool):
            config[key] = value
    return config
