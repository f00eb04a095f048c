"""Where one attempt at a run writes, and how a finished attempt takes the run's place.

A finished result already in the store is never lost: a re-run trains aside in `.attempts/` and is
swapped in only when it finishes too (docs/store-safety.md). train() and a packed run's members
(geocont.pack) go through the same steps: `plan` (checks only, before any file), `open_attempt`
(the folder and its config.yaml), then `finish` (run.json, the trackers closed, the swap).
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from geocont import store
from geocont.config import ConfigError, RunConfig


@dataclass(frozen=True)
class Attempt:
    """One attempt at a run: which run, where its finished result lives, the data it trains on."""

    cfg: RunConfig
    run_id: str
    final_dir: Path
    digest: str | None  # the data files' fingerprint (None: data that ships with a package)


def plan(cfg: RunConfig, store_dir: str | Path, sweep: str, digest: str | None) -> Attempt:
    """The attempt at `cfg` in the store, refused (ConfigError) if its data changed under a finished result."""
    run_id = cfg.run_id()
    final_dir = store.run_dir(store_dir, sweep, run_id)
    check_same_data(cfg, final_dir, digest)
    return Attempt(cfg, run_id, final_dir, digest)


def open_attempt(attempt: Attempt, store_dir: str | Path, sweep: str) -> Path:
    """The folder the attempt writes in, with its config.yaml (and the data fingerprint) already there."""
    folder = attempt_folder(store_dir, sweep, attempt.run_id, attempt.final_dir)
    digest = {"data_fingerprint": attempt.digest} if attempt.digest else {}
    store.write_config(folder, {**attempt.cfg.to_dict(), **digest})
    return folder


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def record(
    attempt: Attempt,
    sweep: str,
    status: str,
    error: str | None,
    *,
    name: str | None,
    started: str,
    duration_s: float,
    steps: int,
    epochs: int,
    device: str,
    spikes: list,
    metrics_s: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """run.json of a finished attempt, keys in docs/contracts.md's order; `extra` (pack, a sweep's node info) last."""
    return {
        "run_id": attempt.run_id,
        "sweep": sweep,
        "status": status,
        "name": name,
        "started": started,
        "finished": now(),
        "duration_s": round(duration_s, 3),
        "steps": steps,
        "epochs": epochs,
        "error": error,
        "node": socket.gethostname(),
        "device": device,
        "spikes": spikes,
        "metrics_s": round(metrics_s, 3),
        **extra,
    }


def finish(attempt: Attempt, folder: Path, record: dict[str, Any], trackers: Any) -> Path:
    """Write the attempt's metrics and run.json, close its trackers, then move it into place; returns where it is."""
    trackers.store.publish()
    store.write_run_info(folder, record)  # the record is final before any tracker is closed
    trackers.close()
    return settle(folder, attempt.final_dir, record["status"])  # after the trackers: their files move with it


def check_same_data(cfg: RunConfig, folder: Path, digest: str | None) -> None:
    """A finished run trained on other files under the same data.path is not this run: refuse to mix them."""
    if digest is None or store.result_info(folder) is None:
        return
    recorded = store.recorded_fingerprint(folder)
    if recorded is not None and recorded != digest:  # None: recorded before fingerprints, nothing to compare
        raise ConfigError(
            [
                f"data.path: the files in {cfg.data.path} changed since run {cfg.run_id()} ({folder}) was trained on "
                "them; restore them, or move that run folder out of the store to train on the new files"
            ]
        )


def attempt_folder(store_dir: str | Path, sweep: str, run_id: str, final_dir: Path) -> Path:
    """Where this attempt writes: aside when a finished result is in place, else the run folder itself."""
    if store.result_info(final_dir) is not None:
        return store.new_attempt(store_dir, sweep, run_id)
    if final_dir.exists():
        shutil.rmtree(final_dir)  # a failed or killed attempt's leftovers: nothing finished to keep
    final_dir.mkdir(parents=True)
    return final_dir


def settle(attempt: Path, final_dir: Path, status: str) -> Path:
    """Swap a finished re-run into the run's place; keep a failed one aside (its error.txt), replacing an older one."""
    if attempt == final_dir:
        return final_dir
    if status in store.RESULTS:
        store.replace_dir(attempt, final_dir)
        return final_dir
    failed = attempt.with_name(f"{final_dir.name}.failed")
    if failed.exists():
        shutil.rmtree(failed)
    attempt.rename(failed)
    return failed
