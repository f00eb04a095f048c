"""The results store: a folder of plain files that is the source of truth (wandb is a copy).

Layout (docs/contracts.md):
    <store>/<sweep>/<run_id>/config.yaml      the fully resolved RunConfig
    <store>/<sweep>/<run_id>/metrics.parquet  long format: run_id, epoch, step, name, value
    <store>/<sweep>/<run_id>/run.json         run_id, sweep, status, started, finished, error, ...
    <store>/<sweep>/sweep.yaml                the sweep as launched
    <store>/.cache/                           derived data (tokenized corpora), safe to delete

Every file is written to a temporary name in the same folder and renamed into place, so a reader
never sees half a file. run.json is written last and only with a final status (completed, failed,
diverged): a run without one never finished. This module knows neither Ray nor Lightning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from geocont import DEFAULT_STORE
from geocont.config import ConfigError, read_text

SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SWEEP_NAME_MAX = 100  # a folder name, with room for the run folders below it in any file system's limits
FINAL_STATUSES = ("completed", "failed", "diverged")
SWEEP_SPEC = "sweep.yaml"  # <store>/<sweep>/sweep.yaml: the sweep as launched
METRIC_SCHEMA = {"run_id": pl.String, "epoch": pl.Int64, "step": pl.Int64, "name": pl.String, "value": pl.Float64}


# ---------------------------------------------------------------------------------------------
# Atomic writes


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_parquet(path: str | Path, frame: pl.DataFrame) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        frame.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# One run's files


def run_dir(store: str | Path, sweep: str, run_id: str) -> Path:
    return Path(store) / sweep / run_id


RESULTS = ("completed", "diverged")  # finished results: what no later command may lose
ATTEMPTS = ".attempts"  # <store>/<sweep>/.attempts/: re-runs of a finished run, until they finish


def result_info(folder: Path) -> dict[str, Any] | None:
    """run.json of the folder's run when it holds a finished result (completed or diverged), else None."""
    try:
        info = load_run_info(folder) if (folder / "run.json").is_file() else None
    except CorruptRun:
        return None
    return info if info is not None and info["status"] in RESULTS else None


def recorded_fingerprint(folder: Path) -> str | None:
    """The data fingerprint a run recorded in its config.yaml (None: no data.path, or recorded before fingerprints)."""
    try:
        return _read_config(folder / "config.yaml").get("data_fingerprint")
    except CorruptRun:
        return None


def new_attempt(store: str | Path, sweep: str, run_id: str) -> Path:
    """A fresh folder beside the sweep's runs for a re-run of `run_id`; readers never look inside .attempts."""
    parent = Path(store) / sweep / ATTEMPTS
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{run_id}.", dir=parent))


def replace_dir(new: Path, old: Path) -> None:
    """Put folder `new` where folder `old` is, then delete what was there.

    On Linux the two are exchanged in one atomic rename (RENAME_EXCHANGE): a reader, or a kill at any
    moment, sees the old run or the new one, never neither. Elsewhere two renames leave a short window in
    which the old run sits in .attempts/ (moved, not deleted).
    """
    if not _exchange(new, old):
        aside = new.with_name(new.name + ".old")
        os.rename(old, aside)
        os.rename(new, old)
        new = aside
    shutil.rmtree(new)


def _exchange(a: Path, b: Path) -> bool:
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc >= 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def check_writable(store: str | Path, option: str = "--store") -> None:
    """A store folder that exists or can be made and takes files; checked before any work starts."""
    if str(store) == "":
        raise ConfigError([f"{option}: empty; give a folder, e.g. {option} {DEFAULT_STORE}"])
    why = unwritable_folder(Path(store))
    if why:
        raise ConfigError([f"{option} {store}: {why}"])


def unwritable_folder(path: Path) -> str | None:
    """Why files cannot be written in folder `path` (made when missing), or None when they can.

    Probed by creating (and removing) a file in the nearest existing folder: permission bits do not tell
    for root, read-only mounts or network file systems.
    """
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be made: {existing} is a file"
        return f"{what}; expected a folder (created when missing)"
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        return f"not writable ({err.strerror} in {existing})"
    return None


def write_config(folder: Path, config: dict[str, Any]) -> None:
    atomic_write_text(folder / "config.yaml", yaml.safe_dump(config, sort_keys=False))


def write_metrics(folder: Path, rows: list[dict[str, Any]], name: str = "metrics.parquet") -> None:
    """Rewrite the run's long metrics table (rows of run_id, epoch, step, name, value)."""
    atomic_write_parquet(folder / name, pl.DataFrame(rows, schema=METRIC_SCHEMA))


def write_run_info(folder: Path, info: dict[str, Any]) -> None:
    if info.get("status") not in FINAL_STATUSES:
        raise ValueError(f"run.json status must be one of {FINAL_STATUSES}, got {info.get('status')!r}")
    atomic_write_text(folder / "run.json", json.dumps(info, indent=2, sort_keys=True))


