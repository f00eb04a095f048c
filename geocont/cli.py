"""The `geocont` command line (typer). Each command is a plain typed function; its docstring is the help.

Bad input raises ConfigError anywhere below; `main` prints one line per problem and exits 2 without
a traceback, before anything is written.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from geocont import DEFAULT_STORE
from geocont.analyze import analyze_command
from geocont.config import ConfigError
from geocont.dashboard import dashboard_app
from geocont.report import report_command
from geocont.sweep.cli import sweep_app

app = typer.Typer(
    name="geocont",
    help="Sweeps, metrics and checkpoint analysis for geometric continuity in deep networks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
results_app = typer.Typer(help="Query the results store (reads only local files).", no_args_is_help=True)

# A plain string, not a Path: Path("") is ".", and `--store ''` must be an error, not the current folder.
StoreOption = Annotated[str, typer.Option("--store", help="Results store folder.")]


class Format(str, Enum):
    md = "md"
    csv = "csv"
    json = "json"


class Paper(str, Enum):
    mlp = "mlp"
    transformer = "transformer"


@app.command()
def train(
    config: Annotated[str, typer.Argument(help="A run config YAML file, or a preset name (see `geocont list`).")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field: dotted.path=value.")] = None,
    store: StoreOption = DEFAULT_STORE,
    progress: Annotated[bool, typer.Option(help="Show Lightning's progress bar.")] = True,
) -> None:
    """Train one run and record it in the store under the sweep name `single`.

    Re-running a finished run trains aside and replaces it only when the new attempt finishes too.
    """
    cfg = _run_config(config, set_ or [], store)
    from geocont.train import train as run_training

    result = run_training(cfg, Path(store), progress=progress)
    typer.echo(f"{result.status}: run {result.run_id} -> {result.run_dir}")
    if result.error:
        typer.echo(f"error: {result.error}", err=True)
    kept = Path(store) / "single" / result.run_id
    if result.run_dir != kept:
        typer.echo(f"the finished result in {kept} is kept; this attempt is in {result.run_dir}", err=True)
    from geocont import catalog, kinds
    from geocont.tables import markdown, role_table

    for name in catalog.TABLE:
        if name in result.final:
            typer.echo(f"  {name:28s} {result.final[name]:.4f}")
    roles = role_table(result.final, kinds.get(cfg.model.kind).roles)
    if roles is not None:
        typer.echo(markdown(roles))
    if result.status == "failed":
        raise typer.Exit(1)


def _run_config(config: str, sets: list[str], store: str):
    """The resolved config and a usable store, or one ConfigError naming every problem of both."""
    from geocont.config import load_run, parse_overrides, preset_names, resolve
    from geocont.store import check_writable

    problems, cfg = [], None
    try:
        if Path(config).is_file():
            cfg = load_run(config, sets)
        elif config in preset_names():
            cfg = resolve({"preset": config}, parse_overrides(sets))
        else:
            presets = ", ".join(preset_names())
            problems.append(f"CONFIG: {config!r} is neither a file nor a preset; presets: {presets}")
    except ConfigError as err:
        problems += err.problems
    try:
        check_writable(store)
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError(problems)
    return cfg


@app.command("list")
def list_presets() -> None:
    """List the named presets a config can start from (`preset: NAME` or `geocont train NAME`)."""
    from geocont.config import preset_dict, preset_names

    for name in preset_names():
        model = preset_dict(name).get("model", {})
        summary = ", ".join(f"{k}={v}" for k, v in model.items())
        typer.echo(f"{name:22s} {summary}")


@results_app.command("runs")
def results_runs(
    store: StoreOption = DEFAULT_STORE,
    sweep: Annotated[str | None, typer.Option(help="Only this sweep.")] = None,
    format: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.md,
) -> None:
    """One row per run: status, the config that varies, seed, and final key metrics."""
    from geocont.tables import render, runs_table

    typer.echo(render(runs_table(_collect_runs(store, sweep)), format.value))


@results_app.command("table")
def results_table(
    store: StoreOption = DEFAULT_STORE,
    sweep: Annotated[str | None, typer.Option(help="Only this sweep.")] = None,
    format: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.md,
    paper: Annotated[Paper | None, typer.Option(help="Put the paper's values beside the reproduced ones.")] = None,
) -> None:
    """Mean ± std over seeds per variant; with --paper, matched to the paper's table rows."""
    from geocont.tables import aggregate_table, mean_std_columns, render

    frame = _collect_runs(store, sweep)
    if paper is not None:
        from geocont.paper import paper_table

        table = paper_table(frame, paper.value)
        typer.echo(render(mean_std_columns(table) if format == Format.md else table, format.value))
        return
    table = aggregate_table(frame)
    typer.echo(render(mean_std_columns(table) if format == Format.md else table, format.value))


def _collect_runs(store_arg: str, sweep: str | None):
    from geocont import store

    if store_arg == "":
        raise ConfigError([f"--store: empty; give the results store folder, e.g. --store {DEFAULT_STORE}"])
    store_dir = Path(store_arg)
    if sweep is not None:
        store.check_sweep_name(sweep)
    if not store_dir.is_dir():
        raise ConfigError([f"--store: {store_dir} is not a results store (no such folder)"])
    if sweep is not None and not (store_dir / sweep).is_dir():
        names = ", ".join(store.sweep_names(store_dir)) or "none"
        raise ConfigError([f"--sweep: no sweep {sweep!r} in {store_dir}; sweeps there: {names}"])
    frame = store.runs(store_dir, sweep).collect()
    if frame.is_empty():
        raise ConfigError([f"--store: {store_dir} holds no finished runs" + (f" for sweep {sweep!r}" if sweep else "")])
    return frame


# Order of `geocont --help`: the everyday commands first.
app.add_typer(sweep_app, name="sweep")
app.add_typer(results_app, name="results")
app.command("analyze")(analyze_command)
app.command("report")(report_command)
app.add_typer(dashboard_app, name="dashboard")


def main() -> None:
    """Console-script entry: user errors become one-line messages and exit code 2."""
    from geocont.entry import run

    run(app)


if __name__ == "__main__":
    main()
