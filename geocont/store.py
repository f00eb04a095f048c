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
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
import yaml

DEFAULT_STORE = "geocont-results"
FINAL_STATUSES = ("completed", "failed", "diverged")
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


def write_config(folder: Path, config: dict[str, Any]) -> None:
    atomic_write_text(folder / "config.yaml", yaml.safe_dump(config, sort_keys=False))


def write_metrics(folder: Path, rows: list[dict[str, Any]], name: str = "metrics.parquet") -> None:
    """Rewrite the run's long metrics table (rows of run_id, epoch, step, name, value)."""
    atomic_write_parquet(folder / name, pl.DataFrame(rows, schema=METRIC_SCHEMA))


def write_run_info(folder: Path, info: dict[str, Any]) -> None:
    if info.get("status") not in FINAL_STATUSES:
        raise ValueError(f"run.json status must be one of {FINAL_STATUSES}, got {info.get('status')!r}")
    atomic_write_text(folder / "run.json", json.dumps(info, indent=2, sort_keys=True))


def read_run_info(store: str | Path, sweep: str, run_id: str) -> dict[str, Any] | None:
    path = run_dir(store, sweep, run_id) / "run.json"
    return json.loads(path.read_text()) if path.is_file() else None


def list_run_infos(store: str | Path, sweep: str) -> list[dict[str, Any]]:
    """run.json of every finished run of a sweep (runs that never finished have none)."""
    return [json.loads(p.read_text()) for p in sorted((Path(store) / sweep).glob("*/run.json"))]


def write_sweep_spec(store: str | Path, sweep: str, text: str) -> None:
    atomic_write_text(Path(store) / sweep / "sweep.yaml", text)


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
    return yaml.load(path.read_text(), Loader=_YAML_LOADER) if path.is_file() else {}


def _run_folders(store: str | Path, sweep: str | None) -> list[Path]:
    root = Path(store)
    pattern = f"{sweep}/*/run.json" if sweep else "*/*/run.json"
    return sorted(p.parent for p in root.glob(pattern))


def _config_rows(folders: list[Path]) -> pl.DataFrame:
    rows = []
    for folder in folders:
        info = json.loads((folder / "run.json").read_text())
        config = _read_config(folder / "config.yaml")
        rows.append(
            {
                "run_id": info["run_id"],
                "sweep": info["sweep"],
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


def _long_metrics(folders: list[Path]) -> pl.DataFrame:
    """Every run's metrics with a `sweep` column: the same run_id may sit in several sweeps."""
    files = [str(f / "metrics.parquet") for f in folders if (f / "metrics.parquet").is_file()]
    if not files:
        return pl.DataFrame(schema={**METRIC_SCHEMA, "sweep": pl.String})
    frame = pl.read_parquet(files, schema=METRIC_SCHEMA, include_file_paths="_file")
    sweep = pl.col("_file").str.split("/").list.get(-3)
    return frame.with_columns(sweep=sweep).drop("_file")


def runs(store: str | Path = DEFAULT_STORE, sweep: str | None = None) -> pl.LazyFrame:
    """One row per finished run: ids, status, flattened config, and the final value of every metric."""
    folders = _run_folders(store, sweep)
    config = _config_rows(folders)
    long = _long_metrics(folders)
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
    folders = _run_folders(store, sweep)
    return _long_metrics(folders).join(_config_rows(folders), on=["sweep", "run_id"], how="inner").lazy()
