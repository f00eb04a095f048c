"""No command destroys a finished result (issue 11, docs/store-safety.md).

Real training runs (tiny MLPs, seconds each), real files, a real Ray launch. The first tests fail on
the code before the fix: a failed re-run overwrote run.json and rewrote metrics.parquet empty, and a
data.path whose files changed was silently trained into the old run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import tiny_run
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bad_input import _damage, run_cli, snapshot, write_mnist

from geocont import store
from geocont.config import ConfigError, resolve
from geocont.train import train


def result_files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in ("config.yaml", "metrics.parquet", "run.json")}


@pytest.fixture
def finished(store_dir):
    """A completed tiny run in `store` and its files' bytes."""
    cfg = resolve(tiny_run(train={"epochs": 1}))
    result = train(cfg, store_dir, progress=False)
    assert result.status == "completed"
    return cfg, result.run_dir, result_files(result.run_dir)


def test_a_failed_rerun_keeps_the_finished_result(store_dir, finished, monkeypatch):
    cfg, folder, before = finished
    # The same run (tracking is not in the run_id) with wandb online and no key: the attempt fails.
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    online = resolve(tiny_run(train={"epochs": 1}, tracking={"wandb": {"mode": "online"}}))
    assert online.run_id() == cfg.run_id()
    try:
        result = train(online, store_dir, progress=False)
    except ConfigError:  # refused up front is as good: nothing may be touched either way
        result = None
    assert result_files(folder) == before
    assert json.loads((folder / "run.json").read_text())["status"] == "completed"
    if result is not None:
        assert result.status == "failed" and result.run_dir != folder
        assert (result.run_dir / "error.txt").is_file()  # the failed attempt is kept aside, for its error
        assert len(store.runs(store_dir).collect()) == 1  # readers never see the attempt


def test_a_rerun_that_fails_mid_training_keeps_the_finished_result(store_dir, finished):
    """The live-metrics hook (what a Ray trial reports through) raising mid-run fails the attempt."""
    cfg, folder, before = finished

    def broken_view(epoch, step, values):
        raise RuntimeError("the live view went away")

    result = train(cfg, store_dir, on_metrics=broken_view, progress=False)
    assert result.status == "failed" and "the live view went away" in result.error
    assert result_files(folder) == before  # run.json still completed, metrics.parquet not rewritten empty
    assert result.run_dir == folder.parent / store.ATTEMPTS / f"{cfg.run_id()}.failed"
    assert (result.run_dir / "error.txt").is_file()
    assert store.runs(store_dir).collect()["status"].to_list() == ["completed"]


def test_a_finished_rerun_replaces_the_result_and_leaves_nothing_aside(store_dir, finished):
    cfg, folder, before = finished
    again = train(cfg, store_dir, progress=False)
    assert again.status == "completed" and again.run_dir == folder
    after = json.loads((folder / "run.json").read_text())
    assert after["started"] >= json.loads(before["run.json"])["started"]
    assert not any((folder.parent / store.ATTEMPTS).iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "metrics.parquet", "run.json"]


def mnist_run(folder: Path):
    return resolve(tiny_run(data={"name": "mnist", "path": str(folder)}, train={"epochs": 1, "batch_size": 16}))


def test_corrupted_data_under_a_finished_run_is_refused_and_the_run_kept(tmp_path, store_dir):
    data = write_mnist(tmp_path / "mnist")
    result = train(mnist_run(data), store_dir, progress=False)
    assert result.status == "completed"
    before = result_files(result.run_dir)
    _damage(data, "truncated-body")
    with pytest.raises(ConfigError, match="is truncated"):
        train(mnist_run(data), store_dir, progress=False)
    assert result_files(result.run_dir) == before


