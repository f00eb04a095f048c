"""train_pack(cfgs) -> [RunResult]: K same-shape trials trained as one batched model in one process.

Each member ends exactly as train(cfg) would leave it: its own run folder (by its own run_id), its
config.yaml, metrics.parquet, run.json, TensorBoard and wandb run, its own initial weights (seeded
and built as its solo run builds them), its own seeded split and batch order. The only trace of
packing is run.json's `pack`: the run_ids trained together, in pack order. Members may differ only
in what `pack_key` leaves free (seed, init_std, optimizer hyperparameters).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from geocont import attempts, kinds, store
from geocont.config import PRECISIONS, ConfigError, RunConfig
from geocont.datafiles import fingerprint
from geocont.metrics.spikes import SpikeDetector
from geocont.train import LOG_EVERY_N_STEPS, RunResult, chunked, quiet_lightning, trainer_settings

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


# fp16 loss scaling keeps one scale for the whole model and skips a step for everyone when any gradient
# overflows: one member's overflow would stall the others. Packs train without a GradScaler.
UNPACKABLE_PRECISIONS = ("16-mixed",)


def precision_problem(precision: str) -> str:
    allowed = ", ".join(p for p in PRECISIONS if p not in UNPACKABLE_PRECISIONS)
    return (
        f"train.precision: '{precision}' cannot be packed (fp16 loss scaling is per run); allowed in a pack: {allowed}"
    )


def pack_problems(cfgs: list[RunConfig]) -> list[str]:
    """Why these configs cannot train as one pack (empty when they can)."""
    kind = kinds.get(cfgs[0].model.kind)
    if kind.packed is None:
        return [f"resources.pack: model.kind '{kind.name}' has no packed model; allowed: pack 1 for it"]
    if cfgs[0].train.precision in UNPACKABLE_PRECISIONS:
        return [precision_problem(cfgs[0].train.precision)]
    if len({pack_key(c) for c in cfgs}) > 1:
        return ["resources.pack: these trials differ in more than seed, init_std and optimizer hyperparameters"]
    return []


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
    digest = fingerprint(cfgs[0].data)  # one data section for the whole pack (it is in pack_key)
    plans = [attempts.plan(cfg, store_dir, sweep, digest) for cfg in cfgs]  # every member checked before any file
    session = _PackSession(cfgs, accelerator, progress, on_metrics)
    session.prepare(store.cache_dir(store_dir))  # bad data raises here, before any member's file exists
    folders = [attempts.open_attempt(plan, store_dir, sweep) for plan in plans]
    names, infos = run_names or [None] * len(cfgs), infos or [{}] * len(cfgs)
    started, t0 = attempts.now(), time.perf_counter()
    statuses = session.run(plans, folders, names, sweep)
    duration = time.perf_counter() - t0
    pack = [plan.run_id for plan in plans]
    results = []
    for k, (plan, folder, (status, error)) in enumerate(zip(plans, folders, statuses)):
        member = session.members[k]
        record = attempts.record(
            plan, sweep, status, error, name=names[k], started=started, duration_s=duration,
            steps=member.diverged_at if member.diverged_at is not None else session.steps,
            epochs=member.diverged_epoch + 1 if member.diverged_epoch is not None else session.epochs,
            device=session.device, spikes=session.spikes[k].spikes,
            metrics_s=session.metrics_s / len(pack),  # the pack's metric time, shared equally
            extra={"pack": pack, **infos[k]},
        )  # fmt: skip
        folder = attempts.finish(plan, folder, record, session.trackers[k])
        results.append(RunResult(plan.run_id, sweep, status, session.trackers[k].store.final_values(), error, folder))
    return results


class _PackSession:
    """The Lightning objects of one pack, built and driven in order (train.py's _Session, for K members)."""

    def __init__(self, cfgs: list[RunConfig], accelerator: str, progress: bool, on_metrics=None):
        import pytorch_lightning as pl

        quiet_lightning()
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

    def run(
        self, plans: list, folders: list[Path], names: list[str | None], sweep: str
    ) -> list[tuple[str, str | None]]:
        from geocont.lit.packed import Member, PackedData
        from geocont.lit.trackers import RunContext, RunTrackers

        self.trackers = [
            RunTrackers(RunContext(p.cfg, folder, p.run_id, sweep, name, shared_process=True))
            for p, folder, name in zip(plans, folders, names)
        ]
        self.members = [
            Member(tr.loggers, tr.store, on_metrics=self._progress(k)) for k, tr in enumerate(self.trackers)
        ]
        monitor = None
        try:
            module, monitor = self._build()
            data = PackedData(self.datamodules)
            training_data, chunk = chunked(data, self.cfgs[0].train)  # the members share their schedule (pack_key)
            trainer = self._trainer(monitor, chunk)
            trainer.fit(module, datamodule=training_data)
            self.device = str(trainer.strategy.root_device)
            self.steps, self.epochs = trainer.global_step, trainer.current_epoch
            if trainer.interrupted:
                return [("failed", "interrupted")] * len(plans)
            if any(m.active and m.last_event_step != trainer.global_step for m in self.members):
                trainer.validate(module, datamodule=data, verbose=False)  # final values, whatever stopped it
            return [self._status(m) for m in self.members]
        except Exception as err:  # recorded for every member, never raised: the sweep goes on
            for folder in folders:
                (folder / "error.txt").write_text(traceback.format_exc())
            return [("failed", f"{type(err).__name__}: {err}".splitlines()[0][:500])] * len(plans)
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

    def _trainer(self, monitor, chunk: int):
        return self.pl.Trainer(
            **trainer_settings(self.cfgs[0].train, self.accelerator, self.progress, chunk),
            logger=False,  # each member logs to its own loggers (lit/packed.Member)
            callbacks=[monitor],
        )


def _spike_hook(member, spikes: SpikeDetector, module):
    def hook(step: int, loss: float) -> None:
        record = spikes.update(step, loss)
        if record is not None:
            member.log({"train/spike": record["loss"] / record["level"]}, step, module.trainer.current_epoch)

    return hook
