"""GPU correctness, checked on a CPU: state made after Lightning places the model, the accelerator's
sync-free step (run here by forcing its deferred checks), environment preflight, bounded tracker close."""

from __future__ import annotations

import json
import math
import threading
import time

import polars as pl
import pytest
import torch
from conftest import tiny_run

from geocont import store
from geocont.config import ConfigError, resolve
from geocont.lit.module import GeoModule
from geocont.train import train


def _final(store_dir, cfg) -> dict[str, float]:
    return train(cfg, store_dir, progress=False).final


def test_state_is_taken_from_the_weights_as_placed_and_cast(store_dir):
    # bf16-true: the strategy casts the weights after callbacks' `setup`; an lr whose updates round away
    # leaves them exactly as cast, so W(t) = W(0) only if W(0) was snapshot after the cast (was 0.0015).
    cfg = resolve(tiny_run(optim={"lr": 1.0e-30}, train={"epochs": 1, "precision": "bf16-true", "accelerator": "cpu"}))
    assert _final(store_dir, cfg)["update_ratio"] == 0.0


@pytest.fixture
def deferred(monkeypatch):
    """The accelerator's path: no host read of the loss per step, found_inf skips, masked accumulation."""
    monkeypatch.setattr(GeoModule, "DEFER_ON_CPU", True)


@pytest.mark.parametrize(
    ("sections", "status"),
    [
        pytest.param({}, "completed", id="completed"),
        pytest.param({"optim": {"name": "sgd", "lr": 1.0e6}, "train": {"epochs": 5}}, "diverged", id="diverged-sgd"),
        # lr 3e4 once stood here and completed: Adam's step is bounded by lr, so it takes far more to blow up
        pytest.param({"optim": {"lr": 1.0e10}, "train": {"epochs": 5}}, "diverged", id="diverged-adam"),
    ],
)
def test_the_deferred_step_gives_the_eager_steps_results(tmp_path, monkeypatch, sections, status):
    cfg = resolve(tiny_run(**sections))
    eager = train(cfg, tmp_path / "eager", progress=False)
    assert eager.status == status  # the case tests what its name says
    monkeypatch.setattr(GeoModule, "DEFER_ON_CPU", True)
    late = train(cfg, tmp_path / "deferred", progress=False)
    assert late.status == eager.status
    assert late.error == eager.error  # the same first non-finite step
    info = [json.loads((r.run_dir / "run.json").read_text()) for r in (eager, late)]
    assert info[0]["steps"] == info[1]["steps"]
    for name, value in eager.final.items():
        if name.startswith(("weight/", "grad_", "delta_gw/", "update_ratio", "val/")):
            assert late.final[name] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), name
    assert math.isnan(late.final["train/loss"]) == (eager.status == "diverged")


def test_every_step_loss_reaches_the_hooks_in_order_and_train_loss_is_logged_every_ten(
    store_dir, deferred, monkeypatch
):
    seen: list[tuple[int, float]] = []
    original = GeoModule.on_fit_start

    def with_hook(self):
        original(self)
        self.loss_hooks.append(lambda step, loss: seen.append((step, loss)))

    monkeypatch.setattr(GeoModule, "on_fit_start", with_hook)
    result = train(resolve(tiny_run(train={"epochs": 2})), store_dir, progress=False)
    steps = json.loads((result.run_dir / "run.json").read_text())["steps"]
    assert [s for s, _ in seen] == list(range(1, steps + 1))  # every step once, in order, none lost at epoch ends
    logged = pl.read_parquet(result.run_dir / "metrics.parquet").filter(pl.col("name") == "train/loss")
    per_epoch = steps // 2
    assert logged["step"].to_list() == [e * per_epoch + b + 1 for e in range(2) for b in range(0, per_epoch, 10)]
    by_step = dict(seen)
    assert logged["value"].to_list() == [by_step[s] for s in logged["step"]]


def test_run_json_says_where_it_ran_and_what_the_metrics_cost(store_dir):
    result = train(resolve(tiny_run()), store_dir, progress=False)
    info = json.loads((result.run_dir / "run.json").read_text())
    assert info["device"] == "cpu"
    assert 0 < info["metrics_s"] < info["duration_s"]


def test_data_stay_on_the_host_for_a_cpu_run():
    from geocont.data.batches import TensorBatches

    x, y = torch.randn(10, 3), torch.arange(10)
    batches = TensorBatches(x, y, 4, shuffle=True, device=torch.device("cpu"))
    assert batches.x is x and not batches.pin
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(10))


# -- preflight: exit 2 before anything is written ---------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_accelerator_gpu_without_a_gpu_is_refused_before_anything_is_written(store_dir, tmp_path):
    from test_cli import geocont

    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(tiny_run(train={"accelerator": "gpu"})))
    proc = geocont("train", str(cfg), "--store", str(store_dir))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.accelerator" in lines[0] and "no CUDA device" in lines[0]
    assert not store_dir.exists()


def test_online_wandb_without_a_key_is_refused_before_anything_is_written(store_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    cfg = resolve(tiny_run(tracking={"wandb": {"mode": "online"}}))
    with pytest.raises(ConfigError, match="tracking.wandb.mode: 'online' but no wandb API key"):
        train(cfg, store_dir, progress=False)
    assert not store_dir.exists()


def test_a_wandb_key_in_netrc_counts(tmp_path, monkeypatch):
    from geocont.preflight import has_wandb_key

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert has_wandb_key()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not has_wandb_key()  # a key for another host is not one for this host


# -- wandb: one run per store record, closed in bounded time -----------------------------------


def test_the_wandb_run_id_is_the_store_key_so_a_rerun_continues_it(store_dir, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = resolve(tiny_run(train={"epochs": 1}, tracking={"wandb": {"mode": "offline"}}))
    result = train(cfg, store_dir, sweep="s", progress=False)
    runs = list(result.run_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(f"-s-{cfg.run_id()}")


def test_closing_wandb_waits_a_bounded_time():
    from geocont.lit.trackers import finish_wandb

    release = threading.Event()

    class StuckUpload:  # what a wandb run on a dead network does: finish() blocks on the upload
        class experiment:
            @staticmethod
            def finish():
                release.wait(30)

    t0 = time.perf_counter()
    finish_wandb(StuckUpload(), timeout_s=0.3)
    assert time.perf_counter() - t0 < 5
    release.set()


# -- on a real GPU (skipped without one) ---------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_matches_the_cpu_run(tmp_path):
    cfg = resolve(tiny_run(train={"epochs": 1, "accelerator": "cpu"}))
    gpu_cfg = resolve(tiny_run(train={"epochs": 1, "accelerator": "gpu"}))
    cpu = train(cfg, tmp_path / "cpu", progress=False)
    gpu = train(gpu_cfg, tmp_path / "gpu", progress=False)
    assert json.loads((gpu.run_dir / "run.json").read_text())["device"].startswith("cuda")
    for name in ("weight/v1_continuity", "grad_cum/v1_continuity", "update_ratio"):
        assert gpu.final[name] == pytest.approx(cpu.final[name], abs=2e-3), name
    assert store.read_run_info(tmp_path / "gpu", "single", gpu_cfg.run_id())["status"] == "completed"
