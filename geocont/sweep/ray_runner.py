"""Run a sweep's trials on Ray Tune: one function trainable that calls the same train(cfg) as the CLI.

The results store is the truth. Before anything runs, every trial whose run.json says completed or
diverged (both deterministic) is skipped; the folders of the other trials (half-written by a killed
driver, or failed) are cleared and those trials run again. So `launch` twice runs nothing the second
time, and `resume` after a SIGKILL needs nothing but `<store>/<sweep>/sweep.yaml`: Tune's own
experiment state lives in a throwaway folder and is never read back.

Ray is either embedded (no --address: a private instance on 127.0.0.1 with no dashboard, no usage
stats, no token, its own temp dir under /tmp, shut down and checked for leftovers at exit) or an
existing cluster (`auto`, `host:port`, `ray://host:10001`), whose store must be shared storage.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune

from geocont import store as results
from geocont.config import ConfigError
from geocont.sweep.grid import expand
from geocont.sweep.lock import driver_lock
from geocont.sweep.placement import check_launch, trial_accelerator
from geocont.sweep.spec import SweepConfig

DONE = ("completed", "diverged")  # deterministic outcomes: never run again
REPORT_EVERY_S = 1.0  # a trial's progress reports to Tune (the live view), at most this often
EMBEDDED_ROOT = Path(tempfile.gettempdir()) / f"geocont-ray-{os.getuid()}"  # short: Ray's socket paths are capped


class TrialFailed(RuntimeError):
    """Raised inside a trial when train() recorded `failed`, so Tune's FailureConfig retries it."""


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


# ---------------------------------------------------------------------------------------------
# Entry points


def launch(path: str | Path, store: str | Path, overrides: list[str] | None = None, **options: Any) -> Outcome:
    """Validate SWEEP.yaml (+ `--set` overrides; ConfigError, nothing written), then run every trial not yet done."""
    from geocont.sweep.spec import load_sweep, with_overrides

    if overrides:
        sweep, text = with_overrides(path, overrides)
        return run_sweep(sweep, text, store, **options)
    return run_sweep(load_sweep(path), Path(path).read_text(), store, **options)


def resume(name: str, store: str | Path, **options: Any) -> Outcome:
    """Finish a sweep from the store alone: re-read `<store>/<name>/sweep.yaml` and run what is not done."""
    from geocont.sweep.status import stored_sweep

    sweep, text = stored_sweep(store, name)
    return run_sweep(sweep, text, store, **options)


def run_sweep(
    sweep: SweepConfig,
    text: str,
    store: str | Path,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    view: Any = None,
) -> Outcome:
    """Run a validated sweep: grid trials, or an optuna search when the sweep has a `search` block."""
    store = Path(store).absolute()  # trials may run in other processes and on other nodes
    if sweep.search is not None:
        from geocont.sweep.optuna_search import run_search

        return run_search(sweep, text, store, address=address, max_concurrent=max_concurrent, view=view)
    trials = expand(sweep)
    check_launch(sweep.resources.gpu, [t.config for t in trials])  # before Ray starts or anything is written
    t0 = time.perf_counter()
    with claim(store, sweep.name), contextlib.ExitStack() as stack:
        pending = [t for t in trials if not is_done(store, sweep.name, t.run_id)]
        outcome = Outcome(sweep.name, len(trials), len(trials) - len(pending), len(pending), {})
        if pending:  # a finished sweep starts no Ray at all
            outcome.ray_start_s = stack.enter_context(ray_session(address, sweep))
        record_spec(store, sweep.name, text)  # only now: a bad launch (resources) writes nothing
        if pending:
            clear_unfinished(store, sweep.name, [t.run_id for t in pending])
            if view is not None:
                view.begin(sweep, trials, {t.run_id for t in pending})
            grid = tune.grid_search([t.payload() for t in pending])
            outcome.attempts = fit(sweep, store, max_concurrent, view, param_space={"trial": grid})
    outcome.wall_s = time.perf_counter() - t0
    outcome.counts = status_counts(store, sweep.name, [t.run_id for t in trials])
    return outcome


# ---------------------------------------------------------------------------------------------
# The store as the truth


def is_done(store: Path, sweep: str, run_id: str) -> bool:
    info = results.read_run_info(store, sweep, run_id)
    return info is not None and info.get("status") in DONE


def clear_unfinished(store: Path, sweep: str, run_ids: list[str]) -> None:
    """Remove what a killed or failed attempt left (partial metrics, error.txt): the rerun starts clean."""
    for run_id in run_ids:
        folder = results.run_dir(store, sweep, run_id)
        if folder.exists():
            shutil.rmtree(folder)