class CorruptRun(ValueError):
    """A run folder whose files cannot be read back (damaged outside geocont: atomic writes never truncate)."""


def load_run_info(folder: Path) -> dict[str, Any]:
    """A run folder's run.json, checked to be a record with a final status (CorruptRun otherwise)."""
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptRun(f"run.json is not readable JSON ({type(err).__name__})") from None
    if not isinstance(info, dict):
        raise CorruptRun(f"run.json holds a {type(info).__name__}, not a run record")
    if info.get("status") not in FINAL_STATUSES or not isinstance(info.get("run_id"), str):
        raise CorruptRun(f"run.json has no run_id or no final status (status {info.get('status')!r})")
    return info


_warned: set[Path] = set()


def skip_corrupt(folder: Path, err: CorruptRun) -> None:
    """Say once per process that a corrupt run is left out; the readers go on with the rest of the store."""
    if folder not in _warned:
        _warned.add(folder)
        print(f"warning: skipped {folder}: {err}", file=sys.stderr)  # a terminal line, whatever logging is set up


def read_run_info(store: str | Path, sweep: str, run_id: str) -> dict[str, Any] | None:
    """The run's record; None when it never finished or its run.json is corrupt (reported once)."""
    folder = run_dir(store, sweep, run_id)
    if not (folder / "run.json").is_file():
        return None
    try:
        return load_run_info(folder)
    except CorruptRun as err:
        skip_corrupt(folder, err)
        return None


def list_run_infos(store: str | Path, sweep: str) -> list[dict[str, Any]]:
    """run.json of every finished run of a sweep (runs that never finished have none; corrupt ones are reported)."""
    infos = []
    for path in sorted((Path(store) / sweep).glob("*/run.json")):
        info = read_run_info(store, sweep, path.parent.name)
        if info is not None:
            infos.append(info)
    return infos


def is_done(store: str | Path, sweep: str, run_id: str) -> bool:
    """Whether the run holds a result (completed or diverged: deterministic, so never run again)."""
    info = read_run_info(store, sweep, run_id)
    return info is not None and info["status"] in RESULTS


def run_status(store: str | Path, sweep: str, run_id: str) -> str:
    """The run's final status, or `pending` when it has none (never finished, or its run.json is corrupt)."""
    info = read_run_info(store, sweep, run_id)
    return info["status"] if info is not None else "pending"


def status_counts(statuses: Iterable[str], total: int = 0) -> dict[str, int]:
    """How many runs have each status, in first-seen order; runs short of `total` are counted pending."""
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    if total > sum(counts.values()):
        counts["pending"] = counts.get("pending", 0) + total - sum(counts.values())
    return counts


def clear_unfinished(store: str | Path, sweep: str, run_ids: Iterable[str]) -> None:
    """Remove what a killed or failed attempt left (partial metrics, error.txt): the rerun starts clean."""
    for run_id in run_ids:
        folder = run_dir(store, sweep, run_id)
        if folder.exists():
            shutil.rmtree(folder)


# ---------------------------------------------------------------------------------------------
# The sweep as launched: <store>/<sweep>/sweep.yaml, all that `resume` needs


def spec_path(store: str | Path, sweep: str) -> Path:
    return Path(store) / sweep / SWEEP_SPEC


def record_spec(store: str | Path, sweep: str, text: str) -> None:
    """Record the sweep's YAML as launched; an unchanged file is not rewritten."""
    path = spec_path(store, sweep)
    if not path.is_file() or path.read_text() != text:
        atomic_write_text(path, text)


def read_spec(store: str | Path, sweep: str) -> str:
    """The recorded YAML of a sweep; a name with none is a ConfigError naming the sweeps that have one."""
    check_sweep_name(sweep, "SWEEP_NAME")
    path = spec_path(store, sweep)
    if not path.is_file():
        known = [name for name in sweep_names(store) if spec_path(store, name).is_file()]
        raise ConfigError([f"{sweep}: no sweep of that name in {store}; sweeps there: {', '.join(known) or 'none'}"])
    return read_text(path)


def sweep_name_problem(name: str) -> str | None:
    """Why `name` cannot be a sweep's folder in a store (None when it can): one folder, never a path out of it."""
    if not SWEEP_NAME.fullmatch(name):
        return (
            f"{name!r} is not usable as a folder name; allowed: ASCII letters and digits, '-', '_', '.' "
            "(starting with a letter or digit)"
        )
    if len(name) > SWEEP_NAME_MAX:
        return f"{name[:20]!r}... is {len(name)} characters long; allowed: at most {SWEEP_NAME_MAX}"
    return None


