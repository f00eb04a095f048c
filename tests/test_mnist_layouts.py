"""MNIST loads from the layouts people have: canonical names with or without .gz, the `.idx3-ubyte`
spelling, and torchvision's `MNIST/raw` folder. Small IDX files written here, and the real files in
/work/shared/mnist when that folder exists (they are never copied into the repo)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_input import write_idx

from geocont.config import ConfigError, DataConfig
from geocont.data.mnist import MNISTDataModule

REAL_MNIST = Path("/work/shared/mnist")
STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_layout(root: Path, folder: str, dotted: bool, gz: bool) -> np.ndarray:
    """The four files under root/folder, named as the layout names them; returns the train labels."""
    rng = np.random.default_rng(1)
    target = root / folder
    target.mkdir(parents=True, exist_ok=True)
    labels = rng.integers(0, 10, (30,))
    arrays = [rng.integers(0, 256, (30, 28, 28)), labels, rng.integers(0, 256, (12, 28, 28)), rng.integers(0, 10, 12)]
    for stem, array in zip(STEMS, arrays):
        name = stem.replace("-idx", ".idx") if dotted else stem
        write_idx(target / (name + (".gz" if gz else "")), array, compress=gz)
    return labels


def loaded(folder: Path) -> MNISTDataModule:
    dm = MNISTDataModule(DataConfig(name="mnist", path=str(folder)), batch_size=64, seed=0)
    dm.setup()
    return dm


LAYOUTS = [(folder, dotted, gz) for folder in (".", "MNIST/raw") for dotted in (False, True) for gz in (False, True)]


@pytest.mark.parametrize(
    ("folder", "dotted", "gz"),
    LAYOUTS,
    ids=[f"{f}-{'dot' if d else 'dash'}-{'gz' if g else 'raw'}" for f, d, g in LAYOUTS],
)
def test_every_layout_loads_the_same_data(tmp_path, folder, dotted, gz):
    labels = write_layout(tmp_path, folder, dotted, gz)
    dm = loaded(tmp_path)
    assert dm.x_train.shape == (30, 784) and dm.x_val.shape == (12, 784)
    assert torch.equal(dm.y_train, torch.from_numpy(labels).long())


def test_a_missing_file_names_every_spelling_tried(tmp_path):
    write_layout(tmp_path, ".", dotted=False, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError) as err:
        loaded(tmp_path)
    assert err.value.problems == [
        f"data.path: {tmp_path} has no t10k-labels-idx1-ubyte (nor .gz, the .idx spelling or MNIST/raw/)"
    ]


@pytest.mark.skipif(not REAL_MNIST.is_dir(), reason="the real MNIST files are not on this machine")
def test_the_real_mnist_files():
    dm = loaded(REAL_MNIST)
    assert dm.x_train.shape == (60000, 784) and dm.x_val.shape == (10000, 784)
    assert sorted(dm.y_train.unique().tolist()) == list(range(10))
    assert dm.in_features == 784
