"""wandb workspace and report of a sweep, defined as code (wandb-workspaces), and `geocont dashboard push`.

The layout is data, declared by each model kind (geocont.kinds: its `dashboard` sections, line
plots against its x axis, epoch for the MLP, step for language models), runs grouped by the config keys that vary
across the sweep (mean line, stddev band over seeds) and filtered to the sweep's wandb group (the
Ray runner logs every trial of a sweep under `group=<sweep name>`). The builders turn it into
`wandb_workspaces` objects offline; only `push` talks to W&B. wandb-workspaces is imported lazily
so that `geocont --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from geocont import DEFAULT_STORE, kinds
from geocont.config import ConfigError
from geocont.kinds.base import Panel, Section

if TYPE_CHECKING:
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

# Lightning's WandbLogger logs both; a kind's x_axis (geocont.kinds) picks one.
WANDB_X = {"epoch": "epoch", "step": "trainer/global_step"}


@dataclass(frozen=True)
class DashboardSpec:
    """What a sweep's dashboards need: its name (the wandb group), model kind and the keys its variants vary."""

    sweep: str
    kind: str  # model.kind (geocont.kinds)
    variant_keys: tuple[str, ...]

    @property
    def x_axis(self) -> str:
        return WANDB_X[kinds.get(self.kind).x_axis]


def sections(kind: str) -> list[Section]:
    """The dashboard layout of a model kind (its ModelKind.dashboard; metric names from the catalogue)."""
    return list(kinds.get(kind).dashboard)


# ---------------------------------------------------------------------------------------------
# Builders (offline)


def sweep_filter(spec: DashboardSpec) -> list:
    """Runs of this sweep only: the wandb group that every trial of the sweep logs under."""
    from wandb_workspaces import expr

    return [expr.Metric("Group") == spec.sweep]


