"""An optuna search's study, kept in the store so that a search survives its driver (no Ray here).

The study is an optuna JournalStorage file, `<store>/<sweep>/optuna.journal` (append-only, safe
against a killed writer). A sampled point stands for a trial: base + sampled dotted paths + the
sweep's one seed (geocont.sweep.validate insists on one), so the sampler compares configs, not seed
noise; rerun the best configs over seeds with a grid sweep.

Crash safety: a trial left RUNNING by a killed driver is settled from the store on the next launch
(its run finished: tell the stored value; it did not: mark it failed and enqueue the same params, so
the same config and run_id run again). Diverged runs are told as FAIL (optuna ignores them) and
recorded with user attribute status.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import polars as pl
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import TrialState

from geocont import store
from geocont.config import resolve
from geocont.sweep.grid import SEED_PATH, base_raw, to_tree, trial_name
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


def open_study(store_dir: Path, sweep: SweepConfig) -> optuna.Study:
    path = store_dir / sweep.name / JOURNAL
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


def stored_outcome(store_dir: Path, sweep: SweepConfig, run_id: str) -> tuple[str, float | None] | None:
    """(status, final metric value) of a run already in the store, or None when it never finished."""
    if not store.is_done(store_dir, sweep.name, run_id):
        return None
    value = None
    metrics = store.run_dir(store_dir, sweep.name, run_id) / "metrics.parquet"
    if metrics.is_file():
        rows = pl.read_parquet(metrics).filter(pl.col("name") == sweep.search.metric).sort("step", "epoch")
        value = rows["value"][-1] if rows.height else None
    return store.run_status(store_dir, sweep.name, run_id), value


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


def reconcile(study: optuna.Study, store_dir: Path, sweep: SweepConfig) -> None:
    """Settle trials a killed driver left RUNNING, from the store (see the module docstring)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not trial.params:  # asked, never turned into a run
            mark(study, trial.number, **{REQUEUED: True})
            study.tell(trial.number, state=TrialState.FAIL)
            continue
        run_id = payload(sweep, trial.params)["run_id"]
        stored = stored_outcome(store_dir, sweep, run_id)
        if stored is not None:
            settle(study, trial.number, *stored, run_id)
            continue
        mark(study, trial.number, **{REQUEUED: True})
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, skip_if_exists=False)


def finished_count(store_dir: Path, sweep: SweepConfig) -> int:
    """Trials already settled, read without creating anything (a first launch has no journal yet)."""
    if not (store_dir / sweep.name / JOURNAL).is_file():
        return 0
    return len(finished(open_study(store_dir, sweep)))


def search_counts(study: optuna.Study, n_trials: int) -> dict[str, int]:
    """Settled trials by the status of their run; those left of n_trials are pending."""
    return store.status_counts((t.user_attrs.get("status", "failed") for t in finished(study)), total=n_trials)


def search_counts_from_store(store_dir: Path, sweep: SweepConfig) -> dict[str, int]:
    """Counts for `sweep status`, read without creating anything."""
    if not (store_dir / sweep.name / JOURNAL).is_file():
        return {"pending": sweep.search.n_trials}
    return search_counts(open_study(store_dir, sweep), sweep.search.n_trials)