def test_changed_data_is_detected_by_its_fingerprint(tmp_path, store_dir, monkeypatch, capsys):
    data = write_mnist(tmp_path / "mnist")
    cfg = mnist_run(data)
    result = train(cfg, store_dir, progress=False)
    recorded = yaml.safe_load((result.run_dir / "config.yaml").read_text())["data_fingerprint"]
    assert len(recorded) == 32
    before = result_files(result.run_dir)
    shutil.rmtree(data)
    write_mnist(data, n_train=48)  # other valid files under the same path: the same run_id
    assert mnist_run(data).run_id() == cfg.run_id()
    with pytest.raises(ConfigError, match="changed since run"):
        train(mnist_run(data), store_dir, progress=False)
    assert result_files(result.run_dir) == before
    # The CLI says it in one line, exit 2.
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    code, _, err = run_cli(["train", str(config), "--store", str(store_dir), "--no-progress"], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "changed since run" in err


def test_replace_dir_swaps_whole_folders(tmp_path):
    old, new = tmp_path / "run", tmp_path / "attempt"
    old.mkdir()
    new.mkdir()
    (old / "run.json").write_text("old")
    (new / "run.json").write_text("new")
    (new / "extra").write_text("x")
    store.replace_dir(new, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (old / "run.json").read_text() == "new" and (old / "extra").is_file()


# ---------------------------------------------------------------------------------------------
# Sweeps: one real launch, then re-launches that must be refused before Ray starts


def test_a_sweep_name_keeps_its_trials_and_its_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = write_mnist(tmp_path / "mnist")
    base = tiny_run(data={"name": "mnist", "path": str(data)}, train={"epochs": 1, "batch_size": 16})
    sweep = {"name": "keep", "base": base, "grid": {"model.activation": ["relu", "gelu"]}, "seeds": [0]}
    path = tmp_path / "keep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    store_dir = tmp_path / "store"
    code, out, err = run_cli(["sweep", "launch", str(path), "--store", str(store_dir)], monkeypatch, capsys)
    assert code == 0, out + err
    stored = (store_dir / "keep" / "sweep.yaml").read_text()

    # Only resources changed: the same trials, accepted (nothing runs).
    path.write_text(yaml.safe_dump({**sweep, "resources": {"cpu": 1, "gpu": 0}}, sort_keys=False))
    code, out, err = run_cli(["sweep", "launch", str(path), "--store", str(store_dir)], monkeypatch, capsys)
    assert code == 0 and "nothing to run" in out, out + err
    stored = (store_dir / "keep" / "sweep.yaml").read_text()  # the re-launch is recorded: resume uses its resources

    # A third activation under the same name: refused, the difference named, the store untouched.
    before = snapshot(store_dir)
    grown = {**sweep, "grid": {"model.activation": ["relu", "gelu", "silu"]}}
    path.write_text(yaml.safe_dump(grown, sort_keys=False))
    code, _, err = run_cli(["sweep", "launch", str(path), "--store", str(store_dir)], monkeypatch, capsys)
    assert code == 2 and "grid.model.activation: stored" in err and "silu" in err, err
    assert snapshot(store_dir) == before and (store_dir / "keep" / "sweep.yaml").read_text() != path.read_text()

    # The data changed under the finished trials: refused, for launch and resume alike.
    shutil.rmtree(data)
    write_mnist(data, n_train=48)
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    for argv in (["launch", str(path)], ["resume", "keep"]):
        code, _, err = run_cli(["sweep", *argv, "--store", str(store_dir)], monkeypatch, capsys)
        assert code == 2 and "changed since 2 finished trial(s)" in err, err
    assert snapshot(store_dir) == before
    assert (store_dir / "keep" / "sweep.yaml").read_text() == stored


# ---------------------------------------------------------------------------------------------
# Readers: one corrupt file is reported (naming its folder) and the rest of the store is read


CORRUPTIONS = {
    "truncated-run-json": ("run.json", lambda b: b[: len(b) // 2]),
    "run-json-a-list": ("run.json", lambda b: b"[1, 2, 3]"),
    "run-json-no-status": ("run.json", lambda b: b'{"run_id": "x"}'),
    "junk-config": ("config.yaml", lambda b: b"{{{ not: yaml: ["),
    "config-a-string": ("config.yaml", lambda b: b"just text"),
    "truncated-metrics": ("metrics.parquet", lambda b: b[: len(b) // 2]),
    "empty-metrics": ("metrics.parquet", lambda b: b""),
}


def synthetic_store(root: Path) -> list[str]:
    from synthetic_store import write_mlp_sweep

    return write_mlp_sweep(root, "s", seeds=(0,), epochs=2)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_every_reader_skips_a_corrupt_run_and_names_it(tmp_path, monkeypatch, capsys, kind):
    root = tmp_path / "store"
    ids = synthetic_store(root)
    name, damage = CORRUPTIONS[kind]
    broken = store.run_dir(root, "s", ids[1])
    (broken / name).write_bytes(damage((broken / name).read_bytes()))
    getattr(store, "_warned", set()).clear()
    assert set(store.runs(root).collect()["run_id"]) == set(ids) - {ids[1]}
    for argv in (
        ["results", "runs", "--store", str(root), "--format", "json"],
        ["results", "table", "--store", str(root)],
        ["sweep", "status", "s", "--store", str(root)],
        ["report", "--store", str(root), "-o", str(tmp_path / "r.html")],
    ):
        getattr(store, "_warned", set()).clear()  # each command reports afresh
        code, out, err = run_cli(argv, monkeypatch, capsys)
        assert code in (0, 1), (argv, out, err)  # status exits 0 here; nothing is pending
        assert "Traceback" not in err
        assert f"warning: skipped {broken}" in err, (argv, err)


def test_status_counts_a_corrupt_run_as_not_finished(tmp_path):
    from geocont.sweep.status import sweep_rows

    root = tmp_path / "store"
    ids = synthetic_store(root)
    store.record_spec(root, "s", yaml.safe_dump({
        "name": "s", "base": {"model": {"kind": "mlp", "depth": 4, "width": 16}, "data": {"name": "digits"},
                              "train": {"epochs": 2}},
        "grid": {"model.residual": [True, False], "model.activation": ["relu", "none"]}, "seeds": [0]}))  # fmt: skip
    (store.run_dir(root, "s", ids[0]) / "run.json").write_text("{")
    _, rows, counts = sweep_rows(root, "s")
    assert len(rows) == 4 and counts.get("completed") == 3 and counts.get("started") == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["run.json", "config.yaml", "metrics.parquet"]), st.floats(0, 0.99)),
                min_size=4, max_size=4))  # fmt: skip
def test_random_damage_never_breaks_the_readers(damage):
    """Property: whatever prefix of whichever file of each run is left, runs() reads every intact run and
    nothing that does not read back (a prefix of a config.yaml may still be YAML: only such a run may stay)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        ids = synthetic_store(root)
        damaged = {}
        for run_id, (name, keep) in zip(ids, damage):
            if keep > 0.9:
                continue  # this run left intact
            path = store.run_dir(root, "s", run_id) / name
            data = path.read_bytes()
            path.write_bytes(data[: int(keep * len(data))])
            damaged[run_id] = name
        frame = store.runs(root).collect()
        read = set(frame["run_id"]) if len(frame) else set()
        assert set(ids) - set(damaged) <= read <= set(ids)
        assert all(damaged[r] == "config.yaml" for r in read & set(damaged))
