"""One driver per sweep, across every host that shares the store: a lock file in the store itself.

`<store>/<sweep>/.driver.lock` names the holder (host, pid, start time) and is created with O_EXCL,
which is atomic on local disks and on NFS v3+. A driver refreshes the file's mtime every
HEARTBEAT_S seconds while it holds it. A lock is stale, and may be taken over, when
- it was made on this host and its process is gone (or the pid now belongs to a younger process):
  seen at once, e.g. right after a SIGKILL;
- it was made on another host and its heartbeat is older than STALE_AFTER_S (a dead node cannot
  clean up; the margin absorbs clock skew between hosts).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCK_NAME = ".driver.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0


class SweepBusy(RuntimeError):
    """Another driver holds this sweep."""


@contextlib.contextmanager
def driver_lock(store: Path, sweep: str) -> Iterator[None]:
    """Hold the sweep's lock for the block; a folder made only for the lock is removed again."""
    folder = store / sweep
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first: removed again, if empty
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "token": uuid.uuid4().hex}
    try:
        _acquire(path, me)
    except BaseException:
        _remove_empty(made)
        raise
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, stop), name="sweep-lock-heartbeat", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        if holder(path).get("token") == me["token"]:
            path.unlink(missing_ok=True)
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        with contextlib.suppress(OSError):  # only when nothing else was written there
            folder.rmdir()


def holder(path: Path) -> dict[str, Any]:
    """The lock's record ({} when there is none or it is unreadable)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def is_stale(record: dict[str, Any], mtime: float, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    if record.get("host") == socket.gethostname():
        return not _process_alive(record.get("pid"), record.get("started", 0.0))
    return now - mtime > STALE_AFTER_S


def _acquire(path: Path, me: dict[str, Any]) -> None:
    for _ in range(3):  # a takeover can race another driver's: O_EXCL decides who wins
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            _take_over_if_stale(path)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    record = holder(path)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
    raise SweepBusy(
        f"sweep {path.parent.name!r} in {path.parent.parent} is being run by another driver "
        f"(pid {record.get('pid')} on {record.get('host')}, since {since}); if that driver is gone, remove {path}"
    )


def _take_over_if_stale(path: Path) -> None:
    record = holder(path)
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return  # released meanwhile: try again
    if not record or not is_stale(record, mtime):
        return
    aside = path.with_name(f"{LOCK_NAME}.stale-{uuid.uuid4().hex[:8]}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, aside)
        if holder(aside).get("token") != record.get("token"):  # we moved a fresh lock of another driver: undo
            os.replace(aside, path)
            return
        aside.unlink()


def _heartbeat(path: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        with contextlib.suppress(OSError):
            os.utime(path)


def _process_alive(pid: Any, started: float) -> bool:
    import psutil

    try:
        return psutil.Process(int(pid)).create_time() <= started + 1  # a recycled pid is younger than the lock
    except (psutil.NoSuchProcess, TypeError, ValueError):
        return False