def status_counts(store: Path, sweep: str, run_ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run_id in run_ids:
        info = results.read_run_info(store, sweep, run_id)
        status = info["status"] if info else "pending"
        counts[status] = counts.get(status, 0) + 1
    return counts


def record_spec(store: Path, sweep: str, text: str) -> None:
    """`<store>/<sweep>/sweep.yaml`: the sweep as launched, all that `resume` needs."""
    spec = store / sweep / "sweep.yaml"
    if not spec.is_file() or spec.read_text() != text:
        results.write_sweep_spec(store, sweep, text)


@contextlib.contextmanager
def claim(store: Path, sweep: str) -> Iterator[None]:
    """Become the sweep's one driver (a lock in the store: see lock.py), then stop what a killed driver
    left running on this machine.

    Both before anything reads the store: an orphaned worker of a SIGKILLed driver can still finish its
    trial, and one that wrote run.json after the store was read would see its folder cleared and rerun.
    """
    with driver_lock(store, sweep):
        stop_stale_instances()
        yield


# ---------------------------------------------------------------------------------------------
# Ray: embedded instance or existing cluster


@contextlib.contextmanager
def ray_session(address: str | None, sweep: SweepConfig) -> Iterator[float]:
    """Connect to Ray for the duration of a sweep; yields the seconds start-up took."""
    if ray.is_initialized():  # a caller (a notebook, a test) already connected: use that
        yield 0.0
        return
    t0 = time.perf_counter()
    if address is None:
        with embedded_ray() as _:
            check_resources(sweep, embedded=True)
            yield time.perf_counter() - t0
        return
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        check_resources(sweep, embedded=False)
        yield time.perf_counter() - t0
    finally:
        ray.shutdown()


@contextlib.contextmanager
def embedded_ray() -> Iterator[Path]:
    """A private single-node Ray on loopback; afterwards no process of it is left running."""
    temp = EMBEDDED_ROOT / str(os.getpid())
    temp.mkdir(parents=True, exist_ok=True)
    # Loopback only: no token needed, and Ray's "not a cluster" switch keeps every port on 127.0.0.1.
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    cluster_switch = ray._private.ray_constants.ENABLE_RAY_CLUSTER  # read at import: set it for this instance
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(
            address="local",
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            _temp_dir=str(temp),
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        yield temp
    finally:
        ray.shutdown()
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = cluster_switch
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        stop_processes(ray_processes(temp))
        shutil.rmtree(temp, ignore_errors=True)


def check_resources(sweep: SweepConfig, embedded: bool) -> None:
    """A trial that fits on no node would wait forever: say so instead (an error locally, a warning on a cluster)."""
    need = {"CPU": sweep.resources.cpu, "GPU": sweep.resources.gpu}
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    problems = []
    for key, amount in need.items():
        largest = max((n.get(key, 0.0) for n in nodes), default=0.0)
        if amount > largest:
            what = "this machine has" if embedded else "the largest node has"
            problems.append(f"resources.{key.lower()}: {amount:g} per trial but {what} {largest:g}")
    if problems and embedded:
        raise ConfigError(problems)
    for line in problems:
        logging.getLogger(__name__).warning("%s (waiting for the autoscaler, if any)", line)


def ray_processes(temp: Path) -> list:
    """This user's processes that belong to the Ray instance under `temp` (by argument or open log file).

    Ray renames its workers and agents (`ray::DashboardAgent`), so names cannot tell; every one of them
    keeps a log file open in its session folder, which can.
    """
    import psutil  # vendored by ray (ray/thirdparty_files)

    root, me, uid = f"{temp}{os.sep}", os.getpid(), os.getuid()  # the separator: .../123/ is not .../1234/
    found = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            if any(root in f"{arg}{os.sep}" for arg in proc.info["cmdline"] or ()) or any(
                f.path.startswith(root) for f in proc.open_files()
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_processes(procs: list, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is still there (Ray's agents ignore SIGTERM once orphaned)."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def stop_stale_instances() -> None:
    """Stop what a killed driver left behind: its embedded Ray and Tune's folder (named by the driver's pid)."""
    import psutil

    if not EMBEDDED_ROOT.is_dir():
        return
    for folder in EMBEDDED_ROOT.iterdir():
        if not folder.name.isdigit() or _driver_alive(int(folder.name), folder, psutil):
            continue  # not an instance folder (the locks), or its driver still runs
        stop_processes(ray_processes(folder), grace_s=0.5)  # orphans of a dead driver: nothing to wait for
        shutil.rmtree(folder, ignore_errors=True)


def _driver_alive(pid: int, folder: Path, psutil: Any) -> bool:
    try:
        # A recycled pid belongs to a process younger than the folder.
        return psutil.Process(pid).create_time() <= folder.stat().st_mtime + 1
    except (psutil.NoSuchProcess, FileNotFoundError):
        return False


# ---------------------------------------------------------------------------------------------
# Tune


def trainable(config: dict[str, Any], *, store: str, sweep: str, threads: int, gpu: float, cwd: str) -> None:
    """One trial: train(cfg) with live metrics to Tune; raises on `failed` so FailureConfig retries it."""
    from geocont.config import RunConfig, deep_merge

    spec = config["trial"]
    # one wandb group per sweep (tracking is not part of the run_id: the run stays the same run)
    cfg = RunConfig.model_validate(deep_merge(spec["config"], {"tracking": {"wandb": {"group": sweep}}}))
    accelerator = trial_accelerator(gpu, cfg.train.accelerator)  # first: hides the GPUs before torch looks

    import torch

    from geocont.train import train

    torch.set_num_threads(threads)
    if os.path.isdir(cwd):  # Tune moved us into its trial folder: relative paths mean what they mean to the CLI
        os.chdir(cwd)
    node_id = ray.get_runtime_context().get_node_id()
    info = {
        "node": f"{ray.util.get_node_ip_address()}/{node_id[:8]}",
        "node_id": node_id,
        "worker_pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if is_done(Path(store), sweep, spec["run_id"]):  # an earlier attempt finished, then its worker died
        tune.report({"run_status": results.read_run_info(store, sweep, spec["run_id"])["status"]})
        return  # (an unfinished folder of a lost attempt is cleared by train() itself)
    last_epoch, last_report = 0, -math.inf

    def on_metrics(epoch: int, step: int, values: dict[str, float]) -> None:
        # Progress for the live view only (the store has every value, and the final report below carries
        # the results): a report waits for the driver to take it, so fast epochs report once a second.
        nonlocal last_epoch, last_report
        last_epoch = epoch
        if time.monotonic() - last_report >= REPORT_EVERY_S:
            last_report = time.monotonic()
            tune.report({"epoch": epoch, "step": step, "node": info["node"], **values})

    try:
        result = train(
            cfg,
            store,
            sweep,
            on_metrics=on_metrics,
            run_name=spec["name"],
            info=info,
            progress=False,
            accelerator=accelerator,
        )
    except Exception as err:  # train() raises for bad input met only here (a missing data folder): still a trial
        error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        record_failure(Path(store), sweep, cfg, spec["name"], error, info)
        raise TrialFailed(f"{spec['name']}: {error}") from None  # a plain message: any exception must unpickle
    if result.status == "failed":
        raise TrialFailed(f"{spec['name']}: {result.error}")
    tune.report({"epoch": last_epoch, "node": info["node"], "run_status": result.status, **result.final})


def record_failure(store: Path, sweep: str, config: Any, name: str, error: str, info: dict[str, Any]) -> None:
    """The store's record of a trial whose train() raised instead of recording the failure itself."""
    folder = results.run_dir(store, sweep, config.run_id())
    results.write_config(folder, config.to_dict())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    record = {"run_id": config.run_id(), "sweep": sweep, "status": "failed", "name": name, "error": error}
    results.write_run_info(folder, {**record, "started": stamp, "finished": stamp, **info})


def tuner(
    sweep: SweepConfig,
    store: Path,
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
        store=str(store),
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


def fit(
    sweep: SweepConfig, store: Path, max_concurrent: int | None, view: Any = None, **tune_config: Any
) -> dict[str, int]:
    """Run Tune on the connected Ray (trials from a param_space or a search_alg); returns attempts per run_id."""
    tracker = AttemptTracker(view)
    with throwaway_dir() as storage:
        run = tuner(sweep, store, storage, max_concurrent, [tracker], **tune_config)
        with view.running() if view is not None else contextlib.nullcontext():
            run.fit()
    return tracker.attempts


@contextlib.contextmanager
def throwaway_dir() -> Iterator[str]:
    """Tune's experiment folder, inside this driver's folder: a killed driver's is removed with its Ray."""
    path = EMBEDDED_ROOT / str(os.getpid()) / "tune"
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):  # the driver's folder, when no embedded Ray shares it
            path.parent.rmdir()


class AttemptTracker(tune.Callback):
    """Counts attempts per trial and forwards Tune's events to the live view (if any).

    Tune pickles its callbacks with the experiment state; the view (threads, a terminal) stays out.
    """

    def __init__(self, view: Any = None):
        self.view = view
        self.attempts: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"view": None, "attempts": dict(self.attempts)}

    @staticmethod
    def _run_id(trial: Any) -> str:
        return trial.config["trial"]["run_id"]

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self._run_id(trial)
        self.attempts[run_id] = self.attempts.get(run_id, 0) + 1
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
        if self.view is not None:
            self.view.event(event, trial.config["trial"], result or {})


def _error_line(error_file: str | None, name: str) -> str:
    """The error of a failed trial: the last line of Tune's error file, less our own wrapping."""
    if not error_file or not os.path.isfile(error_file):
        return ""
    lines = [ln for ln in Path(error_file).read_text().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    _, wrapped, message = line.partition(f"{TrialFailed.__name__}: {name}: ")
    return (message if wrapped else line)[:300]
