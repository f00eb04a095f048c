"""Where one attempt at a run writes, and how a finished attempt takes the run's place.

A finished result already in the store is never lost: a re-run trains aside in `.attempts/` and is
swapped in only when it finishes too (docs/store-safety.md). train() and a packed run's members
(geocont.pack) go through the same three steps: check_same_data, attempt_folder, settle.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from geocont import store
from geocont.config import ConfigError, RunConfig


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
