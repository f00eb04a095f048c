import gzip
import struct

import numpy as np
import pytest
import torch

from geocont.config import ConfigError, DataConfig
from geocont.data.batches import TensorBatches
from geocont.data.digits import DigitsDataModule
from geocont.data.mnist import MNISTDataModule, read_idx


def write_idx(path, array: np.ndarray, compress: bool = False):
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)


@pytest.fixture
def mnist_folder(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 50), ("t10k", 20)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), compress=True)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    return tmp_path


def test_digits_split_is_seeded_and_standardised():
    a = DigitsDataModule(DataConfig(), batch_size=32, seed=0)
    b = DigitsDataModule(DataConfig(), batch_size=32, seed=0)
    c = DigitsDataModule(DataConfig(), batch_size=32, seed=1)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.y_val, b.y_val) and not torch.equal(a.y_val, c.y_val)
    assert len(a.x_train) + len(a.x_val) == 1797
    assert len(a.x_val) == round(1797 * 0.15)
    assert a.in_features == 64 and a.num_classes == 10
    assert a.x_train.mean().abs() < 0.05
    assert a.x_val.abs().max() < 50  # no blow-up from pixels constant in the train split


def test_tensor_batches_cover_every_sample_once_per_epoch():
    x, y = torch.arange(10).float().unsqueeze(1), torch.arange(10)
    batches = TensorBatches(x, y, batch_size=4, shuffle=True, seed=0)
    assert len(batches) == 3
    first = torch.cat([yb for _, yb in batches])
    second = torch.cat([yb for _, yb in batches])
    assert sorted(first.tolist()) == list(range(10)) and not torch.equal(first, second)


def test_mnist_reads_idx_files(mnist_folder):
    dm = MNISTDataModule(DataConfig(name="mnist", path=str(mnist_folder)), batch_size=16, seed=0)
    dm.setup()
    assert dm.x_train.shape == (50, 784) and dm.x_val.shape == (20, 784)
    assert dm.y_train.dtype == torch.long and dm.in_features == 784
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 784)


def test_mnist_bad_files(mnist_folder):
    (mnist_folder / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match="has no t10k-labels-idx1-ubyte"):
        MNISTDataModule(DataConfig(name="mnist", path=str(mnist_folder)), 16, 0).setup()
    truncated = mnist_folder / "cut"
    truncated.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 100) + b"\x00" * 10)
    with pytest.raises(ConfigError, match="truncated"):
        read_idx(truncated)
    (mnist_folder / "junk").write_bytes(b"hello world")
    with pytest.raises(ConfigError, match="bad magic"):
        read_idx(mnist_folder / "junk")
