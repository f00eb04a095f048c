"""train_pack(cfgs) -> [RunResult]: K same-shape trials trained as one batched model in one process.

Each member ends exactly as train(cfg) would leave it: its own run folder (by its own run_id), its
config.yaml, metrics.parquet, run.json, TensorBoard and wandb run, its own initial weights (seeded
and built as its solo run builds them), its own seeded split and batch order. The only trace of
packing is run.json's `pack`: the run_ids trained together, in pack order. Members may differ only
in what `pack_key` leaves free (seed, init_std, optimizer hyperparameters).
"""

from __future__ import annotations

import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geocont import attempts, kinds, store
from geocont.config import ConfigError, RunConfig
from geocont.datafiles import fingerprint
from geocont.metrics.spikes import SpikeDetector
from geocont.train import LOG_EVERY_N_STEPS, RunResult, _now, _quiet_lightning

# Config fields that may differ inside a pack (dotted paths); everything else is the pack key.
FREE_FIELDS = frozenset(
    {
        "train.seed",
        "model.init_std",
        "optim.lr",
        "optim.beta1",
        "optim.beta2",
        "optim.eps",
        "optim.weight_decay",
        "preset",  # a name only: the resolved values it set are compared field by field
    }
)


def pack_key(cfg: RunConfig) -> tuple[tuple[str, object], ...]:
    """What must be equal for two run configs to train in one pack: every field but FREE_FIELDS.

    A sorted tuple of (dotted path, value) pairs, hashable, so a sweep groups its trials by it. Tracking
    is in the key too (the trials of one sweep share it anyway). The key is defined for every config;
    only kinds with a `packed` network (geocont.kinds) train in packs.
    """
    flat: dict[str, object] = {}
    _flatten(cfg.model_dump(mode="json"), "", flat)
    return tuple(sorted((path, value) for path, value in flat.items() if path not in FREE_FIELDS))


def _flatten(tree: dict, prefix: str, out: dict[str, object]) -> None:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, f"{path}.", out)
        else:
            out[path] = tuple(value) if isinstance(value, list) else value  # hashable


def pack_problems(cfgs: list[RunConfig]) -> list[str]:
    """Why these configs cannot train as one pack (empty when they can)."""
    kind = kinds.get(cfgs[0].model.kind)
    if kind.packed is None:
        return [f"resources.pack: model.kind '{kind.name}' has no packed model; allowed: pack 1 for it"]
    if len({pack_key(c) for c in cfgs}) > 1:
        return ["resources.pack: these trials differ in more than seed, init_std and optimizer hyperparameters"]
    return []


@dataclass
class _Trial:
    """One member's files and bookkeeping while its pack trains."""

    cfg: RunConfig
    run_id: str
    final_dir: Path
    folder: Path
    digest: str | None
    name: str | None
    info: dict[str, Any]


def train_pack(
    cfgs: list[RunConfig],
    store_dir: str | Path = store.DEFAULT_STORE,
    sweep: str = "single",
    *,
    run_names: list[str | None] | None = None,
    infos: list[dict[str, Any]] | None = None,
    progress: bool = False,
    accelerator: str | None = None,
    on_metrics: Callable[[int, int, int, dict[str, float]], None] | None = None,
) -> list[RunResult]:
    """Train `cfgs` together; one RunResult per member, in order. Bad input raises before any file exists.

    `on_metrics(k, epoch, step, values)`: member k's latest values after each of its metrics events.
    """
    from geocont.preflight import check_run

    problems = pack_problems(cfgs)
    if problems:
        raise ConfigError(problems)
    accelerator = accelerator or cfgs[0].train.accelerator
    for cfg in cfgs:
        check_run(cfg, accelerator)
    names = run_names or [None] * len(cfgs)
    session = _PackSession(cfgs, accelerator, progress, on_metrics)
    session.prepare(store.cache_dir(store_dir))
    trials = [
        _open(cfg, store_dir, sweep, name, info) for cfg, name, info in zip(cfgs, names, infos or [{}] * len(cfgs))
    ]
    started, t0 = _now(), time.perf_counter()
    statuses = session.run(trials, sweep)
    duration = time.perf_counter() - t0
    pack = [t.run_id for t in trials]
    return [
        _close(trial, k, session, status, error, started, duration, pack, sweep)
        for k, (trial, (status, error)) in enumerate(zip(trials, statuses))
    ]


def _open(cfg: RunConfig, store_dir, sweep: str, name: str | None, info: dict[str, Any]) -> _Trial:
    run_id = cfg.run_id()
    final_dir = store.run_dir(store_dir, sweep, run_id)
    digest = fingerprint(cfg.data)
    attempts.check_same_data(cfg, final_dir, digest)
    folder = attempts.attempt_folder(store_dir, sweep, run_id, final_dir)
    store.write_config(folder, {**cfg.to_dict(), **({"data_fingerprint": digest} if digest else {})})
    return _Trial(cfg, run_id, final_dir, folder, digest, name, info)


