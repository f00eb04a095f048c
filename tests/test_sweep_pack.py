"""`resources.pack` on a real embedded Ray through the real CLI: packs of same-shape trials, each member
its own run in the store (with `pack` in run.json), a live view per member, and SIGKILL then resume
with every member done exactly once."""

from __future__ import annotations

import pytest
from test_sweep_ray import (
    TINY,
    assert_each_trial_completed_once,
    assert_no_ray_left,
    finish,
    geocont,
    kill_once_a_run_is_done,
    run_infos,
    write_sweep,
)

from geocont.sweep.grid import expand
from geocont.sweep.load import load_sweep
from geocont.sweep.packs import group

pytestmark = pytest.mark.slow


def test_a_packed_sweep_trains_each_variants_seeds_together_and_records_every_member(tmp_path):
    path = write_sweep(
        tmp_path, name="packed", grid={"model.activation": ["relu", "none"]}, seeds=[0, 1, 2], resources={"pack": 3}
    )
    code, out, err = finish(geocont("launch", str(path), "--store", str(tmp_path / "store")))
    assert code == 0, out + err
    trials = expand(load_sweep(path))
    infos = run_infos(tmp_path / "store", "packed")
    assert set(infos) == {t.run_id for t in trials} and {i["status"] for i in infos.values()} == {"completed"}
    packs = {tuple(i["pack"]) for i in infos.values()}
    assert packs == {tuple(t.run_id for t in p) for p in group(trials, 3)} and len(packs) == 2
    for pack in packs:  # one variant's three seeds, in one process
        members = [next(t for t in trials if t.run_id == r) for r in pack]
        assert sorted(t.config.train.seed for t in members) == [0, 1, 2]
        assert len({infos[r]["worker_pid"] for r in pack}) == 1
    for t in trials:  # each member in the live view's lines under its own name
        assert f"{t.name}" in err
    assert "6 trials (6 completed); ran 6, 0 already in the store" in out, out


def test_sigkill_mid_pack_then_resume_finishes_every_member_exactly_once(tmp_path):
    path = write_sweep(
        tmp_path,
        name="killed",
        base={**TINY, "train": {"epochs": 3, "batch_size": 32}},
        grid={"model.activation": ["relu", "gelu", "none"]},
        seeds=[0, 1],
        resources={"pack": 2},
    )
    store_dir, sweep = tmp_path / "store", "killed"
    trials = expand(load_sweep(path))
    proc = geocont("launch", str(path), "--store", str(store_dir), "--max-concurrent", "1")
    before = kill_once_a_run_is_done(proc, store_dir, sweep, len(trials))

    code, out, err = finish(geocont("resume", sweep, "--store", str(store_dir)))
    assert code == 0, out + err
    assert_each_trial_completed_once(store_dir, sweep, trials, before)
    assert_no_ray_left(proc.pid)
