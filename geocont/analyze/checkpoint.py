"""Locate a checkpoint's files, validate them from their headers, and read one matrix at a time.

A checkpoint is a Hugging Face model folder (config.json + model.safetensors, or shards listed in
model.safetensors.index.json), a single .safetensors file (config.json beside it is used when present), a hub id
(downloaded with huggingface_hub; only config.json and the safetensors files), or a GGUF file, split set or folder
holding one (gguf_file.py: llama.cpp's format, read and dequantized with the gguf package).

Validation reads headers only (safe_open parses the header and checks that the data section covers the file), so
a truncated file, a shard missing from the folder or a tensor missing from its shard fails before any work starts.
Reading opens the file for one tensor and closes it again: safetensors returns tensors backed by a memory map, so
the file's pages stay resident (and count in RSS) only while that one tensor is alive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError, safe_open

from geocont.analyze.gguf_file import dequantize_problem, open_gguf, read_rows
from geocont.analyze.tensors import ITEMSIZE, Checkpoint, TensorInfo, capped
from geocont.config import ConfigError

INDEX = "model.safetensors.index.json"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def open_checkpoint(spec: str, check_config: Callable[[dict | None, Path], None] | None = None) -> Checkpoint:
    """Resolve `spec` (folder, file or hub id) and index every tensor from the headers; ConfigError if unusable.

    `check_config(config, path)` may reject the config.json of a hub model before its weights are downloaded.
    """
    path = Path(spec).expanduser()
    if not path.exists():
        if spec.startswith((".", "/", "~")) or spec.endswith((".gguf", ".safetensors")) or not _HUB_ID.fullmatch(spec):
            raise ConfigError([f"{spec}: no such file or folder"])
        path = _download(spec, check_config)
    if path.suffix == ".gguf" or (path.is_dir() and _gguf_only(path)):
        return open_gguf(spec, path)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ConfigError([f"{spec}: a file must be a .safetensors or .gguf file (or pass the model folder)"])
        root, files = path.parent, [path]
    else:
        root, files = path, _folder_files(spec, path)
    config = _read_config(root / "config.json")
    tensors: dict[str, TensorInfo] = {}
    problems: list[str] = []
    for file in files:
        for name, info in _read_header(file).items():
            if name in tensors:
                problems.append(f"{file}: tensor {name} is also in {tensors[name].file.name}")
            tensors[name] = info
    if problems:
        raise ConfigError(capped(problems))
    _check_index(root, tensors)
    return Checkpoint(source=spec, root=root, config=config, tensors=tensors)


def _gguf_only(folder: Path) -> bool:
    """A folder of GGUF files and no safetensors (a Hugging Face folder with both is read as safetensors)."""
    return any(folder.glob("*.gguf")) and not any(folder.glob("*.safetensors")) and not (folder / INDEX).exists()


def _download(repo_id: str, check_config: Callable[[dict | None, Path], None] | None) -> Path:
    """Fetch config.json, check it, then the safetensors files of a hub model (or find them in the hub cache)."""
    from huggingface_hub import snapshot_download

    def fetch(patterns: list[str]) -> Path:
        try:
            return Path(snapshot_download(repo_id, allow_patterns=patterns))
        except Exception as err:  # offline, unknown repo, gated: all the same to the user
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                [f"{repo_id}: not a local file or folder, and fetching it from the Hugging Face hub failed: {reason}"]
            ) from None

    if check_config is not None:  # an unsupported model fails before gigabytes of weights are fetched
        config = fetch(["config.json"]) / "config.json"
        check_config(_read_config(config), config)
    return fetch(["config.json", "*.safetensors", INDEX])


def _folder_files(spec: str, folder: Path) -> list[Path]:
    """The shards named by the index when there is one, else every .safetensors file in the folder."""
    index = folder / INDEX
    if index.exists():
        weight_map = _read_index(index)
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ConfigError([f"{folder / s}: shard listed in {INDEX} is missing" for s in missing])
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError([f"{spec}: no .safetensors or .gguf files in this folder (and no {INDEX})"])
    return files


def _read_index(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError([f"{index}: not a safetensors index with a weight_map ({type(err).__name__})"]) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError([f"{index}: weight_map must map tensor names to shard file names"])
    return weight_map


def _check_index(root: Path, tensors: dict[str, TensorInfo]) -> None:
    """Every tensor the index promises is in the shard it names."""
    index = root / INDEX
    if not index.exists():
        return
    wrong = [
        f"{root / shard}: tensor {name} listed in {INDEX} is not in this shard"
        for name, shard in _read_index(index).items()
        if name not in tensors or tensors[name].file.name != shard
    ]
    if wrong:
        raise ConfigError(capped(wrong))


def _read_config(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError([f"{path}: not valid JSON ({err})"]) from None
    if not isinstance(config, dict):
        raise ConfigError([f"{path}: must hold a JSON object"])
    return config


def _read_header(file: Path) -> dict[str, TensorInfo]:
    try:
        with safe_open(file, framework="pt") as f:
            return {
                name: TensorInfo(file, tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                for name in f.keys()
            }
    except (SafetensorError, OSError) as err:
        raise ConfigError([f"{file}: not a readable safetensors file (truncated or corrupt?): {err}"]) from None


def dtype_problem(info: TensorInfo) -> str | None:
    """Why a matrix of this stored type cannot be read (None: it can), naming the types that can."""
    if info.offset is not None:
        return dequantize_problem(info.dtype)
    return None if info.dtype in ITEMSIZE else f"dtype {info.dtype} is not supported (float: {', '.join(ITEMSIZE)})"


def read_matrix(info: TensorInfo, name: str, rows: tuple[int, int] | None, dtype):
    """One 2-D tensor (or a block of its rows, for fused projections) as an owned tensor of `dtype`.

    The mmap-backed tensor from safetensors is dropped on return, so only the upcast copy stays resident; GGUF data
    is read into a buffer of its own and dequantized (gguf_file.read_rows).
    """
    import torch

    if info.offset is not None:
        W = torch.from_numpy(read_rows(info, rows)).to(dtype)
    else:
        with safe_open(info.file, framework="pt") as f:
            raw = f.get_slice(name)[rows[0] : rows[1]] if rows else f.get_tensor(name)
            W = raw.to(dtype, copy=True)
        del raw
    if not torch.isfinite(W.sum()):  # one cheap pass; any NaN or inf makes the sum non-finite
        raise ConfigError([f"{info.file}: tensor {name} holds NaN or inf values (corrupt data?)"])
    return W
