"""train(cfg) -> RunResult: the one entry point that the CLI and every Ray trial call.

A run never raises for its own failure: an exception is recorded as `failed`, a non-finite loss as
`diverged`, both with final metric values, and the store always ends with a run.json.
"""

from __future__ import annotations

import logging
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geocont import attempts, kinds, store
from geocont.config import RunConfig, TrainConfig
from geocont.datafiles import fingerprint
from geocont.metrics.spikes import SpikeDetector

if TYPE_CHECKING:  # Lightning is imported only when a run starts
    from geocont.lit.progress import MetricsHook

LOG_EVERY_N_STEPS = 10  # train/loss to the loggers every 10 batches
STEPS_PER_CALL = 32  # optimizer steps per training_step call at most (data.batches.Chunks)


@dataclass(frozen=True)
class RunResult:
    run_id: str
    sweep: str
    status: str  # completed | failed | diverged
    final: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    run_dir: Path = Path(".")


def quiet_lightning() -> None:
    # The Lightning import resets its loggers, so this runs after it (docs/stack.md).
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")  # our skip of a NaN step
    warnings.filterwarnings("ignore", message=".*is an invalid version and will not be supported.*")
    # Lightning counts a chunk of steps (data.batches.Chunks) as one batch; train/loss is logged by step, not by it
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")


def train(
    cfg: RunConfig,
    store_dir: str | Path = store.DEFAULT_STORE,
    sweep: str = "single",
    *,
    on_metrics: MetricsHook | None = None,
    run_name: str | None = None,
    info: dict[str, Any] | None = None,
    progress: bool = True,
    accelerator: str | None = None,
) -> RunResult:
    """Train one config, write its results to `<store_dir>/<sweep>/<run_id>/`, and return them.

    `accelerator` overrides `train.accelerator` for where to compute, not what: a sweep's placement
    (resources.gpu: 0 trains on the CPU even on a GPU node) must not change the run's identity.

    A finished result already there is never lost: the re-run trains in `.attempts/` and takes the run's
    place only when it finishes too; a failed re-run stays in `.attempts/<run_id>.failed` (the returned
    run_dir). Bad input (a missing GPU or wandb key, data, sizes, data changed under a finished run)
    raises ConfigError before any file is written.
    """
    from geocont.preflight import check_run

    accelerator = accelerator or cfg.train.accelerator
    check_run(cfg, accelerator)
    attempt = attempts.plan(cfg, store_dir, sweep, fingerprint(cfg.data))
    session = _Session(cfg, on_metrics, run_name, sweep, progress, accelerator)
    session.prepare(store.cache_dir(store_dir))  # bad data input raises ConfigError here, before any file exists
    folder = attempts.open_attempt(attempt, store_dir, sweep)
    started, t0 = attempts.now(), time.perf_counter()
    status, error = session.run(folder, attempt.run_id)
    record = attempts.record(
        attempt, sweep, status, error, name=run_name, started=started, duration_s=time.perf_counter() - t0,
        steps=session.steps, epochs=session.epochs, device=session.device, spikes=session.spikes.spikes,
        metrics_s=session.metrics_s, extra=info or {},
    )  # fmt: skip
    folder = attempts.finish(attempt, folder, record, session.trackers)
    return RunResult(attempt.run_id, sweep, status, session.trackers.store.final_values(), error, folder)


