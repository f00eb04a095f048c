"""Placement follows resources: contradictions are launch errors (exit 2, nothing written)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from geocont.sweep.placement import placement_problems

TINY = {"model": {"kind": "mlp", "depth": 3, "width": 16}, "data": {"name": "digits"}, "train": {"epochs": 1}}


@pytest.mark.parametrize(
    ("gpu", "accelerator", "message"),
    [
        (0, "gpu", "train.accelerator: 'gpu' but resources.gpu is 0"),
        (0, "cuda", "train.accelerator: 'cuda' but resources.gpu is 0"),
        (0.25, "cpu", "train.accelerator: 'cpu' but resources.gpu is 0.25"),
    ],
)
def test_an_accelerator_that_contradicts_resources_is_refused_at_launch(tmp_path, gpu, accelerator, message):
    sweep = {
        "name": "placed",
        "base": {**TINY, "train": {"epochs": 1, "accelerator": accelerator}},
        "resources": {"cpu": 1, "gpu": gpu},
        "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep))
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "geocont.cli", "sweep", "launch", str(path), "--store", str(store)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not store.exists()


def test_online_wandb_without_a_key_is_refused_before_ray_starts(tmp_path):
    sweep = {"name": "online", "base": TINY, "tracking": {"wandb": {"mode": "online"}, "tensorboard": False}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep))
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env["NETRC"] = str(tmp_path / "none")
    cmd = [sys.executable, "-m", "geocont.cli", "sweep", "launch", str(path), "--store", str(tmp_path / "store")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "no wandb API key" in proc.stderr
    assert not (tmp_path / "store").exists()


def test_auto_and_matching_accelerators_pass():
    assert placement_problems(0, {"auto", "cpu"}) == []
    assert placement_problems(0.25, {"auto", "gpu", "cuda"}) == []
