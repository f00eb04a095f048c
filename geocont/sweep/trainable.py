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
from geocont.sweep import packs
from geocont.sweep.placement import trial_accelerator

REPORT_EVERY_S = 1.0  # a trial's progress reports to Tune (the live view), at most this often


class TrialFailed(RuntimeError):
    """Raised inside a trial when train() recorded `failed`, so Tune's FailureConfig retries it."""


def trainable(config: dict[str, Any], *, store_dir: str, sweep: str, threads: int, gpu: float, cwd: str) -> None:
    """One trial: train(cfg) with live metrics to Tune; raises on `failed` so FailureConfig retries it.

    A pack (`resources.pack`) is one Tune trial whose payload lists its members: they train together
    through train_pack, each reported under its own run_id (`members` of every report).
    """
    spec = config["trial"]
    cfgs = [_run_config(m, sweep) for m in packs.members(spec)]
    accelerator = trial_accelerator(gpu, cfgs[0].train.accelerator)  # first: hides the GPUs before torch looks

    import torch

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
    if "members" in spec:
        _train_pack(spec, cfgs, store_dir, sweep, info, accelerator)
    else:
        _train_one(spec, cfgs[0], store_dir, sweep, info, accelerator)


def _run_config(member: dict[str, Any], sweep: str):
    from geocont.config import RunConfig, deep_merge

    # one wandb group per sweep (tracking is not part of the run_id: the run stays the same run)
    return RunConfig.model_validate(deep_merge(member["config"], {"tracking": {"wandb": {"group": sweep}}}))


def _train_one(spec: dict[str, Any], cfg, store_dir: str, sweep: str, info: dict[str, Any], accelerator: str) -> None:
    from geocont.train import train

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


def _train_pack(spec: dict[str, Any], cfgs: list, store_dir: str, sweep: str, info: dict[str, Any], accelerator: str):
    """The pack's members not yet done (a retry re-runs only those), trained together; raises if any failed."""
    from geocont.pack import train_pack

    todo = [(m, c) for m, c in zip(spec["members"], cfgs) if not store.is_done(store_dir, sweep, m["run_id"])]
    # each member's latest report, under its run_id (the live view shows members, not packs)
    reports = {m["run_id"]: {"run_status": store.run_status(store_dir, sweep, m["run_id"])} for m in spec["members"]}
    last_report = -math.inf

    def on_metrics(k: int, epoch: int, step: int, values: dict[str, float]) -> None:
        nonlocal last_report  # the live view only, as for a lone trial: at most a report a second
        reports[todo[k][0]["run_id"]] = {"epoch": epoch, "step": step, "node": info["node"], **values}
        if time.monotonic() - last_report >= REPORT_EVERY_S:
            last_report = time.monotonic()
            tune.report({"node": info["node"], "members": dict(reports)})

    if todo:
        names = [m["name"] for m, _ in todo]
        try:
            results = train_pack(
                [c for _, c in todo], store_dir, sweep, run_names=names, infos=[info] * len(todo),
                accelerator=accelerator, on_metrics=on_metrics,
            )  # fmt: skip
        except Exception as err:  # bad input met only here (a missing data folder): every member fails
            error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
            for member, cfg in todo:
                record_failure(Path(store_dir), sweep, cfg, member["name"], error, info)
            raise TrialFailed(f"{spec['name']}: {error}") from None
        for (member, _), result in zip(todo, results):
            reports[member["run_id"]] = {"node": info["node"], "run_status": result.status, **result.final}
        failed = [f"{m['name']}: {r.error}" for (m, _), r in zip(todo, results) if r.status == "failed"]
        if failed:
            raise TrialFailed(f"{spec['name']}: {'; '.join(failed)}")
    tune.report({"node": info["node"], "run_status": "packed", "members": reports})
