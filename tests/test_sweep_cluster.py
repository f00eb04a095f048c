"""A sweep launched with --address on a real two-node Ray cluster started on this machine.

`ray start --head` and a second `ray start --address` (1 CPU each, their own --temp-dir, token auth on,
the token in a throwaway HOME) make two nodes; trials of one CPU must then use both. Ray turns
--node-ip-address=127.0.0.1 into this host's own address for a multi-node cluster, so the nodes talk
over the host's interface, token-protected. Both nodes are stopped by PID (never `ray stop`, which
would stop every Ray on the machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from geocont import store
from geocont.sweep.session import ray_processes, stop_processes

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture
def cluster(tmp_path):
    """(address, env) of a two-node cluster that lives for the test."""
    yield from two_nodes(tmp_path)


@pytest.fixture
def gpu_cluster(tmp_path):
    """The same, each node advertising one logical GPU (no CUDA here: Ray only counts it)."""
    yield from two_nodes(tmp_path, "--num-gpus=1")


def two_nodes(tmp_path, *options: str):
    env = {**os.environ, "HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    temps = [
        Path(tempfile.mkdtemp(prefix=f"gc-{role}-", dir="/tmp")) for role in ("head", "node")
    ]  # short: socket paths
    try:
        common = ["--num-cpus=1", "--disable-usage-stats", *options]
        head = [RAY, "start", "--head", "--port=0", "--include-dashboard=false", "--node-ip-address=127.0.0.1"]
        subprocess.run(
            [*head, *common, f"--temp-dir={temps[0]}"], env=env, check=True, capture_output=True, timeout=180
        )
        address = (temps[0] / "ray_current_cluster").read_text().strip()
        node = [RAY, "start", f"--address={address}", *common, f"--temp-dir={temps[1]}"]
        subprocess.run(node, env=env, check=True, capture_output=True, timeout=180)
        yield address, env
    finally:
        for temp in reversed(temps):
            stop_processes(ray_processes(temp), grace_s=1.0)
            shutil.rmtree(temp, ignore_errors=True)


def test_sweep_with_address_runs_trials_on_both_nodes(tmp_path, cluster):
    address, env = cluster
    path = tmp_path / "cluster.yaml"
    sweep = {
        "name": "cluster",
        "base": {"model": {"kind": "mlp", "depth": 3, "width": 16}, "data": {"name": "digits"}, "train": {"epochs": 2}},
        "grid": {"model.activation": ["relu", "gelu", "silu", "none"]},
        "resources": {"cpu": 1},
        "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False},
    }
    store_dir = tmp_path / "store"  # shared storage: both nodes see this machine's disk
    launch(path, sweep, store_dir, address, env)
    infos = store.list_run_infos(store_dir, "cluster")
    assert [i["status"] for i in infos] == ["completed"] * 4
    assert len({i["node_id"] for i in infos}) == 2  # both nodes ran trials (an embedded Ray would have one)
    assert all(i["node"].endswith(i["node_id"][:8]) for i in infos)


def launch(path: Path, sweep: dict, store_dir: Path, address: str, env: dict) -> None:
    path.write_text(yaml.safe_dump(sweep))
    cmd = [
        sys.executable,
        "-m",
        "geocont.cli",
        "sweep",
        "launch",
        str(path),
        "--store",
        str(store_dir),
        "--address",
        address,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_quarter_gpu_trials_share_each_nodes_gpu_and_zero_gpu_trials_see_none(tmp_path, gpu_cluster):
    address, env = gpu_cluster
    base = {"model": {"kind": "mlp", "depth": 3, "width": 16}, "data": {"name": "digits"}, "train": {"epochs": 2}}
    off = {"wandb": {"mode": "disabled"}, "tensorboard": False}
    store_dir = tmp_path / "store"
    shared = {
        "name": "quarter",
        "base": base,
        "grid": {"model.activation": ["relu", "gelu", "silu", "none"]},
        "seeds": [0, 1],
        "resources": {"cpu": 0.25, "gpu": 0.25},
        "tracking": off,
    }
    launch(tmp_path / "quarter.yaml", shared, store_dir, address, env)
    infos = store.list_run_infos(store_dir, "quarter")
    assert [i["status"] for i in infos] == ["completed"] * 8
    # each node's one GPU (id 0) is what Ray hands every quarter trial; with no CUDA here `auto` runs on the CPU
    assert {i["cuda_visible_devices"] for i in infos} == {"0"} and {i["device"] for i in infos} == {"cpu"}
    workers = {}
    for i in infos:
        workers.setdefault(i["node_id"], set()).add(i["worker_pid"])
    assert len(workers) == 2
    assert all(2 <= len(pids) <= 4 for pids in workers.values())  # several trials shared a GPU at once

    none = {**shared, "name": "no-gpu", "grid": {"model.activation": ["relu", "gelu"]}, "seeds": [0]}
    launch(tmp_path / "none.yaml", {**none, "resources": {"cpu": 0.5, "gpu": 0}}, store_dir, address, env)
    infos = store.list_run_infos(store_dir, "no-gpu")
    assert [(i["status"], i["cuda_visible_devices"], i["device"]) for i in infos] == [("completed", "", "cpu")] * 2
