"""Grid expansion (counts, ids, names, include/exclude), the shipped sweeps, skip logic and the live view; no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rich.console import Console

from geocont import store
from geocont.config import deep_merge, resolve
from geocont.sweep.grid import expand, to_tree
from geocont.sweep.live import SweepView
from geocont.sweep.load import load_sweep, parse_sweep

SWEEP_DIR = Path(__file__).parents[1] / "sweeps"
SWEEPS = sorted(SWEEP_DIR.glob("*.yaml"))
BASE = {
    "model": {"kind": "mlp", "depth": 3, "width": 16},
    "data": {"name": "digits"},
    "train": {"epochs": 1},
}


def sweep_of(**fields):
    return parse_sweep({"name": "t", "base": BASE, "tracking": {"wandb": {"mode": "disabled"}}, **fields})


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_shipped_sweeps_load_and_expand(path):
    sweep = load_sweep(path)
    if sweep.search is not None:  # a search's trials come from its sampler: check its space instead
        from geocont.sweep.study import distributions

        assert set(distributions(sweep.search.space)) == set(sweep.search.space)
        return
    trials = expand(sweep)
    assert trials
    assert len({t.run_id for t in trials}) == len(trials)
    assert all(t.name.endswith(f"seed={t.config.train.seed}") for t in trials)


def test_paper_mlp_sweep_is_the_papers_table():
    trials = expand(load_sweep(SWEEP_DIR / "paper_mlp.yaml"))
    assert len(trials) == 21
    rows = {(t.config.model.residual, t.config.model.activation, t.config.model.norm) for t in trials}
    assert rows == {
        (True, "relu", "none"),
        (True, "gelu", "none"),
        (True, "silu", "none"),
        (True, "none", "none"),
        (True, "radial", "none"),
        (True, "none", "layernorm"),
        (False, "relu", "none"),
    }
    for t in trials:
        cfg = t.config
        assert (cfg.model.depth, cfg.model.width, cfg.data.name) == (16, 256, "digits")
        assert (cfg.train.epochs, cfg.train.batch_size, cfg.optim.name, cfg.optim.lr) == (30, 64, "adam", 1e-3)
    assert sorted({t.config.train.seed for t in trials}) == [0, 1, 2]


def test_other_shipped_sweeps_have_their_sizes():
    full = expand(load_sweep(SWEEP_DIR / "mlp_full_grid.yaml"))
    assert len(full) == 2 * 5 * 3 * 2 * 2 * 3
    assert {t.config.model.init_std for t in full} == {None, 1e-4}
    assert {t.config.optim.beta2 for t in full} == {0.999, 0.0}
    init = expand(load_sweep(SWEEP_DIR / "init_scale.yaml"))
    assert {(t.config.model.activation, t.config.model.init_std) for t in init} == {("none", 1e-4), ("relu", 1e-4)}
    smoke = expand(load_sweep(SWEEP_DIR / "smoke.yaml"))
    assert all(t.config.train.epochs <= 2 and t.config.model.width <= 64 for t in smoke)


def test_grid_is_the_product_of_axes_times_seeds_with_content_hash_ids():
    grid = {"model.activation": ["relu", "gelu", "none"], "model.residual": [True, False]}
    trials = expand(sweep_of(grid=grid, seeds=[0, 1]))
    assert len(trials) == 3 * 2 * 2
    for t in trials:
        expected = resolve(deep_merge(BASE, {"tracking": {"wandb": {"mode": "disabled"}}}), to_tree(t.overrides))
        assert t.run_id == expected.run_id() == t.config.run_id()
    assert [t.config.train.seed for t in trials] == [0] * 6 + [1] * 6  # seed-major: stopping early keeps whole seeds
    assert "act=gelu res=false seed=1" in {t.name for t in trials}
    again = expand(sweep_of(grid=grid, seeds=[0, 1]))
    assert [t.run_id for t in again] == [t.run_id for t in trials]


def test_include_exclude_and_duplicates():
    sweep = sweep_of(
        grid={"model.activation": ["relu", "gelu"], "model.residual": [True, False]},
        exclude=[{"model.activation": "gelu", "model.residual": False}],
        include=[{"model.norm": "layernorm"}, {"model.activation": "relu", "model.residual": True}],
        seeds=[0],
    )
    names = [t.name for t in expand(sweep)]
    # 4 grid points - 1 excluded + 1 new include; the second include repeats a grid point
    assert names == [
        "act=relu res=true norm=none seed=0",
        "act=relu res=false norm=none seed=0",
        "act=gelu res=true norm=none seed=0",
        "act=relu res=true norm=layernorm seed=0",
    ]


def test_exclude_compares_values_as_the_config_reads_them():
    sweep = sweep_of(grid={"model.init_std": [None, 1.0e-4]}, exclude=[{"model.init_std": "1e-4"}])
    assert [t.config.model.init_std for t in expand(sweep)] == [None]


def test_include_with_its_own_seed_runs_once_and_tracking_reaches_every_trial():
    sweep = sweep_of(grid={"model.activation": ["relu"]}, include=[{"model.activation": "gelu", "train.seed": 7}])
    trials = expand(sweep)
    assert [(t.config.model.activation, t.config.train.seed) for t in trials] == [("relu", 0), ("gelu", 7)]
    assert all(t.config.tracking.wandb.mode == "disabled" for t in trials)


def test_finished_sweep_runs_nothing_and_starts_no_ray(tmp_path):
    import ray

    from geocont.sweep.launch import run_sweep

    sweep = sweep_of(grid={"model.activation": ["relu", "none"]}, seeds=[0, 1])
    trials = expand(sweep)
    for i, t in enumerate(trials):
        folder = store.run_dir(tmp_path, "t", t.run_id)
        store.write_config(folder, t.config.to_dict())
        store.write_run_info(folder, {"run_id": t.run_id, "sweep": "t", "status": ("completed", "diverged")[i % 2]})
    text = yaml.safe_dump({"name": "t"})
    outcome = run_sweep(sweep, text, tmp_path)
    assert (outcome.ran, outcome.skipped, outcome.counts) == (0, 4, {"completed": 2, "diverged": 2})
    assert not ray.is_initialized()
    assert (tmp_path / "t" / "sweep.yaml").read_text() == text


def test_live_view_shows_trials_by_status_with_metrics():
    console = Console(record=True, width=160)
    sweep = sweep_of(grid={"model.activation": ["relu", "gelu", "none"]})
    trials = expand(sweep)
    view = SweepView(console=console, live=False)
    view.begin(sweep, trials, {t.run_id for t in trials[1:]})
    first, second = trials[1].payload(), trials[2].payload()
    view.event("start", first, {})
    view.event("result", first, {"epoch": 3, "val/acc": 0.9123, "node": "127.0.0.1/abcd"})
    view.event("complete", first, {"epoch": 4, "val/acc": 0.95, "run_status": "completed"})
    view.event("start", second, {})
    view.event("error", second, {"error": "ValueError: boom"})
    printed = console.export_text()
    assert "[2/3] completed act=gelu seed=0  val/acc=0.95" in printed
    assert "[3/3] failed    act=none seed=0" in printed and "ValueError: boom" in printed
    console.print(view)
    drawn = console.export_text()
    assert "1 failed" in drawn and "1 completed" in drawn and "1 skipped" in drawn
    assert "127.0.0.1/abcd" in drawn and "0.95" in drawn
