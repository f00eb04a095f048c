"""An optuna search run as Ray Tune trials: the study (geocont.sweep.study) behind a Tune Searcher.

The sampler runs in the driver: each `suggest` asks the study for a config, and Tune runs it through
the same trainable, train() and store as a grid trial (geocont.sweep.fit). A sampled config that is
already in the store is told from there without running; one that duplicates a trial still running
waits for that trial's value.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import optuna
from ray.tune.search import Searcher

from geocont import store
from geocont.config import resolve
from geocont.sweep.fit import LaunchOptions, Outcome, fit
from geocont.sweep.grid import base_raw
from geocont.sweep.placement import check_launch
from geocont.sweep.session import claim, ray_session
from geocont.sweep.spec import SweepConfig
from geocont.sweep.study import (
    distributions,
    finished,
    finished_count,
    open_study,
    payload,
    reconcile,
    search_counts,
    settle,
    stored_outcome,
)


class StudySearcher(Searcher):
    """Tune's view of the study: suggest = ask (deduplicated against the store), complete = tell."""

    def __init__(self, study: optuna.Study, sweep: SweepConfig, store_dir: Path, budget: int):
        super().__init__()  # no metric here: Tune's strict check would demand it in every epoch's report
        self.study, self.sweep, self.store_dir, self.budget = study, sweep, store_dir, budget
        self.space = distributions(sweep.search.space)
        self.running: dict[str, tuple[int, str]] = {}  # Tune trial id -> (optuna number, run_id)
        self.waiting: dict[str, list[int]] = {}  # run_id -> optuna numbers of duplicates waiting for it

    def suggest(self, trial_id: str) -> dict[str, Any] | str:
        while self.budget > 0:
            self.budget -= 1
            trial = self.study.ask(self.space)
            spec = payload(self.sweep, trial.params)
            run_id = spec["run_id"]
            stored = stored_outcome(self.store_dir, self.sweep, run_id)
            if stored is not None:
                settle(self.study, trial.number, *stored, run_id)
            elif any(r == run_id for _, r in self.running.values()):
                self.waiting.setdefault(run_id, []).append(trial.number)
            else:
                store.clear_unfinished(self.store_dir, self.sweep.name, [run_id])
                self.running[trial_id] = (trial.number, run_id)
                return {"trial": spec}
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.running:
            return
        number, run_id = self.running.pop(trial_id)
        if error:
            status, value = "failed", None
        else:
            status, value = (result or {}).get("run_status", "completed"), (result or {}).get(self.sweep.search.metric)
        for n in [number, *self.waiting.pop(run_id, [])]:
            settle(self.study, n, status, value, run_id)

    def save(self, checkpoint_path: str) -> None:
        pass  # the journal in the store is the state

    def restore(self, checkpoint_path: str) -> None:
        pass

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its search algorithm with the experiment state; the study (file locks) stays out.
        return {k: v for k, v in self.__dict__.items() if k != "study"}


def run_search(sweep: SweepConfig, text: str, store_dir: Path, options: LaunchOptions) -> Outcome:
    """Run what is left of the search's n_trials (all of it on first launch, the rest on resume)."""
    n_trials = sweep.search.n_trials
    check_launch(sweep.resources.gpu, [resolve(base_raw(sweep))])  # before Ray starts or anything is written
    t0 = time.perf_counter()
    with claim(store_dir, sweep.name), contextlib.ExitStack() as stack:
        done_before = finished_count(store_dir, sweep)
        outcome = Outcome(sweep.name, n_trials, done_before, 0, {})
        if done_before < n_trials:
            outcome.ray_start_s = stack.enter_context(ray_session(options.address, sweep))
        store.record_spec(store_dir, sweep.name, text)
        study = open_study(store_dir, sweep)
        reconcile(study, store_dir, sweep)
        budget = n_trials - len(finished(study))
        outcome.ran = max(budget, 0)
        if budget > 0:
            if options.view is not None:
                options.view.begin(sweep, [], set())
            searcher = StudySearcher(study, sweep, store_dir, budget)
            outcome.attempts = fit(sweep, store_dir, options, search_alg=searcher, num_samples=budget)
        outcome.counts = search_counts(study, n_trials)
    outcome.wall_s = time.perf_counter() - t0
    return outcome
