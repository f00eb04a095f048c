"""An optuna search run as Ray Tune trials; the study lives in the store, so a search survives its driver.

The sampler runs in the driver behind a Tune Searcher: each `suggest` asks the study for a config
(base + sampled dotted paths + the sweep's one seed), and Tune runs it through the same trainable,
train() and store as a grid trial. The study is an optuna JournalStorage file,
`<store>/<sweep>/optuna.journal` (append-only, safe against a killed writer).

Seeds: a search runs every sampled config with the sweep's single seed (spec.py insists on one), so
the sampler compares configs, not seed noise; rerun the best configs over seeds with a grid sweep.

Crash safety: a trial left RUNNING by a killed driver is settled from the store on the next launch
(its run finished: tell the stored value; it did not: mark it failed and enqueue the same params, so
the same config and run_id run again). A sampled config that is already in the store is told from
there without running; one that duplicates a trial still running waits for that trial's value.
Diverged runs are told as FAIL (optuna ignores them) and recorded with user attribute status.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import optuna
import polars as pl
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import TrialState
from ray.tune.search import Searcher

from geocont import store as results
from geocont.config import resolve
from geocont.sweep import ray_runner
from geocont.sweep.grid import SEED_PATH, base_raw, to_tree, trial_name
from geocont.sweep.placement import check_launch
from geocont.sweep.spec import SpaceParam, SweepConfig

JOURNAL = "optuna.journal"
REQUEUED = "requeued"  # user attribute of a trial failed only to be run again


def distributions(space: dict[str, SpaceParam]) -> dict[str, BaseDistribution]:
    """Sweep-file parameters as optuna distributions, keyed by dotted path."""
    out: dict[str, BaseDistribution] = {}
    for path, p in space.items():
        if p.type == "categorical":
            out[path] = CategoricalDistribution(p.choices)
        elif p.type == "int":
            out[path] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        else:
            out[path] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def open_study(store: Path, sweep: SweepConfig) -> optuna.Study:
    path = store / sweep.name / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
    search = sweep.search
    sampler_cls = optuna.samplers.TPESampler if search.sampler == "tpe" else optuna.samplers.RandomSampler
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=sweep.name,
        storage=storage,
        sampler=sampler_cls(seed=search.seed),
        direction="minimize" if search.mode == "min" else "maximize",
        load_if_exists=True,
    )


def payload(sweep: SweepConfig, params: dict[str, Any]) -> dict[str, Any]:
    """The trial that a sampled point stands for, in the same plain form as a grid trial's."""
    config = resolve(base_raw(sweep), to_tree({**params, SEED_PATH: sweep.seeds[0]}))
    return {"run_id": config.run_id(), "name": trial_name(config, list(params)), "config": config.to_dict()}


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count against n_trials (a requeued one is counted through its replacement)."""
    states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    return [t for t in study.get_trials(deepcopy=False, states=states) if not t.user_attrs.get(REQUEUED)]


def stored_outcome(store: Path, sweep: SweepConfig, run_id: str) -> tuple[str, float | None] | None:
    """(status, final metric value) of a run already in the store, or None when it never finished."""
    info = results.read_run_info(store, sweep.name, run_id)
    if info is None or info.get("status") not in ray_runner.DONE:
        return None
    value = None
    metrics = results.run_dir(store, sweep.name, run_id) / "metrics.parquet"
    if metrics.is_file():
        rows = pl.read_parquet(metrics).filter(pl.col("name") == sweep.search.metric).sort("step", "epoch")
        value = rows["value"][-1] if rows.height else None
    return info["status"], value


def mark(study: optuna.Study, trial_number: int, **attrs: Any) -> None:
    """Set user attributes of a trial known by number (optuna's public API only does it via a live Trial)."""
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, trial_number)
    for key, value in attrs.items():
        study._storage.set_trial_user_attr(trial_id, key, value)


def settle(study: optuna.Study, trial_number: int, status: str, value: float | None, run_id: str) -> None:
    """Tell the study how a trial ended; diverged or metric-less runs are FAIL (optuna ignores them)."""
    mark(study, trial_number, status=status, run_id=run_id)
    usable = status == "completed" and value is not None and math.isfinite(value)
    study.tell(trial_number, value if usable else None, state=TrialState.COMPLETE if usable else TrialState.FAIL)


