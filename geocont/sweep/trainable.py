"""One sweep trial in a Ray worker: the same train(cfg) as the CLI, with its progress reported to Tune.

The driver (geocont.sweep.fit) hands each trial over as plain data (run_id, name, resolved config);
the worker validates it again, places it (geocont.sweep.placement) and trains. A `failed` run raises
TrialFailed, so Tune's FailureConfig retries it; a diverged run is a result, never retried.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

from geocont import store
from geocont.sweep.placement import trial_accelerator

REPORT_EVERY_S = 1.0  # a trial's progress reports to Tune (the live view), at most this often


class TrialFailed(RuntimeError):
    """Raised inside a trial when train() recorded `failed`, so Tune's FailureConfig retries it."""


def trainable(config: dict[str, Any], *, store_dir: str, sweep: str, threads: int, gpu: float, cwd: str) -> None:
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
    if store.is_done(store_dir, sweep, spec["run_id"]):  # an earlier attempt finished, then its worker died
        tune.report({"run_status": store.run_status(store_dir, sweep, spec["run_id"])})
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
            store_dir,
            sweep,
            on_metrics=on_metrics,
            run_name=spec["name"],
            info=info,
            progress=False,
            accelerator=accelerator,
        )
    except Exception as err:  # train() raises for bad input met only here (a missing data folder): still a trial
        error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        record_failure(Path(store_dir), sweep, cfg, spec["name"], error, info)
        raise TrialFailed(f"{spec['name']}: {error}") from None  # a plain message: any exception must unpickle
    if result.status == "failed":
        raise TrialFailed(f"{spec['name']}: {result.error}")
    tune.report({"epoch": last_epoch, "node": info["node"], "run_status": result.status, **result.final})


def record_failure(store_dir: Path, sweep: str, config: Any, name: str, error: str, info: dict[str, Any]) -> None:
    """The store's record of a trial whose train() raised instead of recording the failure itself."""
    folder = store.run_dir(store_dir, sweep, config.run_id())
    store.write_config(folder, config.to_dict())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    record = {"run_id": config.run_id(), "sweep": sweep, "status": "failed", "name": name, "error": error}
    store.write_run_info(folder, {**record, "started": stamp, "finished": stamp, **info})
