"""wandb workspace and report builders (offline), their run filters and panels, and `geocont dashboard push`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from synthetic_store import write_mlp_sweep, write_transformer_sweep
from typer.testing import CliRunner

from geocont import store
from geocont.cli import app
from geocont.config import ConfigError, resolve
from geocont.dashboard import (
    DashboardSpec,
    build_report,
    build_workspace,
    resolve_spec,
    sections,
    spec_from_store,
    spec_from_sweep_file,
)
from geocont.kinds.transformer import ROLES

ROOT = Path(__file__).resolve().parents[1]
MLP = DashboardSpec("paper-mlp", "mlp", ("model.residual", "model.activation", "model.norm"))
LM = DashboardSpec("paper-transformer", "transformer", ("model.activation",))


def _metrics(kind: str) -> set[str]:
    return {p.metric for s in sections(kind) for p in s.panels}


def test_workspace_sections_panels_and_filter():
    workspace = build_workspace(MLP, "team", "geocont")
    titles = [s.name for s in workspace.sections]
    assert titles == ["Weight continuity", "Gradient coherence and Delta_GW", "Update ratio", "Accuracy and loss"]
    first = workspace.sections[0].panels
    assert [p.y for p in first[:3]] == [
        ["weight/v1_continuity"],
        ["weight/u1_continuity"],
        ["weight/sigma2_continuity"],
    ]
    lines = [p for s in workspace.sections for p in s.panels if isinstance(p, wr.LinePlot)]
    assert all(p.x == "epoch" and p.groupby_aggfunc == "mean" and p.groupby_rangefunc == "stddev" for p in lines)
    bars = [p for s in workspace.sections for p in s.panels if isinstance(p, wr.BarPlot)]
    assert [b.metrics for b in bars] == [["delta_gw/v1"]]
    assert {m for p in lines for m in p.y} >= {"grad_cum/v1_continuity", "delta_gw/v1", "update_ratio", "val/acc"}

    # The wire model that save() would send: runs of the sweep's wandb group, grouped by variant keys.
    runset = workspace._to_model().spec.section.run_sets[0]
    assert runset.filters["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": "paper-mlp", "disabled": False}
    ]
    assert [(k.section, k.name) for k in runset.grouping] == [
        ("config", "model.value.residual"), ("config", "model.value.activation"), ("config", "model.value.norm")
    ]  # fmt: skip
    assert workspace._to_model().spec.section.settings.x_axis == "epoch"


def test_workspace_round_trips_through_the_wire_model():
    workspace = build_workspace(MLP, "team", "geocont")
    again = ws.Workspace._from_model(workspace._to_model())
    assert [len(s.panels) for s in again.sections] == [len(s.panels) for s in workspace.sections]
    assert again.runset_settings.filters == workspace.runset_settings.filters
    assert again.sections[1].panels[1].y[0].name == "grad_cum/v1_continuity"


def test_transformer_workspace_has_per_projection_panels():
    workspace = build_workspace(LM, "team", "geocont")
    panels = {s.name: [p.y[0] for p in s.panels] for s in workspace.sections}
    assert panels["Per-projection continuity, input space (v1)"] == [f"weight/{r}/v1_continuity" for r in ROLES]
    assert panels["Per-projection continuity, output space (u1)"] == [f"weight/{r}/u1_continuity" for r in ROLES]
    assert len(panels["Per-projection Delta_GW"]) == 14 and "val/ppl" in panels["Perplexity and loss"]
    assert all(p.x == "trainer/global_step" for s in workspace.sections for p in s.panels)


def test_report_blocks_runsets_and_panels():
    report = build_report(MLP, "team", "geocont")
    assert report.entity == "team" and report.project == "geocont" and "paper-mlp" in report.title
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    headings = [b.text for b in report.blocks if isinstance(b, wr.H2)]
    assert headings == [s.title for s in sections("mlp")] and len(grids) == len(headings)
    for grid, section in zip(grids, sections("mlp")):
        (runset,) = grid.runsets
        assert (runset.entity, runset.project) == ("team", "geocont")
        assert runset.filters == """Metric("Group") == 'paper-mlp'"""
        assert runset.groupby == ["config.model.residual", "config.model.activation", "config.model.norm"]
        shown = [p.y[0] if isinstance(p, wr.LinePlot) else p.metrics[0] for p in grid.panels]
        assert shown == [p.metric for p in section.panels]


def test_dashboard_metrics_are_what_training_logs(tmp_path):
    """Every MLP panel names a metric a real run writes; transformer names come from the real metric code."""
    from geocont.metrics.geometry import delta_gw_metrics, direction_metrics, weight_metrics
    from geocont.train import train

    cfg = resolve({
        "model": {"kind": "mlp", "depth": 3, "width": 16}, "data": {"name": "digits"},
        "train": {"epochs": 1, "batch_size": 64}, "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False},
    })  # fmt: skip
    result = train(cfg, tmp_path / "store", "names", progress=False)
    assert result.status == "completed"
    logged = set(store.metrics(tmp_path / "store").collect()["name"])
    assert _metrics("mlp") <= logged, _metrics("mlp") - logged

    stacks = {r: torch.randn(3, 8, 8) for r in ROLES}
    names = weight_metrics(stacks, {r: s.clone() for r, s in stacks.items()})
    names.update(direction_metrics("grad_cum", stacks))
    names.update(delta_gw_metrics(names, list(ROLES)))
    expected = set(names) | {"val/ppl", "val/loss", "train/loss"}
    assert _metrics("transformer") <= expected, _metrics("transformer") - expected


def test_specs_from_sweep_files_and_store(tmp_path):
    assert spec_from_sweep_file(ROOT / "sweeps/paper_mlp.yaml") == MLP
    full = spec_from_sweep_file(ROOT / "sweeps/mlp_full_grid.yaml")
    keys = ("model.residual", "model.activation", "model.norm", "model.init_std", "optim.beta2", "optim.eps")
    assert full.variant_keys == keys
    assert spec_from_sweep_file(ROOT / "sweeps/paper_transformer.yaml").kind == "transformer"

    root = tmp_path / "store"
    write_mlp_sweep(root, "grid", grid={"model.activation": ["relu", "none"], "model.norm": ["none", "layernorm"]})
    write_transformer_sweep(root, "lm")
    assert spec_from_store(root, "grid") == DashboardSpec("grid", "mlp", ("model.activation", "model.norm"))
    assert spec_from_store(root, "lm") == DashboardSpec("lm", "transformer", ("model.activation",))
    # Launched but nothing finished yet: the sweep.yaml recorded at launch decides.
    store.record_spec(root, "early", (ROOT / "sweeps/init_scale.yaml").read_text())
    assert spec_from_store(root, "early") == DashboardSpec("init-scale", "mlp", ("model.activation",))
    with pytest.raises(ConfigError, match="no sweep 'nope'"):
        resolve_spec("nope", root)
    with pytest.raises(ConfigError, match="no such file"):
        resolve_spec(str(tmp_path / "missing.yaml"), root)


def test_push_dry_run_prints_the_workspace_offline(tmp_path):
    root = tmp_path / "store"
    write_mlp_sweep(root, "grid", grid={"model.activation": ["relu", "none"]})
    result = CliRunner().invoke(app, ["dashboard", "push", "grid", "--entity", "me", "--store", str(root), "--dry-run"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["outline"]["filter"] == {"Group": "grid"}
    assert printed["outline"]["groupby"] == ["model.activation"]
    assert printed["workspace"]["entity"] == "me"
    assert len(printed["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]) == 4


def test_push_without_a_key_fails_before_any_request(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    result = CliRunner().invoke(app, ["dashboard", "push", str(ROOT / "sweeps/smoke.yaml"), "--entity", "me"])
    assert isinstance(result.exception, ConfigError)
    assert "no W&B API key" in result.exception.problems[0]


@pytest.mark.parametrize("script", ["mlp_sweep.py", "transformer_sweep.py"])
def test_dashboard_scripts_build_offline(script):
    spec = importlib.util.spec_from_file_location(script[:-3], ROOT / "dashboards" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workspace, report = module.workspace("team"), module.report("team")
    kind = "mlp" if script.startswith("mlp") else "transformer"
    assert [s.name for s in workspace.sections] == [s.title for s in sections(kind)]
    assert workspace.runset_settings.filters == f"""Metric("Group") == '{module.spec().sweep}'"""
    assert sum(isinstance(b, wr.PanelGrid) for b in report.blocks) == len(sections(kind))