def reconcile(study: optuna.Study, store: Path, sweep: SweepConfig) -> None:
    """Settle trials a killed driver left RUNNING, from the store (see the module docstring)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not trial.params:  # asked, never turned into a run
            mark(study, trial.number, **{REQUEUED: True})
            study.tell(trial.number, state=TrialState.FAIL)
            continue
        run_id = payload(sweep, trial.params)["run_id"]
        stored = stored_outcome(store, sweep, run_id)
        if stored is not None:
            settle(study, trial.number, *stored, run_id)
            continue
        mark(study, trial.number, **{REQUEUED: True})
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, skip_if_exists=False)


class StudySearcher(Searcher):
    """Tune's view of the study: suggest = ask (deduplicated against the store), complete = tell."""

    def __init__(self, study: optuna.Study, sweep: SweepConfig, store: Path, budget: int):
        super().__init__()  # no metric here: Tune's strict check would demand it in every epoch's report
        self.study, self.sweep, self.store, self.budget = study, sweep, store, budget
        self.space = distributions(sweep.search.space)
        self.running: dict[str, tuple[int, str]] = {}  # Tune trial id -> (optuna number, run_id)
        self.waiting: dict[str, list[int]] = {}  # run_id -> optuna numbers of duplicates waiting for it

    def suggest(self, trial_id: str) -> dict[str, Any] | str:
        while self.budget > 0:
            self.budget -= 1
            trial = self.study.ask(self.space)
            spec = payload(self.sweep, trial.params)
            run_id = spec["run_id"]
            stored = stored_outcome(self.store, self.sweep, run_id)
            if stored is not None:
                settle(self.study, trial.number, *stored, run_id)
            elif any(r == run_id for _, r in self.running.values()):
                self.waiting.setdefault(run_id, []).append(trial.number)
            else:
                ray_runner.clear_unfinished(self.store, self.sweep.name, [run_id])
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


def run_search(
    sweep: SweepConfig,
    text: str,
    store: Path,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    view: Any = None,
) -> ray_runner.Outcome:
    """Run what is left of the search's n_trials (all of it on first launch, the rest on resume)."""
    n_trials = sweep.search.n_trials
    check_launch(sweep.resources.gpu, [resolve(base_raw(sweep))])  # before Ray starts or anything is written
    t0 = time.perf_counter()
    with ray_runner.claim(store, sweep.name), contextlib.ExitStack() as stack:
        done_before = _finished_count(store, sweep)
        outcome = ray_runner.Outcome(sweep.name, n_trials, done_before, 0, {})
        if done_before < n_trials:
            outcome.ray_start_s = stack.enter_context(ray_runner.ray_session(address, sweep))
        ray_runner.record_spec(store, sweep.name, text)
        study = open_study(store, sweep)
        reconcile(study, store, sweep)
        budget = n_trials - len(finished(study))
        outcome.ran = max(budget, 0)
        if budget > 0:
            if view is not None:
                view.begin(sweep, [], set())
            searcher = StudySearcher(study, sweep, store, budget)
            outcome.attempts = ray_runner.fit(
                sweep, store, max_concurrent, view, search_alg=searcher, num_samples=budget
            )
        outcome.counts = search_counts(study, n_trials)
    outcome.wall_s = time.perf_counter() - t0
    return outcome


def _finished_count(store: Path, sweep: SweepConfig) -> int:
    """Trials already settled, read without creating anything (a first launch has no journal yet)."""
    if not (store / sweep.name / JOURNAL).is_file():
        return 0
    return len(finished(open_study(store, sweep)))


def search_counts(study: optuna.Study, n_trials: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    done = finished(study)
    for t in done:
        status = t.user_attrs.get("status", "failed")
        counts[status] = counts.get(status, 0) + 1
    if n_trials > len(done):
        counts["pending"] = n_trials - len(done)
    return counts


def search_counts_from_store(store: Path, sweep: SweepConfig) -> dict[str, int]:
    """Counts for `sweep status`, read without creating anything."""
    if not (store / sweep.name / JOURNAL).is_file():
        return {"pending": sweep.search.n_trials}
    return search_counts(open_study(store, sweep), sweep.search.n_trials)
