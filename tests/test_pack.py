"""train_pack: each member of a pack ends with the files its solo run writes, to fp32 tolerance.

The solo runs are geocont's own train() on the same configs; a member's metrics.parquet must have the
same rows (name, epoch, step) and values, and its run.json the same record but for timing and `pack`.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

from geocont.config import ConfigError, resolve
from geocont.pack import train_pack
from geocont.train import train

OFF = {"wandb": {"mode": "disabled"}, "tensorboard": False}
TIMING = {"started", "finished", "duration_s", "metrics_s", "sweep", "pack"}


def member(seed: int, lr: float = 1e-3, beta2: float = 0.999, init_std: float | None = None, **train_fields):
    return resolve(
        {
            "model": {"depth": 3, "width": 16, "init_std": init_std},
            "optim": {"lr": lr, "beta2": beta2},
            "train": {"epochs": 2, "batch_size": 64, "seed": seed, **train_fields},
            "tracking": OFF,
        }
    )


def metrics(result) -> pl.DataFrame:
    return pl.read_parquet(result.run_dir / "metrics.parquet").sort("name", "step", "epoch")


def record(result) -> dict:
    return json.loads((result.run_dir / "run.json").read_text())


def assert_same_files(packed, solo) -> None:
    a, b = metrics(packed), metrics(solo)
    assert a.select("name", "epoch", "step").equals(b.select("name", "epoch", "step"))
    torch.testing.assert_close(a["value"].to_torch(), b["value"].to_torch(), rtol=1e-5, atol=1e-5, equal_nan=True)
    got, want = record(packed), record(solo)
    assert {k: v for k, v in got.items() if k not in TIMING} == {k: v for k, v in want.items() if k not in TIMING}


def test_every_member_logs_what_its_solo_run_logs(tmp_path):
    cfgs = [member(0), member(1, lr=3e-3, beta2=0.99), member(2, init_std=0.05)]
    packed = train_pack(cfgs, tmp_path, "pack", progress=False)
    solo = [train(c, tmp_path, "solo", progress=False) for c in cfgs]
    for p, s in zip(packed, solo):
        assert p.status == s.status == "completed" and p.run_id == s.run_id
        assert_same_files(p, s)
        assert record(p)["pack"] == [c.run_id() for c in cfgs]
        assert (tmp_path / "pack" / p.run_id / "config.yaml").read_text() == (s.run_dir / "config.yaml").read_text()
    assert metrics(packed[0])["value"].to_list() != metrics(packed[1])["value"].to_list()  # members differ


@pytest.mark.parametrize("schedule", [{"metrics_every_n_steps": 6}, {"max_steps": 30}, {"epochs": 3}])
def test_chunked_pack_steps_keep_the_solo_schedule(schedule, tmp_path):
    # the pack, like a solo run, hands Lightning chunks of up to 32 steps (data.batches.Chunks): metrics
    # events, validation and the last step must still fall where one batch per call puts them
    cfgs = [member(0, **schedule), member(1, lr=2e-3, **schedule)]
    packed = train_pack(cfgs, tmp_path, "pack", progress=False)
    solo = [train(c, tmp_path, "solo", progress=False) for c in cfgs]
    for p, s in zip(packed, solo):
        assert_same_files(p, s)


def test_per_member_gradient_clipping_is_the_solo_runs_clipping(tmp_path):
    cfgs = [member(0, grad_clip=0.05), member(1, lr=5e-3, grad_clip=0.05)]
    for p, s in zip(
        train_pack(cfgs, tmp_path, "pack", progress=False), [train(c, tmp_path, "solo", progress=False) for c in cfgs]
    ):
        assert_same_files(p, s)


def test_a_diverging_member_ends_diverged_at_its_last_finite_weights_while_the_others_finish(tmp_path):
    cfgs = [member(0), member(1, lr=1e12), member(2, init_std=0.05)]
    packed = train_pack(cfgs, tmp_path, "pack", progress=False)
    solo = [train(c, tmp_path, "solo", progress=False) for c in cfgs]
    assert [p.status for p in packed] == [s.status for s in solo] == ["completed", "diverged", "completed"]
    for k in (0, 2):
        assert_same_files(packed[k], solo[k])
    got, want = record(packed[1]), record(solo[1])
    assert (got["steps"], got["epochs"], got["error"]) == (want["steps"], want["epochs"], want["error"])
    # its final metrics: those of its weights and cumulative gradient when it stopped, as alone
    finals = {k: v for k, v in packed[1].final.items() if not k.startswith("val/")}
    for name, value in finals.items():
        torch.testing.assert_close(value, solo[1].final[name], rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)
    assert finals["train/loss"] != finals["train/loss"]  # NaN, as a diverged solo run's


@pytest.mark.parametrize(
    ("cfgs", "message"),
    [
        ([resolve({"preset": "transformer-smoke"})] * 2, "model.kind 'transformer' has no packed model"),
        ([member(0), resolve({"model": {"depth": 3, "width": 32}})], "differ in more than seed"),
        ([member(0, precision="16-mixed"), member(1, precision="16-mixed")], "'16-mixed' cannot be packed"),
    ],
)
def test_configs_that_cannot_share_a_pack_are_refused_before_any_file(cfgs, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        train_pack(cfgs, tmp_path, "pack", progress=False)
    assert not tmp_path.joinpath("pack").exists()


def test_data_changed_under_one_finished_member_refuses_the_pack_before_any_members_file(tmp_path):
    # once, the members were checked one by one as their folders were made: the first one's folder and
    # config.yaml were written before the second's changed data refused the pack
    from test_bad_input import write_mnist

    data = write_mnist(tmp_path / "mnist")

    def on_mnist(seed: int):
        return resolve({**member(seed).to_dict(), "data": {"name": "mnist", "path": str(data)}})

    store_dir = tmp_path / "store"
    finished = train(on_mnist(1), store_dir, "pack", progress=False)
    assert finished.status == "completed"
    for f in data.iterdir():
        f.unlink()
    write_mnist(data, n_train=48)  # other files under the same path: the same run_ids
    with pytest.raises(ConfigError, match="changed since run"):
        train_pack([on_mnist(0), on_mnist(1)], store_dir, "pack", progress=False)
    assert sorted(p.name for p in (store_dir / "pack").iterdir()) == [finished.run_id]
