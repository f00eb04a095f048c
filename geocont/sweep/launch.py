"""The front door of `geocont sweep launch` and `resume`: read the sweep, check the launch, run it.

Reading (geocont.sweep.load) and the launch checks (geocont.sweep.checks) raise ConfigError before
Ray starts or anything is written; then a grid sweep runs through geocont.sweep.fit, a sweep with a
`search` block through geocont.sweep.search.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from geocont.sweep.checks import check_launch
from geocont.sweep.load import launch_text, stored_sweep
from geocont.sweep.spec import SweepConfig

if TYPE_CHECKING:
    from geocont.sweep.fit import Outcome


def launch_sweep(
    path: str | Path, store_dir: str | Path, overrides: list[str] | None = None, **options: Any
) -> Outcome:
    """Validate SWEEP.yaml (+ `--set` overrides) and its launch, then run every trial not yet done."""
    sweep, text = launch_text(path, overrides or [])
    check_launch(sweep, str(store_dir), options.get("address"))
    return run_sweep(sweep, text, store_dir, **options)


def resume_sweep(name: str, store_dir: str | Path, **options: Any) -> Outcome:
    """Finish a sweep from the store alone: re-read `<store>/<name>/sweep.yaml` and run what is not done."""
    sweep, text = stored_sweep(store_dir, name)
    check_launch(sweep, str(store_dir), options.get("address"), relaunch=False)
    return run_sweep(sweep, text, store_dir, **options)


def run_sweep(
    sweep: SweepConfig,
    text: str,
    store_dir: str | Path,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    view: Any = None,
) -> Outcome:
    """Run a validated sweep: grid trials, or an optuna search when the sweep has a `search` block."""
    # Here, not at the top: Ray and Tune take seconds to import, and bad input is answered without them.
    from geocont.sweep.fit import LaunchOptions, run_grid
    from geocont.sweep.search import run_search

    run = run_grid if sweep.search is None else run_search
    options = LaunchOptions(address, max_concurrent, view)
    return run(sweep, text, Path(store_dir).absolute(), options)  # absolute: trials run in other processes too