def sweep_names(store: str | Path) -> list[str]:
    root = Path(store)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def cache_dir(store: str | Path) -> Path:
    """`<store>/.cache`: derived data (tokenized corpora, BPE) that every node of a cluster can reuse.

    Hidden, so no reader takes it for a sweep; deleting it costs only recomputation.
    """
    return Path(store).absolute() / ".cache"


# ---------------------------------------------------------------------------------------------
# Polars query API: reads only the local store


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'depth': 4}} -> {'model.depth': 4}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


# libyaml's C parser when present: ~8x faster over hundreds of run configs.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        config = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise CorruptRun(f"config.yaml is not readable YAML ({type(err).__name__})") from None
    if not isinstance(config, dict):
        raise CorruptRun(f"config.yaml holds a {type(config).__name__}, not a config mapping")
    return config


def check_sweep_name(sweep: str, option: str = "--sweep") -> None:
    """A sweep name given on the command line names one folder of the store, never a path out of it."""
    problem = sweep_name_problem(sweep)
    if problem:
        raise ConfigError([f"{option}: {problem}"])


def _run_folders(store: str | Path, sweep: str | None) -> list[Path]:
    if sweep is not None:
        check_sweep_name(sweep)
    root = Path(store)
    pattern = f"{sweep}/*/run.json" if sweep else "*/*/run.json"
    return sorted(p.parent for p in root.glob(pattern))


def _readable(folders: list[Path]) -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """(folder, run.json, config.yaml) of every run whose files read back; the others are reported and left out."""
    good = []
    for folder in folders:
        try:
            good.append((folder, load_run_info(folder), _read_config(folder / "config.yaml")))
        except CorruptRun as err:
            skip_corrupt(folder, err)
    return good


def _config_rows(runs: list[tuple[Path, dict[str, Any], dict[str, Any]]]) -> pl.DataFrame:
    rows = []
    for folder, info, config in runs:
        rows.append(
            {
                "run_id": info["run_id"],
                "sweep": info.get("sweep", folder.parent.name),
                "status": info["status"],
                "name": info.get("name"),
                "node": info.get("node"),
                "error": info.get("error"),
                "started": info.get("started"),
                "finished": info.get("finished"),
                **{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in flatten(config).items()},
            }
        )
    return (
        pl.DataFrame(rows, infer_schema_length=None)
        if rows
        else pl.DataFrame(schema={"run_id": pl.String, "sweep": pl.String, "status": pl.String})
    )


def read_metric_files(files: list[Path]) -> tuple[pl.DataFrame, list[Path]]:
    """The long tables of `files` with a `sweep` column, and the files that would not read (left out).

    One read of all files is the fast path; only when it fails is each file read alone to find the bad ones.
    """
    files = [f for f in files if f.is_file()]
    try:
        return _read_long(files), []
    except Exception:  # polars raises several kinds for a damaged file; which one it was is told per file below
        good, bad = [], []
        for f in files:
            try:
                _read_long([f])
                good.append(f)
            except Exception:
                bad.append(f)
        return _read_long(good), bad


def _read_long(files: list[Path]) -> pl.DataFrame:
    if not files:
        return pl.DataFrame(schema={**METRIC_SCHEMA, "sweep": pl.String})
    frame = pl.read_parquet([str(f) for f in files], schema=METRIC_SCHEMA, include_file_paths="_file")
    sweep = pl.col("_file").str.split("/").list.get(-3)
    return frame.with_columns(sweep=sweep).drop("_file")


def _usable(folders: list[Path]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Config rows and long metrics of every readable run (a run with a damaged metrics file is left out)."""
    runs = _readable(folders)
    long, bad = read_metric_files([folder / "metrics.parquet" for folder, _, _ in runs])
    for f in bad:
        skip_corrupt(f.parent, CorruptRun("metrics.parquet is not a readable parquet file"))
    broken = {f.parent for f in bad}
    return _config_rows([r for r in runs if r[0] not in broken]), long


def runs(store: str | Path = DEFAULT_STORE, sweep: str | None = None) -> pl.LazyFrame:
    """One row per finished run: ids, status, flattened config, and the final value of every metric."""
    config, long = _usable(_run_folders(store, sweep))
    if long.is_empty():
        return config.lazy()
    final = (
        long.sort("sweep", "run_id", "step", "epoch")
        .group_by("sweep", "run_id", "name", maintain_order=True)
        .agg(pl.col("value").last())
        .pivot(on="name", index=["sweep", "run_id"], values="value")
    )
    return config.join(final, on=["sweep", "run_id"], how="left").lazy()


def metrics(store: str | Path = DEFAULT_STORE, sweep: str | None = None) -> pl.LazyFrame:
    """The long per-epoch metrics table (run_id, epoch, step, name, value) joined with each run's config."""
    config, long = _usable(_run_folders(store, sweep))
    return long.join(config, on=["sweep", "run_id"], how="inner").lazy()
