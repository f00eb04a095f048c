"""Sweeps on a real embedded Ray, driven through the real CLI (`python -m geocont.cli sweep ...`).

Covers: retries of a failing trial while the others finish, a diverging trial recorded once, the
node in run.json, `status`; SIGKILL of the driver then `resume` with exact counts (no run lost,
none repeated, no partial file, no orphaned Ray process); an optuna search landing in the store.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from geocont import store
from geocont.sweep.grid import expand
from geocont.sweep.load import load_sweep

pytestmark = pytest.mark.slow

TINY = {
    "model": {"kind": "mlp", "depth": 3, "width": 16},
    "data": {"name": "digits"},
    "train": {"epochs": 1, "batch_size": 128},
}
OFF = {"wandb": {"mode": "disabled"}, "tensorboard": False}


def write_sweep(folder: Path, **fields) -> Path:
    path = folder / f"{fields['name']}.yaml"
    path.write_text(yaml.safe_dump({"base": TINY, "tracking": OFF, **fields}, sort_keys=False))
    return path


def geocont(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "geocont.cli", "sweep", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)


def write_idx_mnist(folder: Path, n_train: int = 64, n_val: int = 32) -> None:
    """A tiny MNIST-shaped data set in the IDX format (random pixels), for a data.path relative to the CLI."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for split, n in (("train", n_train), ("t10k", n_val)):
        pixels = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        (folder / f"{split}-images-idx3-ubyte").write_bytes(struct.pack(">4I", 0x803, n, 28, 28) + pixels.tobytes())
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(struct.pack(">2I", 0x801, n) + labels.tobytes())


# A tiny transformer on a two-file corpus whose train split holds fewer blocks than one batch: valid as a
# config and as files, it fails inside the trial, once the corpus is tokenized.
SHORT_TEXT = {
    "model.kind": "transformer", "model.width": 16, "model.heads": 2, "model.kv_heads": 2, "model.mlp_width": 32,
    "data.name": "text", "data.path": "corpus", "data.seq_len": 64,
}  # fmt: skip


def write_short_corpus(folder: Path) -> None:
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("geometric continuity " * 50)  # ~1 KB each: 16 blocks of 64 < a batch of 128


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_infos(store_dir: Path, sweep: str) -> dict[str, dict]:
    return {info["run_id"]: info for info in store.list_run_infos(store_dir, sweep)}


def wandb_run_record(run_dir: Path) -> dict:
    """The run record (name, group, config) of the offline wandb run in a run folder, read back offline."""
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    wandb_cli = str(Path(sys.executable).with_name("wandb"))
    out = subprocess.run([wandb_cli, "leet", "inspect", "--json", str(offline)], capture_output=True, text=True)
    return next(rec["run"] for rec in map(json.loads, out.stdout.splitlines()) if rec.get("type") == "run")


def kill_once_a_run_is_done(proc: subprocess.Popen, store_dir: Path, sweep: str, total: int) -> dict[str, str]:
    """SIGKILL the driver as soon as a run.json lands; the run.json texts then in the store (some, not all)."""
    deadline = time.monotonic() + 600
    while not store.list_run_infos(store_dir, sweep) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.parent.name: p.read_text() for p in (store_dir / sweep).glob("*/run.json")}
    assert 1 <= len(before) < total, "the kill must land mid-sweep"
    return before


def assert_each_trial_completed_once(store_dir: Path, sweep: str, trials: list, before: dict[str, str]) -> None:
    """Exactly one completed run per trial: none lost, none repeated, nothing partial, none finished rerun."""
    folders = {p.name for p in (store_dir / sweep).iterdir() if p.is_dir()}
    assert folders == {t.run_id for t in trials}
    for t in trials:
        files = {p.name for p in store.run_dir(store_dir, sweep, t.run_id).iterdir()}
        assert files == {"config.yaml", "metrics.parquet", "run.json"}
        assert json.loads((store.run_dir(store_dir, sweep, t.run_id) / "run.json").read_text())["status"] == "completed"
    for run_id, text in before.items():  # runs finished before the kill were not run again
        assert (store_dir / sweep / run_id / "run.json").read_text() == text


def assert_no_ray_left(driver_pid: int) -> None:
    """The embedded Ray of that driver is gone: no folder, no process holding a file in it."""
    from geocont.sweep.session import EMBEDDED_ROOT, ray_processes

    folder = EMBEDDED_ROOT / str(driver_pid)
    assert not folder.exists()
    assert ray_processes(folder) == []


