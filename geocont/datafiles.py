"""What a data config reads from disk: its files, a fingerprint of their content, and checks made up front.

The run_id hashes the config, not the data: a `data.path` whose files were replaced would give the same
run_id. train() records `fingerprint(data)` in config.yaml and compares it with the stored one, so new
files are never silently mixed with a run trained on the old ones (docs/store-safety.md).

Everything here runs before Lightning is imported or a file is written: bad data is a one-line
ConfigError (exit 2), not a trial that starts, fails and is retried.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from geocont.config import ConfigError, DataConfig

DIGITS_SAMPLES = 1797  # sklearn's bundled digits: a fixed set


def data_files(data: DataConfig) -> list[Path] | None:
    """The files a config with a `data.path` reads, in a stable order (None without a path)."""
    if data.path is None or data.name in ("digits", "stdlib"):
        return None
    root = Path(data.path).expanduser()
    if data.name == "mnist":
        from geocont.data.mnist import mnist_files

        return mnist_files(root)
    if data.name == "text":
        from geocont.data.text import check_source, folder_files

        check_source(data)
        return folder_files(root)
    from geocont.data.wikitext import local_files

    _, splits = local_files(root)
    return sorted({f for files in splits.values() for f in files})


def fingerprint(data: DataConfig) -> str | None:
    """blake2b of the data files' names (relative to data.path) and bytes; None for data without a path."""
    files = data_files(data)
    if files is None:
        return None
    root = Path(data.path).expanduser()
    digest = hashlib.blake2b(digest_size=16)
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def data_problems(data: DataConfig) -> list[str]:
    """Every problem with the data a config names, found by reading (not training on) it."""
    try:
        if data.name == "digits":
            return _digits_problems(data)
        if data.name == "mnist" and data.path is not None:
            from geocont.data.mnist import load_splits

            load_splits(Path(data.path).expanduser())  # every header, size and label checked
        elif data.name in ("stdlib", "text", "wikitext103"):
            from geocont.data.text import check_source

            check_source(data)
    except ConfigError as err:
        return err.problems
    return []


def _digits_problems(data: DataConfig) -> list[str]:
    # classification.seeded_split holds out max(1, round(n * val_fraction)); the rest must not be empty.
    if DIGITS_SAMPLES - max(1, round(DIGITS_SAMPLES * data.val_fraction)) < 1:
        return [
            f"data.val_fraction: {data.val_fraction:g} leaves no training samples of digits' {DIGITS_SAMPLES}; "
            f"allowed: below {1 - 0.5 / DIGITS_SAMPLES:.5f}"
        ]
    return []
