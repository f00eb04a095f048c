"""MNIST from IDX files (a local folder), or through torchvision's downloader when it is installed.

The IDX format: a big-endian header (magic, dimension sizes) followed by raw uint8 data. Files may
be gzipped. The official 10k test split serves as the validation set, as in the paper's table.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import torch
from torch import Tensor

from geocont.config import ConfigError, DataConfig
from geocont.data.classification import InMemoryClassification, standardise

SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path) -> Tensor:
    """An IDX file (optionally .gz) as a uint8 tensor of the shape its header gives."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ConfigError([f"data.path: {path} is not an unsigned-byte IDX file (bad magic number)"])
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    expected = 1
    for d in shape:
        expected *= d
    if len(body) != expected:
        raise ConfigError([f"data.path: {path} is truncated: header says {expected} bytes of data, found {len(body)}"])
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


def find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz", folder / "MNIST" / "raw" / stem):
        if candidate.is_file():
            return candidate
    raise ConfigError([f"data.path: {folder} has no {stem}[.gz]; MNIST needs the four IDX files"])


def download_with_torchvision(root: Path) -> Path:
    try:
        from torchvision.datasets import MNIST
    except ImportError:
        raise ConfigError(
            ["data.path: not set and torchvision is not installed; point data.path at a folder of MNIST IDX files"]
        ) from None
    MNIST(str(root), train=True, download=True)
    MNIST(str(root), train=False, download=True)
    return root / "MNIST" / "raw"


class MNISTDataModule(InMemoryClassification):
    def __init__(self, data: DataConfig, batch_size: int, seed: int):
        super().__init__(batch_size, seed)
        self.path = Path(data.path).expanduser() if data.path else None

    def setup(self, stage: str | None = None) -> None:
        if self.x_train is not None:
            return
        folder = self.path or download_with_torchvision(Path.home() / ".cache" / "geocont" / "mnist")
        if not folder.is_dir():
            raise ConfigError([f"data.path: {folder} is not a folder"])
        (x_tr, y_tr), (x_va, y_va) = (self._split(folder, *SPLITS[s]) for s in ("train", "val"))
        self.x_train, self.x_val = standardise(x_tr, x_va)
        self.y_train, self.y_val = y_tr, y_va

    @staticmethod
    def _split(folder: Path, images: str, labels: str) -> tuple[Tensor, Tensor]:
        x = read_idx(find_idx(folder, images)).flatten(1).float() / 255.0  # (N, 784)
        y = read_idx(find_idx(folder, labels)).long()
        if len(x) != len(y):
            raise ConfigError([f"data.path: {images} has {len(x)} images but {labels} has {len(y)} labels"])
        return x, y