def test_failing_trial_is_retried_diverged_is_not_and_the_rest_finish(tmp_path):
    path = write_sweep(
        tmp_path,
        name="local",
        grid={"model.activation": ["relu", "none"]},
        include=[
            SHORT_TEXT,  # found only once the corpus is tokenized (fewer blocks than one batch): retried, then failed
            {"model.activation": "none", "optim.name": "sgd", "optim.lr": 1.0e8},  # non-finite loss: diverged
            {"data.name": "mnist", "data.path": "mnist"},  # relative to the CLI's folder, not Tune's trial folder
        ],
        seeds=[0],
        retries=1,
        tracking={"wandb": {"mode": "offline", "project": "geocont"}, "tensorboard": False},
    )
    write_idx_mnist(tmp_path / "mnist")
    write_short_corpus(tmp_path / "corpus")
    proc = geocont("launch", path.name, "--store", "store", cwd=tmp_path)
    store_dir = tmp_path / "store"
    code, out, err = finish(proc)
    assert code == 1, out + err  # a failed trial makes the launch exit 1
    trials = {t.name: t for t in expand(load_sweep(path))}
    infos = run_infos(store_dir, "local")
    status = {name: infos[t.run_id]["status"] for name, t in trials.items()}
    failed = next(n for n, s in status.items() if "kind=transformer" in n)
    diverged = next(n for n in status if "optim=sgd" in n)
    assert any("data=mnist path=mnist" in n for n in status)
    assert status.pop(failed) == "failed" and status.pop(diverged) == "diverged"
    assert set(status.values()) == {"completed"} and len(status) == 3
    assert "fewer than one batch" in infos[trials[failed].run_id]["error"]
    retried = next(line for line in out.splitlines() if line.startswith("retried:"))
    assert f"{trials[failed].run_id} (2 attempts)" in retried and trials[diverged].run_id not in retried
    for name, t in trials.items():
        assert infos[t.run_id]["name"] == name
        assert infos[t.run_id]["node"].startswith("127.0.0.1/")  # the node the trial ran on
    assert "Traceback" not in err
    assert_no_ray_left(proc.pid)
    for name in status:  # the completed ones: one wandb group per sweep, readable names, the resolved config
        run = wandb_run_record(store.run_dir(store_dir, "local", trials[name].run_id))
        assert (run["run_group"], run["display_name"]) == ("local", name)
        assert run["config"]["update"]["model"] == trials[name].config.to_dict()["model"]

    code, out, _ = finish(geocont("status", "local", "--store", str(store_dir)))
    assert code == 0
    assert "1 failed" in out and "1 diverged" in out and "3 completed" in out
    assert "ConfigError" in out  # the error, in the note column


def test_sigkill_of_the_driver_then_resume_finishes_exactly_once(tmp_path):
    path = write_sweep(
        tmp_path,
        name="killed",
        base={**TINY, "train": {"epochs": 3, "batch_size": 32}},
        grid={"model.activation": ["relu", "gelu", "none"]},
        seeds=[0, 1],
    )
    store_dir, sweep = tmp_path / "store", "killed"
    trials = expand(load_sweep(path))
    proc = geocont("launch", str(path), "--store", str(store_dir))
    before = kill_once_a_run_is_done(proc, store_dir, sweep, len(trials))

    resumed = geocont("resume", sweep, "--store", str(store_dir))
    code, out, err = finish(resumed)
    assert code == 0, out + err
    # The killed driver's orphaned worker may finish its trial before the resume stops it: that run counts
    # as done, but a run is never both "already in the store" and run again.
    ran, already = map(int, re.search(r"ran (\d+), (\d+) already in the store", out).groups())
    assert ran + already == len(trials) and already >= len(before)
    assert_each_trial_completed_once(store_dir, sweep, trials, before)
    assert_no_ray_left(proc.pid)  # the killed driver's orphans were stopped by the resume
    assert_no_ray_left(resumed.pid)

    code, out, _ = finish(geocont("launch", str(path), "--store", str(store_dir)))
    assert code == 0 and f"{len(trials)} trials ({len(trials)} completed); nothing to run" in out


def test_optuna_search_lands_in_the_store_and_resumes_to_nothing(tmp_path):
    search = {
        "metric": "val/acc",
        "mode": "max",
        "n_trials": 3,
        "space": {"optim.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}},
    }
    path = write_sweep(tmp_path, name="search", search=search)
    store_dir = tmp_path / "store"
    code, out, err = finish(geocont("launch", str(path), "--store", str(store_dir), "--max-concurrent", "1"))
    assert code == 0, out + err
    from geocont.sweep.study import finished, open_study

    study = open_study(store_dir, load_sweep(path))
    done = finished(study)
    assert len(done) == 3
    infos = run_infos(store_dir, "search")
    assert len({info["worker_pid"] for info in infos.values()}) == 1  # one at a time: one reused actor
    frame = store.runs(store_dir, "search").collect()
    for trial in done:
        run_id = trial.user_attrs["run_id"]
        assert infos[run_id]["status"] == "completed"
        assert infos[run_id]["name"] == f"lr={trial.params['optim.lr']:g} seed=0"
        stored = frame.filter(frame["run_id"] == run_id)["val/acc"][0]
        assert trial.value == pytest.approx(stored)
    code, out, _ = finish(geocont("resume", "search", "--store", str(store_dir)))
    assert code == 0 and "nothing to run" in out


def test_a_trial_whose_worker_dies_is_retried_from_a_clean_folder(tmp_path):
    import psutil

    from geocont.sweep.session import EMBEDDED_ROOT, ray_processes

    path = write_sweep(
        tmp_path,
        name="lost",
        base={**TINY, "train": {"epochs": 40, "batch_size": 32}},
        retries=1,
        tracking={"wandb": {"mode": "disabled"}, "tensorboard": True},
    )
    (trial,) = expand(load_sweep(path))
    store_dir = tmp_path / "store"
    folder = store.run_dir(store_dir, "lost", trial.run_id)
    proc = geocont("launch", str(path), "--store", str(store_dir))
    deadline = time.monotonic() + 300
    while not (folder / "metrics.partial.parquet").exists():  # the first attempt is training and has written
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    workers = [p for p in ray_processes(EMBEDDED_ROOT / str(proc.pid)) if "ImplicitFunc" in " ".join(p.cmdline())]
    assert len(workers) == 1
    workers[0].send_signal(signal.SIGKILL)  # what a lost node looks like to Tune: the actor is gone
    code, out, err = finish(proc)
    assert code == 0, out + err
    assert f"{trial.run_id} (2 attempts)" in out
    assert run_infos(store_dir, "lost")[trial.run_id]["status"] == "completed"
    assert run_infos(store_dir, "lost")[trial.run_id]["worker_pid"] != workers[0].pid
    assert len(list((folder / "tensorboard").glob("events.out.tfevents.*"))) == 1  # none left from the lost attempt
    assert not (folder / "metrics.partial.parquet").exists()
    assert not psutil.pid_exists(workers[0].pid)
