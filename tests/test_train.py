import json
import math

import polars as pl
import pytest
from conftest import tiny_run

from geocont import store
from geocont.config import ConfigError, resolve
from geocont.train import train

DESIGN_METRICS = {
    "weight/v1_continuity",
    "weight/u1_continuity",
    "weight/sigma2_continuity",
    "weight/sigma2_continuity_u",
    "weight/spectral_gap",
    "grad_init/v1_continuity",
    "grad_init/u1_continuity",
    "grad_cum/v1_continuity",
    "grad_cum/u1_continuity",
    "delta_gw/v1",
    "delta_gw/u1",
    "update_ratio",
    "train/loss",
    "val/loss",
    "val/acc",
}


def test_a_run_writes_the_store_and_every_metric(store_dir):
    events = []
    cfg = resolve(tiny_run(train={"epochs": 3}))
    result = train(cfg, store_dir, on_metrics=lambda e, s, v: events.append((e, s, v)), progress=False)
    assert result.status == "completed" and result.error is None
    assert DESIGN_METRICS <= set(result.final)
    folder = store.run_dir(store_dir, "single", cfg.run_id())
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "metrics.parquet", "run.json"]
    info = json.loads((folder / "run.json").read_text())
    assert info["status"] == "completed" and info["steps"] > 0 and info["sweep"] == "single"
    long = pl.read_parquet(folder / "metrics.parquet")
    weight = long.filter(pl.col("name") == "weight/v1_continuity")
    assert weight["epoch"].to_list() == [1, 2, 3]  # every epoch, counted from one
    assert long.filter(pl.col("name") == "grad_init/v1_continuity")["step"].to_list() == [0]
    assert [e for e, _, _ in events] == [1, 2, 3]
    assert "val/acc" in events[-1][2] and "weight/sigma2_continuity" in events[-1][2]


def test_metrics_every_n_steps_and_a_final_event_when_max_steps_stops_mid_epoch(store_dir):
    cfg = resolve(tiny_run(train={"epochs": 50, "batch_size": 64, "max_steps": 7, "metrics_every_n_steps": 3}))
    result = train(cfg, store_dir, progress=False)
    assert result.status == "completed"
    long = store.metrics(store_dir).collect()
    steps = long.filter(pl.col("name") == "weight/v1_continuity").sort("step")["step"].to_list()
    assert steps == [3, 6, 7]
    assert long.filter(pl.col("name") == "val/loss")["step"].max() == 7  # a fresh validation at the end


def test_a_non_finite_loss_is_recorded_as_diverged_with_final_values(store_dir):
    cfg = resolve(tiny_run(optim={"name": "sgd", "lr": 1.0e6}, train={"epochs": 5}))
    result = train(cfg, store_dir, progress=False)
    assert result.status == "diverged"
    assert "non-finite" in result.error
    assert math.isnan(result.final["train/loss"])
    assert "weight/v1_continuity" in result.final
    assert store.read_run_info(store_dir, "single", cfg.run_id())["status"] == "diverged"


def test_bad_data_input_raises_before_anything_is_written(store_dir, tmp_path):
    cfg = resolve(tiny_run(data={"name": "mnist", "path": str(tmp_path / "nowhere")}))
    with pytest.raises(ConfigError, match="data.path"):
        train(cfg, store_dir, progress=False)
    assert not store_dir.exists()


def test_an_exception_during_training_is_recorded_as_failed(store_dir, monkeypatch):
    from geocont.lit import module

    def explode(self, batch, batch_idx):
        raise RuntimeError("boom at step")

    monkeypatch.setattr(module.GeoModule, "training_step", explode)
    cfg = resolve(tiny_run())
    result = train(cfg, store_dir, progress=False)
    assert result.status == "failed" and "RuntimeError: boom at step" in result.error
    folder = store.run_dir(store_dir, "single", cfg.run_id())
    assert "boom at step" in (folder / "error.txt").read_text()
    assert store.read_run_info(store_dir, "single", cfg.run_id())["status"] == "failed"


def test_same_config_same_numbers(store_dir, tmp_path):
    cfg = resolve(tiny_run())
    a = train(cfg, store_dir, progress=False)
    b = train(cfg, tmp_path / "other", progress=False)
    assert a.run_id == b.run_id
    assert a.final["val/loss"] == b.final["val/loss"]
    assert a.final["weight/v1_continuity"] == b.final["weight/v1_continuity"]


