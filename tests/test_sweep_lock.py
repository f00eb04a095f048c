"""The sweep's driver lock in the store: one driver across hosts, stale locks taken over, nothing left."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from geocont.sweep.lock import LOCK_NAME, STALE_AFTER_S, SweepBusy, driver_lock, is_stale


def test_a_second_driver_is_refused_naming_the_holder(tmp_path):
    with driver_lock(tmp_path, "s"):
        record = json.loads((tmp_path / "s" / LOCK_NAME).read_text())
        assert record["host"] == socket.gethostname() and record["pid"] == os.getpid()
        with pytest.raises(SweepBusy, match=f"pid {os.getpid()} on {socket.gethostname()}"):
            with driver_lock(tmp_path, "s"):
                pass
    assert not (tmp_path / "s").exists()  # the lock and the folder made only for it are gone


def test_a_failed_launch_leaves_no_folder_behind(tmp_path):
    store = tmp_path / "new-store"
    with pytest.raises(RuntimeError):
        with driver_lock(store, "s"):
            raise RuntimeError("Ray did not start")
    assert not store.exists()


def test_a_dead_local_drivers_lock_is_taken_over(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "keep.txt").write_text("a result")  # the sweep folder holds results: never removed
    dead = {"host": socket.gethostname(), "pid": 2**22 + 12345, "started": time.time(), "token": "old"}
    (folder / LOCK_NAME).write_text(json.dumps(dead))
    with driver_lock(tmp_path, "s"):
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_staleness_rules():
    here, now = socket.gethostname(), time.time()
    me = {"host": here, "pid": os.getpid(), "started": now}
    assert not is_stale(me, mtime=now - 10 * STALE_AFTER_S, now=now)  # alive here: never stale, whatever mtime
    assert is_stale({**me, "started": 0.0}, mtime=now, now=now)  # the pid now belongs to a younger process
    other = {"host": "node-7", "pid": 1, "started": now - 100}
    assert not is_stale(other, mtime=now - 5, now=now)  # another host, heartbeat fresh
    assert is_stale(other, mtime=now - STALE_AFTER_S - 1, now=now)  # another host, heartbeat lost
