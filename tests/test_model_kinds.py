"""Model kinds are a registry: a third family (tests/toy_mixer.py) trains, sweeps on Ray, tabulates and
reports without any geocont file naming it; the built-in kinds log exactly the catalogue's names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from geocont import catalog, kinds, store
from geocont.config import ConfigError, resolve
from geocont.dashboard import DashboardSpec, sections
from geocont.report import build_report
from geocont.train import train

TESTS = Path(__file__).resolve().parent
OFF = {"wandb": {"mode": "disabled"}, "tensorboard": False}
MIXER = {"model": {"kind": "mixer", "depth": 3, "width": 16}, "data": {"name": "digits"}}


@pytest.fixture(scope="module")
def mixer():
    kinds.load_plugins("toy_mixer")  # tests/ is on sys.path (pytest's rootdir import)
    return kinds.get("mixer")


def plugin_env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, kinds.PLUGINS_ENV: "toy_mixer", "PYTHONPATH": path}


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "geocont.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=plugin_env(), timeout=600)


def test_an_unregistered_kind_is_a_one_line_error_naming_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        resolve({"model": {"kind": "vit"}})
    [line] = err.value.problems
    assert line.startswith("model: unknown kind 'vit'; allowed: 'mlp', 'transformer'"), line


def test_the_toy_kind_validates_with_its_own_section_and_data_rule(mixer):
    cfg = resolve({**MIXER, "tracking": OFF})
    assert type(cfg.model) is mixer.config and cfg.model.width == 16
    assert cfg.run_id() == resolve(cfg.to_dict()).run_id()  # round-trips through a plain dict (Ray's boundary)
    with pytest.raises(ConfigError, match=r"model.heads: unknown key; allowed under model: kind, depth, width"):
        resolve({"model": {"kind": "mixer", "heads": 4}})
    with pytest.raises(ConfigError, match=r"model.kind 'mixer' needs digits or mnist"):
        resolve({"model": {"kind": "mixer"}, "data": {"name": "stdlib"}})


def test_the_toy_kind_trains_with_per_role_metrics_from_the_catalogue(mixer, tmp_path):
    cfg = resolve({**MIXER, "train": {"epochs": 2, "batch_size": 128}, "tracking": OFF})
    result = train(cfg, tmp_path / "store", progress=False)
    assert result.status == "completed", result.error
    logged = set(result.final)
    assert logged <= set(catalog.logged(mixer.roles))
    assert {"weight/token/v1_continuity", "weight/channel/u1_continuity", "delta_gw/token/v1"} <= logged
    assert "weight/v1_continuity" not in logged  # a kind with roles logs the per-role names only
    assert 0.0 <= result.final["weight/channel/v1_continuity"] <= 1.0


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_built_in_kinds_log_the_catalogue_names_and_their_dashboards_draw_only_those(name, tmp_path):
    kind = kinds.get(name)
    preset = {"mlp": "smoke", "transformer": "transformer-smoke"}[name]
    cfg = resolve({"preset": preset, "tracking": OFF})
    result = train(cfg, tmp_path / "store", progress=False)
    assert result.status == "completed", result.error
    expected = set(catalog.logged(kind.roles)) - {catalog.SPIKE, "val/ppl" if name == "mlp" else "val/acc"}
    assert set(result.final) == expected
    assert set(kind.metric_names()) <= expected


def test_a_sweep_of_the_toy_kind_runs_on_ray_then_tabulates_and_reports(mixer, tmp_path):
    sweep = tmp_path / "mixer.yaml"
    base = {**MIXER, "train": {"epochs": 2, "batch_size": 128}}
    grid = {"model.activation": ["relu", "none"]}
    spec = {"name": "mixer", "base": base, "tracking": OFF, "grid": grid, "seeds": [0, 1], "resources": {"cpu": 1}}
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
    root = tmp_path / "store"
    launched = cli("sweep", "launch", str(sweep), "--store", str(root), "--max-concurrent", "2")
    assert launched.returncode == 0, launched.stderr[-3000:]
    runs = store.runs(root, "mixer").collect()
    assert runs.height == 4 and set(runs["status"]) == {"completed"}
    assert set(runs["model.kind"]) == {"mixer"}

    table = cli("results", "table", "--store", str(root), "--sweep", "mixer", "--format", "json")
    assert table.returncode == 0, table.stderr
    rows = json.loads(table.stdout)
    assert len(rows) == 2  # one per activation, over two seeds

    report = build_report(root, "mixer")
    ids = [f.id for s in report.sections for f in s.figures]
    assert ids == ["mixer-projections", "mixer-delta-gw-heatmap", "mixer-training"]
    roles = next(f for s in report.sections for f in s.figures if f.id == "mixer-projections")
    assert "Gate" not in roles.caption  # the transformer's note on what its roles read and write is its own
    dashboard = sections(DashboardSpec("mixer", "mixer", ("model.activation",)).kind)
    assert [s.title for s in dashboard] == ["Continuity per role", "Accuracy and loss"]
    assert DashboardSpec("mixer", "mixer", ()).x_axis == "epoch"


def test_every_name_the_report_and_live_view_ask_for_is_in_the_catalogue():
    from geocont.report import build
    from geocont.sweep import live

    asked = [*build.MLP_CONTINUITY, *build.TRAINING, *build.INIT_SCALE, *live.METRICS, live.SPIKE]
    assert [name for name in asked if catalog.find(name) is None] == []
    assert set(build.FIGURES) >= {f for kind in kinds.registered() for f in kind.report}