def test_tensorboard_event_files(store_dir):
    cfg = resolve(tiny_run(tracking={"tensorboard": True}))
    result = train(cfg, store_dir, progress=False)
    assert list((result.run_dir / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_offline_writes_a_local_run_under_the_store(store_dir, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = resolve(tiny_run(tracking={"wandb": {"mode": "offline"}}))
    result = train(cfg, store_dir, run_name="tiny", progress=False)
    assert result.status == "completed", result.error
    assert list(result.run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def test_partial_metrics_file_is_rewritten_at_most_once_per_interval(tmp_path):
    from geocont.lit.loggers import StoreLogger

    logger = StoreLogger(tmp_path, "run", flush_interval_s=3600.0)
    partial = tmp_path / "metrics.partial.parquet"
    logger.log_metrics({"val/loss": 1.0, "epoch": 0}, step=10)
    logger.flush()  # the first event is always written: `sweep status` sees the run at once
    assert pl.read_parquet(partial).height == 1
    logger.log_metrics({"val/loss": 0.5, "epoch": 1}, step=20)
    logger.flush()
    assert pl.read_parquet(partial).height == 1  # inside the interval: not rewritten
    logger.flush_interval_s = 0.0
    logger.flush()
    assert pl.read_parquet(partial)["value"].to_list() == [1.0, 0.5]
    logger.publish()  # the final file holds every row, and the progress file is gone
    assert not partial.exists()
    assert pl.read_parquet(tmp_path / "metrics.parquet")["epoch"].to_list() == [1, 2]


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_reduced_precision_trains_through_the_manual_step(store_dir, precision):
    # manual optimization must still go through Lightning's precision plugin (autocast, bf16 weights)
    steps = {}
    for p in ("32", precision):
        cfg = resolve(tiny_run(train={"epochs": 2, "precision": p, "accelerator": "cpu"}))
        result = train(cfg, store_dir, progress=False)
        assert result.status == "completed", result.error
        steps[p] = json.loads((store.run_dir(store_dir, "single", cfg.run_id()) / "run.json").read_text())["steps"]
    assert steps[precision] == steps["32"] > 0  # every optimizer step counted, as in full precision
    assert result.final["val/acc"] > 0.3 and all(math.isfinite(v) for v in result.final.values())


def test_spikes_found_during_training_land_in_run_json_and_as_train_spike(store_dir, monkeypatch):
    from geocont import train as train_module
    from geocont.metrics.spikes import SpikeDetector

    # the real detector, made touchy (1 % above the lowest of the last 3 steps) so ordinary noise trips it
    touchy = {"factor": 1.01, "window": 3, "warmup": 1, "gap": 1, "quantile": 0.0}
    monkeypatch.setattr(train_module, "SpikeDetector", lambda: SpikeDetector(**touchy))
    result = train(resolve(tiny_run(train={"epochs": 3})), store_dir, progress=False)
    spikes = json.loads((result.run_dir / "run.json").read_text())["spikes"]
    rows = pl.read_parquet(result.run_dir / "metrics.parquet").filter(pl.col("name") == "train/spike")
    assert spikes and rows["step"].to_list() == [s["step"] for s in spikes]
    assert rows["value"].to_list() == pytest.approx([s["loss"] / s["level"] for s in spikes])
    assert all(v > 1.01 for v in rows["value"])


def test_a_run_without_spikes_records_an_empty_list(store_dir):
    result = train(resolve(tiny_run()), store_dir, progress=False)
    assert json.loads((result.run_dir / "run.json").read_text())["spikes"] == []


def test_grad_clip_bounds_every_step(store_dir):
    sgd = {"name": "sgd", "lr": 0.05}  # momentum 0.9: a step moves W by at most lr * max||g|| / (1 - 0.9)
    free = train(resolve(tiny_run(optim=sgd)), store_dir, progress=False)
    clipped = train(resolve(tiny_run(optim=sgd, train={"grad_clip": 1e-4})), store_dir, progress=False)
    # ||g|| <= 1e-4: 24 steps move the weights by at most 2.4e-4 in norm
    assert clipped.final["update_ratio"] < 0.01 < free.final["update_ratio"]