def _close(trial, k, session, status, error, started, duration, pack, sweep) -> RunResult:
    member, trackers = session.members[k], session.trackers[k]
    record = {
        "run_id": trial.run_id,
        "sweep": sweep,
        "status": status,
        "name": trial.name,
        "started": started,
        "finished": _now(),
        "duration_s": round(duration, 3),
        "steps": member.diverged_at if member.diverged_at is not None else session.steps,
        "epochs": member.diverged_epoch + 1 if member.diverged_epoch is not None else session.epochs,
        "error": error,
        "node": socket.gethostname(),
        "device": session.device,
        "spikes": session.spikes[k].spikes,
        "metrics_s": round(session.metrics_s / len(pack), 3),  # the pack's metric time, shared equally
        "pack": pack,
        **trial.info,
    }
    trackers.store.publish()
    store.write_run_info(trial.folder, record)
    trackers.close()
    folder = attempts.settle(trial.folder, trial.final_dir, status)
    return RunResult(trial.run_id, sweep, status, trackers.store.final_values(), error, folder)


class _PackSession:
    """The Lightning objects of one pack, built and driven in order (train.py's _Session, for K members)."""

    def __init__(self, cfgs: list[RunConfig], accelerator: str, progress: bool, on_metrics=None):
        import pytorch_lightning as pl

        _quiet_lightning()
        self.pl, self.cfgs, self.accelerator, self.progress = pl, cfgs, accelerator, progress
        self.on_metrics = on_metrics
        self.steps = self.epochs = 0
        self.device, self.metrics_s = "cpu", 0.0
        self.spikes = [SpikeDetector() for _ in cfgs]

    def prepare(self, cache_dir: Path) -> None:
        from geocont.data import build_datamodule

        self.datamodules = [build_datamodule(cfg, cache_dir) for cfg in self.cfgs]
        for dm in self.datamodules:
            dm.setup("fit")

    def run(self, trials: list[_Trial], sweep: str) -> list[tuple[str, str | None]]:
        from geocont.lit.packed import Member, PackedData
        from geocont.lit.trackers import RunContext, RunTrackers

        self.trackers = [
            RunTrackers(RunContext(t.cfg, t.folder, t.run_id, sweep, t.name, shared_process=True)) for t in trials
        ]
        self.members = [
            Member(tr.loggers, tr.store, on_metrics=self._progress(k)) for k, tr in enumerate(self.trackers)
        ]
        monitor = None
        try:
            module, monitor = self._build()
            trainer = self._trainer(monitor)
            data = PackedData(self.datamodules)
            trainer.fit(module, datamodule=data)
            self.device = str(trainer.strategy.root_device)
            self.steps, self.epochs = trainer.global_step, trainer.current_epoch
            if trainer.interrupted:
                return [("failed", "interrupted")] * len(trials)
            if any(m.active and m.last_event_step != trainer.global_step for m in self.members):
                trainer.validate(module, datamodule=data, verbose=False)  # final values, whatever stopped it
            return [self._status(m) for m in self.members]
        except Exception as err:  # recorded for every member, never raised: the sweep goes on
            for t in trials:
                (t.folder / "error.txt").write_text(traceback.format_exc())
            return [("failed", f"{type(err).__name__}: {err}".splitlines()[0][:500])] * len(trials)
        finally:
            self.metrics_s = getattr(monitor, "metrics_s", 0.0)

    def _progress(self, k: int):
        if self.on_metrics is None:
            return None
        return lambda epoch, step, values: self.on_metrics(k, epoch, step, values)

    @staticmethod
    def _status(member) -> tuple[str, str | None]:
        if member.diverged_at is not None:
            return "diverged", f"non-finite training loss at step {member.diverged_at}"
        return "completed", None

    def _build(self):
        from geocont.lit.packed import PackedClassifier, PackedMonitor

        kind = kinds.get(self.cfgs[0].model.kind)
        solos = []
        for cfg, dm in zip(self.cfgs, self.datamodules):
            self.pl.seed_everything(cfg.train.seed, verbose=False)  # as the member's solo run, before its model
            solos.append(kind.build_network(cfg.model, dm))
        model = kind.packed_class().from_members(solos)
        train = self.cfgs[0].train
        module = PackedClassifier(model, [c.optim for c in self.cfgs], self.members, LOG_EVERY_N_STEPS, train.grad_clip)
        for member, spikes in zip(self.members, self.spikes):
            member.loss_hooks.append(_spike_hook(member, spikes, module))
        return module, PackedMonitor()

    def _trainer(self, monitor):
        cfg = self.cfgs[0].train
        every = cfg.metrics_every_n_steps
        return self.pl.Trainer(
            max_epochs=cfg.epochs if cfg.max_steps is None else -1,
            max_steps=cfg.max_steps or -1,
            accelerator=self.accelerator,
            devices=1,
            precision=cfg.precision,
            logger=False,  # each member logs to its own loggers (lit/packed.Member)
            callbacks=[monitor],
            val_check_interval=every,
            check_val_every_n_epoch=None if every else 1,
            num_sanity_val_steps=0,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=self.progress,
        )


def _spike_hook(member, spikes: SpikeDetector, module):
    def hook(step: int, loss: float) -> None:
        record = spikes.update(step, loss)
        if record is not None:
            member.log({"train/spike": record["loss"] / record["level"]}, step, module.trainer.current_epoch)

    return hook
