"""The driver's hold on Ray for one sweep: the claim on the sweep, and an embedded instance or a cluster.

Ray is either embedded (no --address: a private instance on 127.0.0.1 with no dashboard, no usage
stats, no token, its own temp dir under /tmp, shut down and checked for leftovers at exit) or an
existing cluster (`auto`, `host:port`, `ray://host:10001`, checked to answer before anything starts:
geocont.sweep.checks), whose store must be shared storage. A driver killed with SIGKILL leaves its
embedded Ray running; the next driver on the machine stops it (`claim`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from geocont.config import ConfigError
from geocont.sweep.lock import driver_lock
from geocont.sweep.spec import SweepConfig

EMBEDDED_ROOT = Path(tempfile.gettempdir()) / f"geocont-ray-{os.getuid()}"  # short: Ray's socket paths are capped


@contextlib.contextmanager
def claim(store_dir: Path, sweep: str) -> Iterator[None]:
    """Become the sweep's one driver (a lock in the store: see lock.py), then stop what a killed driver
    left running on this machine.

    Both before anything reads the store: an orphaned worker of a SIGKILLed driver can still finish its
    trial, and one that wrote run.json after the store was read would see its folder cleared and rerun.
    """
    with driver_lock(store_dir, sweep):
        stop_stale_instances()
        yield


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
