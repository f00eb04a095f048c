import json
import os

import polars as pl
import pytest

from geocont import store


def write_run(root, sweep, run_id, status="completed", activation="relu", seed=0, values=(0.1, 0.5)):
    folder = store.run_dir(root, sweep, run_id)
    store.write_config(folder, {"model": {"activation": activation}, "train": {"seed": seed}})
    rows = [
        {"run_id": run_id, "epoch": e + 1, "step": 10 * (e + 1), "name": "weight/v1_continuity", "value": v}
        for e, v in enumerate(values)
    ]
    store.write_metrics(folder, rows)
    store.write_run_info(folder, {"run_id": run_id, "sweep": sweep, "status": status})
    return folder


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "run.json"
    store.atomic_write_text(target, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        store.atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary left behind


def test_run_json_accepts_only_final_statuses(tmp_path):
    with pytest.raises(ValueError, match="completed"):
        store.write_run_info(tmp_path, {"run_id": "x", "sweep": "s", "status": "running"})
    assert not (tmp_path / "run.json").exists()


def test_runs_has_one_row_per_run_with_config_and_final_metrics(tmp_path):
    write_run(tmp_path, "sw", "aaa", activation="relu", values=(0.1, 0.9))
    write_run(tmp_path, "sw", "bbb", activation="none", status="diverged", values=(0.2, 0.3))
    frame = store.runs(tmp_path).collect().sort("run_id")
    assert frame.height == 2
    assert frame["model.activation"].to_list() == ["relu", "none"]
    assert frame["weight/v1_continuity"].to_list() == [0.9, 0.3]  # the last epoch's value
    assert frame["status"].to_list() == ["completed", "diverged"]


def test_unfinished_runs_are_invisible_to_queries(tmp_path):
    write_run(tmp_path, "sw", "done")
    half = store.run_dir(tmp_path, "sw", "half")
    store.write_config(half, {"model": {"activation": "relu"}})  # killed before run.json
    assert store.runs(tmp_path).collect()["run_id"].to_list() == ["done"]


def test_metrics_is_long_and_joined_with_config(tmp_path):
    write_run(tmp_path, "a", "r1", values=(0.1, 0.2, 0.3))
    write_run(tmp_path, "b", "r1", values=(0.5,))  # the same run id may live in two sweeps
    frame = store.metrics(tmp_path).collect()
    assert frame.filter(pl.col("sweep") == "a").height == 3
    assert frame.filter(pl.col("sweep") == "b")["value"].to_list() == [0.5]
    assert "model.activation" in frame.columns
    assert store.runs(tmp_path, sweep="b").collect()["weight/v1_continuity"].to_list() == [0.5]


def test_run_info_round_trip(tmp_path):
    write_run(tmp_path, "sw", "abc")
    assert store.read_run_info(tmp_path, "sw", "abc")["status"] == "completed"
    assert store.read_run_info(tmp_path, "sw", "nope") is None
    assert [i["run_id"] for i in store.list_run_infos(tmp_path, "sw")] == ["abc"]
    assert json.loads((tmp_path / "sw" / "abc" / "run.json").read_text())["sweep"] == "sw"