class _Session:
    """The Lightning objects of one run, built and driven in order; keeps train() short."""

    def __init__(self, cfg, on_metrics, run_name, sweep, progress, accelerator):
        import pytorch_lightning as pl

        quiet_lightning()
        self.pl = pl
        self.cfg = cfg
        self.on_metrics, self.run_name, self.sweep, self.progress = on_metrics, run_name, sweep, progress
        self.accelerator = accelerator
        self.steps = self.epochs = 0
        self.device, self.metrics_s = "cpu", 0.0
        self.spikes = SpikeDetector()

    def prepare(self, cache_dir: Path) -> None:
        """Load the data: the one step whose failure is the user's input rather than the run."""
        from geocont.data import build_datamodule

        self.datamodule = build_datamodule(self.cfg, cache_dir)
        self.datamodule.setup("fit")

    def run(self, folder: Path, run_id: str) -> tuple[str, str | None]:
        from geocont.lit.trackers import RunContext, RunTrackers

        self.folder = folder
        self.trackers = RunTrackers(RunContext(self.cfg, folder, run_id, self.sweep, self.run_name))
        monitor = None
        try:
            self.pl.seed_everything(self.cfg.train.seed, verbose=False)
            datamodule = self.datamodule
            module, monitor = self._build()
            training_data, chunk = chunked(self.datamodule, self.cfg.train)
            trainer = self._trainer(self._callbacks(monitor), chunk)
            trainer.fit(module, datamodule=training_data)
            self.device = str(trainer.strategy.root_device)
            self.steps, self.epochs = trainer.global_step, trainer.current_epoch
            if module.diverged:
                self.steps = module.diverged_at
                monitor.emit(trainer, {"train/loss": float("nan")})
                return "diverged", f"non-finite training loss at step {module.diverged_at}"
            if trainer.interrupted:
                return "failed", "interrupted"
            if monitor.last_event_step != trainer.global_step:
                trainer.validate(module, datamodule=datamodule, verbose=False)  # final values, whatever stopped it
            return "completed", None
        except Exception as err:  # recorded, never raised: one bad trial must not take a sweep down
            (self.folder / "error.txt").write_text(traceback.format_exc())
            return "failed", f"{type(err).__name__}: {err}".splitlines()[0][:500]
        finally:
            self.metrics_s = getattr(monitor, "metrics_s", 0.0)

    def _build(self):
        from geocont.lit.callbacks import GeometryMonitor

        cfg, kind = self.cfg, kinds.get(self.cfg.model.kind)
        model = kind.build_network(cfg.model, self.datamodule)
        module = kind.lightning_class()(model, cfg.optim, LOG_EVERY_N_STEPS, cfg.train.grad_clip)
        module.loss_hooks.append(self._spike_hook(module))
        return module, GeometryMonitor()

    def _spike_hook(self, module):
        """Every step's loss through the spike detector; a spike's onset becomes `train/spike` (loss / level)."""

        from geocont.lit.loggers import log_to_loggers

        def hook(step: int, loss: float) -> None:
            record = self.spikes.update(step, loss)
            if record is not None:
                log_to_loggers(module.trainer, {"train/spike": record["loss"] / record["level"]}, step=step)

        return hook

    def _callbacks(self, monitor) -> list:
        from geocont.lit.progress import ProgressHook

        # the monitor first: the progress hook then reports this event's geometry values
        return [monitor] + ([ProgressHook(self.on_metrics, self.trackers.store)] if self.on_metrics else [])

    def _trainer(self, callbacks: list, chunk: int = 1):
        return self.pl.Trainer(
            **trainer_settings(self.cfg.train, self.accelerator, self.progress, chunk),
            logger=self.trackers.loggers,
            callbacks=callbacks,
            log_every_n_steps=LOG_EVERY_N_STEPS,
            default_root_dir=str(self.folder),
        )


def chunked(datamodule, cfg: TrainConfig) -> tuple[Any, int]:
    """`datamodule` for fit with its training batches in chunks of several steps (Chunks), and the chunk size.

    A lone run and a pack share it: the size is the largest that keeps Lightning's schedule exact.
    """
    from geocont.data.batches import ChunkedData, chunk_size

    steps = len(datamodule.train_dataloader())
    size = chunk_size(STEPS_PER_CALL, steps, cfg.metrics_every_n_steps, cfg.max_steps)
    return (ChunkedData(datamodule, size) if size > 1 else datamodule), size


def trainer_settings(cfg: TrainConfig, accelerator: str, progress: bool, chunk: int = 1) -> dict[str, Any]:
    """The Trainer arguments every run shares (a lone run and a pack): step budget, device, validation schedule."""
    every = cfg.metrics_every_n_steps and cfg.metrics_every_n_steps // chunk  # Lightning counts chunks
    return {
        "max_epochs": cfg.epochs if cfg.max_steps is None else -1,
        "max_steps": cfg.max_steps or -1,
        "accelerator": accelerator,
        "devices": 1,
        "precision": cfg.precision,
        "val_check_interval": every,
        "check_val_every_n_epoch": None if every else 1,
        "num_sanity_val_steps": 0,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": progress,
    }
