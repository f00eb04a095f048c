"""MNIST from IDX files (a local folder), or through torchvision's downloader when it is installed.

The IDX format: a big-endian header (magic, dimension sizes) followed by raw uint8 data. Files may
be gzipped. The official 10k test split serves as the validation set, as in the paper's table.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import torch
from torch import Tensor

from geocont.config import ConfigError, DataConfig
from geocont.data.classification import InMemoryClassification, standardise

SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Where people keep the files: the folder itself, or torchvision's download layout below it.
SUBFOLDERS = (".", "MNIST/raw")
NUM_CLASSES = 10


def read_idx(path: Path) -> Tensor:
    """An IDX file (optionally .gz) as a uint8 tensor of the shape its header gives (ConfigError when damaged)."""
    raw = _file_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] == 0:
        raise ConfigError([f"data.path: {path} is not an unsigned-byte IDX file (bad magic number)"])
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ConfigError([f"data.path: {path} is truncated inside its header ({len(raw)} bytes)"])
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    expected = math.prod(shape)
    if len(body) != expected:
        raise ConfigError([f"data.path: {path} is truncated: header says {expected} bytes of data, found {len(body)}"])
    if expected == 0:
        raise ConfigError([f"data.path: {path} holds no data (shape {'x'.join(map(str, shape))})"])
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


def _file_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if path.suffix == ".gz" else data
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ConfigError(
            [f"data.path: {path} cannot be read as {'gzip' if path.suffix == '.gz' else 'a file'}: {err}"]
        ) from None


def candidates(stem: str) -> list[str]:
    """Names MNIST goes by: `train-images-idx3-ubyte`, the `train-images.idx3-ubyte` spelling, each also .gz."""
    dotted = stem.replace("-idx", ".idx")
    return [stem, f"{stem}.gz", dotted, f"{dotted}.gz"]


def find_idx(folder: Path, stem: str) -> Path | None:
    for sub in SUBFOLDERS:
        for name in candidates(stem):
            if (folder / sub / name).is_file():
                return folder / sub / name
    return None


def mnist_files(folder: Path) -> list[Path]:
    """The four IDX files under `folder` (one ConfigError naming every missing one)."""
    if not folder.is_dir():
        raise ConfigError([f"data.path: {folder} is not a folder (data.name 'mnist' reads a folder of IDX files)"])
    stems = [stem for split in ("train", "val") for stem in SPLITS[split]]
    found = [find_idx(folder, stem) for stem in stems]
    missing = [stem for stem, path in zip(stems, found) if path is None]
    if missing:
        raise ConfigError(
            [f"data.path: {folder} has no {stem} (nor .gz, the .idx spelling or MNIST/raw/)" for stem in missing]
        )
    return found


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
        (x_tr, y_tr), (x_va, y_va) = load_splits(folder)
        self.x_train, self.x_val = standardise(x_tr, x_va)
        self.y_train, self.y_val = y_tr, y_va


def load_splits(folder: Path) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """((x_train, y_train), (x_val, y_val)) from a folder, every file checked (ConfigError per problem)."""
    train_x, train_y, val_x, val_y = mnist_files(folder)
    return _split(train_x, train_y), _split(val_x, val_y)


def _split(images: Path, labels: Path) -> tuple[Tensor, Tensor]:
    x, y = read_idx(images), read_idx(labels)
    problems = []
    if x.dim() != 3:
        problems.append(f"data.path: {images} holds a {x.dim()}-d array; images are (N, rows, cols)")
    if y.dim() != 1:
        problems.append(f"data.path: {labels} holds a {y.dim()}-d array; labels are (N,)")
    elif int(y.max()) >= NUM_CLASSES:
        problems.append(f"data.path: {labels} has label {int(y.max())}; allowed: 0 to {NUM_CLASSES - 1}")
    if len(x) != len(y):
        problems.append(f"data.path: {images.name} has {len(x)} images but {labels.name} has {len(y)} labels")
    if problems:
        raise ConfigError(problems)
    return x.flatten(1).float() / 255.0, y.long()  # (N, rows * cols), (N,)