def build_workspace(spec: DashboardSpec, entity: str, project: str) -> ws.Workspace:
    """The sweep's workspace: one open section per entry of `sections()`, runs grouped by variant."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    return ws.Workspace(
        entity=entity,
        project=project,
        name=f"geocont: {spec.sweep}",
        sections=[
            ws.Section(
                name=section.title,
                panels=[_panel(p, spec) for p in section.panels],
                is_open=True,
                layout_settings=ws.SectionLayoutSettings(columns=section.columns, rows=2),
            )
            for section in sections(spec.kind)
        ],
        settings=ws.WorkspaceSettings(x_axis=spec.x_axis, max_runs=100, group_by_prefix="first"),
        runset_settings=ws.RunsetSettings(
            filters=sweep_filter(spec),
            groupby=[expr.Config(key) for key in spec.variant_keys],
        ),
    )


def build_report(spec: DashboardSpec, entity: str, project: str) -> wr.Report:
    """A shareable report: the same sections as panel grids over one runset (the sweep, grouped by variant)."""
    import wandb_workspaces.reports.v2 as wr

    blocks: list[Any] = [
        wr.TableOfContents(),
        wr.P(
            f"Sweep {spec.sweep} ({spec.kind}): lines are the mean over each variant's seeds, bands one stddev. "
            f"Variants vary {', '.join(spec.variant_keys) or 'nothing (one config)'}. The results store is the "
            "source of truth: `geocont report --sweep " + spec.sweep + "` renders the same figures offline."
        ),
    ]
    for section in sections(spec.kind):
        blocks.append(wr.H2(section.title))
        blocks.append(
            wr.PanelGrid(
                runsets=[_runset(spec, entity, project)], panels=[_panel(p, spec, report=True) for p in section.panels]
            )
        )
    return wr.Report(
        entity=entity,
        project=project,
        title=f"geocont: {spec.sweep}",
        description=f"Geometric continuity sweep {spec.sweep}, built by geocont.dashboard.",
        blocks=blocks,
        width="fluid",
    )


def _runset(spec: DashboardSpec, entity: str, project: str) -> wr.Runset:
    import wandb_workspaces.reports.v2 as wr

    return wr.Runset(
        entity=entity,
        project=project,
        name=spec.sweep,
        filters=sweep_filter(spec),
        groupby=[f"config.{key}" for key in spec.variant_keys],
    )


def _panel(panel: Panel, spec: DashboardSpec, report: bool = False):
    import wandb_workspaces.reports.v2 as wr

    grouped = {"groupby_aggfunc": "mean", "groupby_rangefunc": "stddev"}
    if panel.kind == "bar":
        return wr.BarPlot(title=f"{panel.metric} (final)", metrics=[panel.metric], orientation="v", **grouped)
    return wr.LinePlot(title=panel.metric, x=spec.x_axis, y=[panel.metric], smoothing_type="none", **grouped)


# ---------------------------------------------------------------------------------------------
# Where a spec comes from: a sweep YAML, or the runs of a sweep in the store


def spec_from_sweep_file(path: str | Path) -> DashboardSpec:
    """Name, kind and variant keys (grid axes plus keys that `include` rows set) of a sweep YAML."""
    from geocont.config import read_yaml, resolve

    raw = read_yaml(path)
    if not isinstance(raw.get("name"), str):
        raise ConfigError([f"{path}: a sweep file needs a `name`"])
    keys = list(raw.get("grid") or {})
    for row in raw.get("include") or []:
        keys += [k for k in row if k not in keys]
    kind = resolve(raw.get("base") or {}).model.kind
    return DashboardSpec(raw["name"], kind, tuple(k for k in keys if k != "train.seed"))


def spec_from_store(store_dir: Path, sweep: str) -> DashboardSpec:
    """The spec of a sweep in the store: from its finished runs, else from the sweep.yaml recorded at launch."""
    from geocont import store
    from geocont.report.data import varying_keys

    runs = store.runs(store_dir, sweep).collect() if (store_dir / sweep).is_dir() else None
    if runs is not None and not runs.is_empty():
        kind = str(runs["model.kind"][0]) if "model.kind" in runs.columns else kinds.DEFAULT
        return DashboardSpec(sweep, kind, tuple(varying_keys(runs)))
    recorded = store.spec_path(store_dir, sweep)
    if recorded.is_file():
        return spec_from_sweep_file(recorded)
    known = ", ".join(store.sweep_names(store_dir)) or "none"
    raise ConfigError([f"SWEEP: no sweep {sweep!r} in {store_dir} (sweeps there: {known}); or pass a sweep YAML file"])


def resolve_spec(sweep: str, store: Path) -> DashboardSpec:
    path = Path(sweep)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError([f"SWEEP: {sweep}: no such file"])
        return spec_from_sweep_file(path)
    return spec_from_store(store, sweep)


def outline(spec: DashboardSpec) -> dict[str, Any]:
    """What push would create, as plain data: filter, grouping, sections and their panels."""
    return {
        "sweep": spec.sweep,
        "kind": spec.kind,
        "filter": {"Group": spec.sweep},
        "groupby": list(spec.variant_keys),
        "x_axis": spec.x_axis,
        "sections": [
            {"title": s.title, "panels": [f"{p.kind}:{p.metric}" for p in s.panels]} for s in sections(spec.kind)
        ],
    }


# ---------------------------------------------------------------------------------------------
# CLI: geocont dashboard push

dashboard_app = typer.Typer(help="wandb workspace and report of a sweep, defined as code.", no_args_is_help=True)


@dashboard_app.command("push")
def push_command(
    sweep: Annotated[str, typer.Argument(help="A sweep name in --store, or a sweep YAML file.")],
    entity: Annotated[str, typer.Option("--entity", help="W&B entity (user or team) that owns the project.")],
    project: Annotated[str, typer.Option("--project", help="W&B project the runs were logged to.")] = "geocont",
    store: Annotated[Path, typer.Option("--store", help="Results store folder.")] = Path(DEFAULT_STORE),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be created; no network.")] = False,
) -> None:
    """Create (or update) the sweep's wandb workspace and report; needs network and a W&B login.

    Upload offline runs first: `wandb sync <store>/<sweep>/*/wandb/offline-run-*`.
    """
    spec = resolve_spec(sweep, store)
    workspace = build_workspace(spec, entity, project)
    report = build_report(spec, entity, project)
    if dry_run:
        typer.echo(json.dumps({"outline": outline(spec), "workspace": workspace._spec}, indent=2, default=str))
        return
    _require_login()
    try:
        workspace.save()
        report.save()
    except Exception as err:  # wandb raises requests / CommError types for network and auth failures
        raise ConfigError([f"W&B push failed ({type(err).__name__}): {str(err).splitlines()[0][:200]}"]) from None
    typer.echo(f"workspace: {workspace.url}")
    typer.echo(f"report:    {report.url}")


def _require_login() -> None:
    """Fail before any request when no key is configured (wandb.Api raises UsageError offline then)."""
    import wandb

    try:
        wandb.Api(timeout=20)
    except wandb.errors.UsageError:
        raise ConfigError(
            ["no W&B API key: run `wandb login` or set WANDB_API_KEY (never put it in a config file)"]
        ) from None


def run_script(argv: list[str], default_sweep: Path) -> int:
    """Entry point of the dashboards/*.py scripts: push (or print) the workspace and report of a sweep YAML."""
    import argparse

    parser = argparse.ArgumentParser(description="Push a sweep's wandb workspace and report.")
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", default="geocont", help="W&B project the runs were logged to")
    parser.add_argument("--sweep", type=Path, default=default_sweep, help="sweep YAML file")
    parser.add_argument("--dry-run", action="store_true", help="print what would be created; no network")
    args = parser.parse_args(argv)
    try:
        push_command(str(args.sweep), entity=args.entity, project=args.project, dry_run=args.dry_run)
    except ConfigError as err:
        for line in err.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    return 0
