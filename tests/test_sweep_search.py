"""The optuna side of a search without Ray: the journal study, settling after a killed driver, deduplication."""

from __future__ import annotations

from optuna.trial import TrialState

from geocont import store
from geocont.sweep.load import parse_sweep
from geocont.sweep.search import StudySearcher
from geocont.sweep.study import distributions, finished, open_study, payload, reconcile, search_counts

TINY = {"model": {"kind": "mlp", "depth": 3, "width": 16}, "data": {"name": "digits"}, "train": {"epochs": 1}}


def search_sweep(space, n_trials=3):
    search = {"metric": "val/acc", "mode": "max", "n_trials": n_trials, "space": space}
    return parse_sweep({"name": "s", "base": TINY, "search": search, "tracking": {"wandb": {"mode": "disabled"}}})


def store_run(store_dir, sweep, params, status="completed", acc=0.5):
    """A finished run in the store, as train() leaves it."""
    spec = payload(sweep, params)
    folder = store.run_dir(store_dir, sweep.name, spec["run_id"])
    store.write_config(folder, spec["config"])
    rows = [{"run_id": spec["run_id"], "epoch": 1, "step": 10, "name": "val/acc", "value": acc}]
    store.write_metrics(folder, rows)
    store.write_run_info(folder, {"run_id": spec["run_id"], "sweep": sweep.name, "status": status})
    return spec["run_id"]


LR = {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}}
ONE_CHOICE = {"model.activation": {"type": "categorical", "choices": ["relu"]}}


def test_distributions_follow_the_sweep_file():
    space = {
        **LR,
        "model.depth": {"type": "int", "low": 2, "high": 8, "step": 2},
        "model.activation": {"type": "categorical", "choices": ["relu", "gelu"]},
    }
    dists = distributions(search_sweep(space).search.space)
    assert (dists["optim.lr"].low, dists["optim.lr"].high, dists["optim.lr"].log) == (1e-4, 1e-1, True)
    assert (dists["model.depth"].low, dists["model.depth"].high, dists["model.depth"].step) == (2, 8, 2)
    assert dists["model.activation"].choices == ("relu", "gelu")


def test_trials_left_running_by_a_killed_driver_are_settled_from_the_store(tmp_path):
    sweep = search_sweep(LR)
    study = open_study(tmp_path, sweep)
    ran = study.ask(distributions(sweep.search.space))  # finished in the store before the kill
    lost = study.ask(distributions(sweep.search.space))  # killed mid-run: nothing final in the store
    run_id = store_run(tmp_path, sweep, ran.params, acc=0.75)

    reconcile(open_study(tmp_path, sweep), tmp_path, sweep)  # a new driver, reading the journal back

    study = open_study(tmp_path, sweep)
    trials = study.get_trials()
    assert trials[ran.number].state == TrialState.COMPLETE and trials[ran.number].value == 0.75
    assert trials[ran.number].user_attrs["run_id"] == run_id
    assert trials[lost.number].state == TrialState.FAIL and trials[lost.number].user_attrs["requeued"]
    assert [t.number for t in finished(study)] == [ran.number]  # the lost one is not counted: it runs again
    again = study.ask(distributions(sweep.search.space))
    assert again.params == lost.params  # same params, so the same run_id
    assert search_counts(study, 3) == {"completed": 1, "pending": 2}


def test_configs_already_in_the_store_are_told_without_running(tmp_path):
    sweep = search_sweep(ONE_CHOICE)
    store_run(tmp_path, sweep, {"model.activation": "relu"}, acc=0.6)
    study = open_study(tmp_path, sweep)
    searcher = StudySearcher(study, sweep, tmp_path, budget=3)
    assert searcher.suggest("t1") == StudySearcher.FINISHED
    assert [t.value for t in finished(study)] == [0.6, 0.6, 0.6]


def test_a_duplicate_of_a_running_config_waits_for_its_value(tmp_path):
    sweep = search_sweep(ONE_CHOICE)
    study = open_study(tmp_path, sweep)
    searcher = StudySearcher(study, sweep, tmp_path, budget=3)
    first = searcher.suggest("t1")
    assert first["trial"]["name"] == "act=relu seed=0"
    assert searcher.suggest("t2") == StudySearcher.FINISHED  # the other two asks repeat the running config
    searcher.on_trial_complete("t1", {"val/acc": 0.4, "run_status": "completed"})
    assert [t.value for t in finished(study)] == [0.4, 0.4, 0.4]


def test_diverged_and_failed_trials_count_but_are_not_values(tmp_path):
    sweep = search_sweep(LR, n_trials=2)
    study = open_study(tmp_path, sweep)
    searcher = StudySearcher(study, sweep, tmp_path, budget=2)
    searcher.suggest("t1")
    searcher.suggest("t2")
    searcher.on_trial_complete("t1", {"val/acc": float("nan"), "run_status": "diverged"})
    searcher.on_trial_complete("t2", None, error=True)
    assert search_counts(study, 2) == {"diverged": 1, "failed": 1}
    assert all(t.state == TrialState.FAIL for t in finished(study))
