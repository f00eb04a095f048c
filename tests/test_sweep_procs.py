"""Finding and stopping an embedded Ray's processes by the folder they keep files open in (no Ray needed).

Only processes started here are stopped: stand-ins that hold a file open the way Ray's renamed workers
and agents hold their logs.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from geocont.sweep import session

HOLD = "import sys, time; f = open(sys.argv[1], 'a'); print('ready', flush=True); time.sleep(120)"


@pytest.fixture
def holders():
    started: list[subprocess.Popen] = []

    def hold(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        started.append(proc)
        return proc

    yield hold
    for proc in started:
        proc.kill()
        proc.wait()


def test_processes_are_found_by_their_folder_not_a_prefix_of_it(tmp_path, holders):
    mine = holders(tmp_path / "123" / "session" / "logs" / "raylet.out")
    other = holders(tmp_path / "1234" / "session" / "logs" / "raylet.out")
    assert [p.pid for p in session.ray_processes(tmp_path / "123")] == [mine.pid]
    assert [p.pid for p in session.ray_processes(tmp_path / "1234")] == [other.pid]


def test_stale_instances_are_stopped_and_live_drivers_and_locks_left_alone(tmp_path, holders, monkeypatch):
    monkeypatch.setattr(session, "EMBEDDED_ROOT", tmp_path)
    dead_driver = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_driver.wait()
    orphan = holders(tmp_path / str(dead_driver.pid) / "session" / "logs" / "dashboard_agent.log")
    locker = holders(tmp_path / "locks" / "abc.lock")  # a running driver holds its sweep lock open
    live = holders(tmp_path / str(locker.pid) / "session" / "logs" / "raylet.out")  # that driver's own Ray

    session.stop_stale_instances()

    deadline = time.monotonic() + 10
    while orphan.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert orphan.poll() is not None and not (tmp_path / str(dead_driver.pid)).exists()
    assert locker.poll() is None and live.poll() is None
    assert (tmp_path / "locks" / "abc.lock").exists() and (tmp_path / str(locker.pid)).exists()
