"""Shared fixtures. Tests never touch the network: wandb is disabled unless a test says otherwise."""

from __future__ import annotations

import os

# Before numpy/torch load their BLAS: one thread each, so tests sharing two cores do not oversubscribe.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Caches and wandb's debug logs go to a temp folder, never the user's home."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("WANDB_DIR", str(cache / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(cache / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(cache / "wandb-config"))
    monkeypatch.setenv("GEOCONT_CACHE", str(cache / "geocont"))


def tiny_run(**sections) -> dict:
    """A raw run config for a seconds-long MLP on digits, tracking off; sections override."""
    from geocont.config import deep_merge

    base = {
        "model": {"kind": "mlp", "depth": 3, "width": 16},
        "data": {"name": "digits"},
        "train": {"epochs": 2, "batch_size": 128},
        "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False},
    }
    return deep_merge(base, sections)


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"
