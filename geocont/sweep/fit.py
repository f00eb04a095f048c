"""Run a sweep's trials on Ray Tune: the grid's trials here, an optuna search's through the same `fit`.

The results store is the truth. Before anything runs, every trial whose run.json says completed or
diverged (both deterministic) is skipped; the folders of the other trials (half-written by a killed
driver, or failed) are cleared and those trials run again. So `launch` twice runs nothing the second
time, and `resume` after a SIGKILL needs nothing but `<store>/<sweep>/sweep.yaml`: Tune's own
experiment state lives in a throwaway folder and is never read back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune

from geocont import store
from geocont.sweep import packs
from geocont.sweep.grid import expand
from geocont.sweep.placement import check_launch
from geocont.sweep.session import claim, ray_session, throwaway_dir
from geocont.sweep.spec import SweepConfig
from geocont.sweep.trainable import TrialFailed, trainable


@dataclass
class Outcome:
    """What a launch did; `counts` come from the store after the run (pending = no final status)."""

    sweep: str
    total: int
    skipped: int
    ran: int
    counts: dict[str, int]
    attempts: dict[str, int] = field(default_factory=dict)  # run_id -> attempts in this launch
    ray_start_s: float = 0.0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.counts.get("failed", 0) == 0 and self.counts.get("pending", 0) == 0


@dataclass(frozen=True)
class LaunchOptions:
    """How a launch runs its trials: on which Ray (None: an embedded one), how many at once, shown where."""

    address: str | None = None
    max_concurrent: int | None = None
    view: Any = None  # a live.SweepView, or None for no view


def run_grid(sweep: SweepConfig, text: str, store_dir: Path, options: LaunchOptions) -> Outcome:
    """Run every trial of a grid sweep that the store does not hold as done."""
    trials = expand(sweep)
    check_launch(sweep.resources.gpu, [t.config for t in trials])  # before Ray starts or anything is written
    t0 = time.perf_counter()
    with claim(store_dir, sweep.name), contextlib.ExitStack() as stack:
        pending = [t for t in trials if not store.is_done(store_dir, sweep.name, t.run_id)]
        outcome = Outcome(sweep.name, len(trials), len(trials) - len(pending), len(pending), {})
        if pending:  # a finished sweep starts no Ray at all
            outcome.ray_start_s = stack.enter_context(ray_session(options.address, sweep))
        store.record_spec(store_dir, sweep.name, text)  # only now: a bad launch (resources) writes nothing
        if pending:
            store.clear_unfinished(store_dir, sweep.name, [t.run_id for t in pending])
            if options.view is not None:
                options.view.begin(sweep, trials, {t.run_id for t in pending})
            grid = tune.grid_search([packs.payload(p) for p in packs.group(pending, sweep.resources.pack)])
            outcome.attempts = fit(sweep, store_dir, options, param_space={"trial": grid})
    outcome.wall_s = time.perf_counter() - t0
    outcome.counts = store.status_counts(store.run_status(store_dir, sweep.name, t.run_id) for t in trials)
    return outcome


def tuner(
    sweep: SweepConfig,
    store_dir: Path,
    storage: str,
    max_concurrent: int | None,
    callbacks: list,
    **tune_config: Any,
) -> tune.Tuner:
    """The Tuner every sweep uses; grid runs pass a param_space, searches a search_alg."""
    # The store has the results already: no Tune result files (and no warning that they are missing), and
    # Tune's legacy reporter, which verbose=0 silences (the new one prints its banner whatever the verbosity).
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # A failed trial is shown by the view and recorded in the store (error.txt); no traceback on the terminal.
    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    fn = tune.with_parameters(
        trainable,
        store_dir=str(store_dir),
        sweep=sweep.name,
        threads=sweep.resources.threads(),
        gpu=sweep.resources.gpu,
        cwd=os.getcwd(),
    )
    param_space = tune_config.pop("param_space", None)
    return tune.Tuner(
        tune.with_resources(fn, {"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu}),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            reuse_actors=True,  # no re-import of torch/Lightning per trial (docs/stack.md: ~3x less overhead)
            max_concurrent_trials=max_concurrent,
            trial_name_creator=lambda trial: trial.config["trial"]["name"],
            trial_dirname_creator=lambda trial: trial.trial_id,
            **tune_config,
        ),
        run_config=tune.RunConfig(
            name=sweep.name,
            storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=sweep.retries),
            verbose=0,
            callbacks=callbacks,
        ),
    )


def fit(sweep: SweepConfig, store_dir: Path, options: LaunchOptions, **tune_config: Any) -> dict[str, int]:
    """Run Tune on the connected Ray (trials from a param_space or a search_alg); returns attempts per run_id."""
    view = options.view
    tracker = AttemptTracker(view)
    with throwaway_dir() as storage:
        run = tuner(sweep, store_dir, storage, options.max_concurrent, [tracker], **tune_config)
        with view.running() if view is not None else contextlib.nullcontext():
            run.fit()
    return tracker.attempts


class AttemptTracker(tune.Callback):
    """Counts attempts per trial and forwards Tune's events to the live view (if any).

    Tune pickles its callbacks with the experiment state; the view (threads, a terminal) stays out.
    """

    def __init__(self, view: Any = None):
        self.view = view
        self.attempts: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"view": None, "attempts": dict(self.attempts)}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for member in packs.members(trial.config["trial"]):
            self.attempts[member["run_id"]] = self.attempts.get(member["run_id"], 0) + 1
        self._tell("start", trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._tell("result", trial, result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._tell("complete", trial, trial.last_result or {})

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        # a worker that died (node lost, OOM) or raised: its error reaches the driver's output before the retry
        self._tell("retry", trial, {"error": _error_line(trial.error_file, trial.config["trial"]["name"])})

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._tell("error", trial, {"error": _error_line(trial.error_file, trial.config["trial"]["name"])})

    def _tell(self, event: str, trial: Any, result: dict | None = None) -> None:
        """The event for each trial of the Tune trial (one, or a pack's members, each with its own result)."""
        if self.view is None:
            return
        result = result or {}
        for member in packs.members(trial.config["trial"]):
            self.view.event(event, member, result.get("members", {}).get(member["run_id"], result))


def _error_line(error_file: str | None, name: str) -> str:
    """The error of a failed trial: the last line of Tune's error file, less our own wrapping."""
    if not error_file or not os.path.isfile(error_file):
        return ""
    lines = [ln for ln in Path(error_file).read_text().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    _, wrapped, message = line.partition(f"{TrialFailed.__name__}: {name}: ")
    return (message if wrapped else line)[:300]
