"""`geocont sweep launch|resume|status`: a typer sub-app (registered by geocont.cli as `sweep`).

Ray is imported inside the commands, so `geocont --help` and `geocont train` stay fast. Bad input
raises ConfigError (one line per problem; the CLI prints them and exits 2 before writing anything).
Exit codes: 0 every trial completed or diverged, 1 some failed or are still pending, 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from geocont import DEFAULT_STORE

sweep_app = typer.Typer(
    help="Launch, resume and inspect sweeps: YAML grids and optuna searches run on Ray Tune.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# A string, not a Path: Path("") is ".", and `--store ''` must be an error, not the current folder.
StoreOption = Annotated[str, typer.Option("--store", help="Results store folder.")]
AddressOption = Annotated[
    str | None,
    typer.Option("--address", help="A Ray cluster: auto, host:port or ray://host:10001. Absent: a local Ray."),
]
ConcurrencyOption = Annotated[
    int | None, typer.Option("--max-concurrent", min=1, help="At most N trials at once (default: as resources allow).")
]


@sweep_app.command()
def launch(
    sweep_file: Annotated[Path, typer.Argument(help="The sweep YAML file.", metavar="SWEEP.yaml")],
    address: AddressOption = None,
    store: StoreOption = DEFAULT_STORE,
    max_concurrent: ConcurrencyOption = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a sweep field: name=..., base.preset=..., resources.gpu=1, seeds=[0,1]."),
    ] = None,
) -> None:
    """Run every trial of SWEEP.yaml that the store does not hold yet (a finished sweep runs nothing).

    A name already in the store takes the same trials only: a different grid is refused, naming the difference.
    """
    from geocont.sweep.launch import launch_sweep

    options = {"address": address, "max_concurrent": max_concurrent}
    _report(lambda view: launch_sweep(sweep_file, store, set_ or [], view=view, **options))


@sweep_app.command()
def resume(
    name: Annotated[str, typer.Argument(help="The sweep's name (its folder in the store).")],
    address: AddressOption = None,
    store: StoreOption = DEFAULT_STORE,
    max_concurrent: ConcurrencyOption = None,
) -> None:
    """Finish a sweep from the store alone (its sweep.yaml), e.g. after the driver was killed."""
    from geocont.sweep.launch import resume_sweep

    _existing_store(store)
    options = {"address": address, "max_concurrent": max_concurrent}
    _report(lambda view: resume_sweep(name, store, view=view, **options))


@sweep_app.command()
def status(
    name: Annotated[str, typer.Argument(help="The sweep's name (its folder in the store).")],
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Counts by status and a table of the sweep's trials, read from the store (works while it runs)."""
    from geocont.sweep.live import METRICS, summary, table
    from geocont.sweep.status import sweep_rows

    sweep, rows, counts = sweep_rows(_existing_store(store), name)
    console = _stdout()
    console.print(f"sweep {name}: {sum(counts.values())} trials  ", summary(counts), highlight=False)
    metric = sweep.search.metric if sweep.search else None
    console.print(table(rows, dict.fromkeys(m for m in (metric, *METRICS) if m), run_ids=True))
    if counts.get("pending") or counts.get("failed") or counts.get("started"):
        console.print(f"to finish it: geocont sweep resume {name} --store {store}", style="dim", highlight=False)


def _existing_store(store: str) -> Path:
    from geocont.config import ConfigError

    if store == "":
        raise ConfigError([f"--store: empty; give the results store folder, e.g. --store {DEFAULT_STORE}"])
    if not Path(store).is_dir():
        raise ConfigError([f"--store {store}: no such folder (a results store, e.g. {DEFAULT_STORE})"])
    return Path(store)


def _stdout() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _report(run) -> None:
    """Run a launch/resume with the live view, then print what happened and set the exit code."""
    from geocont.sweep.live import SweepView
    from geocont.sweep.lock import SweepBusy

    view = SweepView()
    try:
        outcome = run(view)
    except SweepBusy as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    done = ", ".join(f"{n} {s}" for s, n in sorted(outcome.counts.items()))
    if outcome.ran == 0:
        typer.echo(f"sweep {outcome.sweep}: {outcome.total} trials ({done}); nothing to run, all are in the store")
    else:
        typer.echo(
            f"sweep {outcome.sweep}: {outcome.total} trials ({done}); ran {outcome.ran}, {outcome.skipped} already in "
            f"the store; {outcome.wall_s:.1f} s (Ray start-up {outcome.ray_start_s:.1f} s)"
        )
    retried = {run_id: n for run_id, n in outcome.attempts.items() if n > 1}
    if retried:
        typer.echo(f"retried: {', '.join(f'{r} ({n} attempts)' for r, n in retried.items())}")
    if not outcome.ok:
        raise typer.Exit(1)


def main() -> None:
    """`python -m geocont.sweep.cli ...`: the sub-app on its own, with the main CLI's error handling."""
    from geocont.entry import run

    run(sweep_app)


if __name__ == "__main__":
    main()
