"""train(cfg) -> RunResult: the one entry point that the CLI and every Ray trial call.

A run never raises for its own failure: an exception is recorded as `failed`, a non-finite loss as
`diverged`, both with final metric values, and the store always ends with a run.json.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from geocont import store
from geocont.config import RunConfig
from geocont.lit.callbacks import MetricsHook

LOG_EVERY_N_STEPS = 10  # train/loss to the loggers every 10 batches


@dataclass(frozen=True)
class RunResult:
    run_id: str
    sweep: str
    status: str  # completed | failed | diverged
    final: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    run_dir: Path = Path(".")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _quiet_lightning() -> None:
    # The Lightning import resets its loggers, so this runs after it (docs/stack.md).
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`training_step` returned `None`.*")  # our skip of a NaN step
    warnings.filterwarnings("ignore", message=".*is an invalid version and will not be supported.*")


def train(
    cfg: RunConfig,
    store_dir: str | Path = store.DEFAULT_STORE,
    sweep: str = "single",
    *,
    on_metrics: MetricsHook | None = None,
    run_name: str | None = None,
    wandb_group: str | None = None,
    info: dict[str, Any] | None = None,
    progress: bool = True,
    accelerator: str | None = None,
) -> RunResult:
    """Train one config, write its results to `<store_dir>/<sweep>/<run_id>/`, and return them.

    `accelerator` overrides `train.accelerator` for where to compute, not what: a sweep's placement
    (resources.gpu: 0 trains on the CPU even on a GPU node) must not change the run's identity.
    """
    from geocont.preflight import check_run

    accelerator = accelerator or cfg.train.accelerator
    check_run(cfg, accelerator)  # a missing GPU or wandb key: ConfigError before any file exists
    run_id = cfg.run_id()
    wandb_id = f"{sweep}-{run_id}"  # one wandb run per store record: retries and resumes continue it
    session = _Session(cfg, on_metrics, run_name, wandb_group, progress, accelerator, wandb_id)
    session.prepare(store.cache_dir(store_dir))  # bad data input raises ConfigError here, before any file exists
    folder = store.run_dir(store_dir, sweep, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    store.write_config(folder, cfg.to_dict())
    started, t0 = _now(), time.perf_counter()
    status, error = session.run(folder, run_id)

    record = {
        "run_id": run_id,
        "sweep": sweep,
        "status": status,
        "name": run_name,
        "started": started,
        "finished": _now(),
        "duration_s": round(time.perf_counter() - t0, 3),
        "steps": session.steps,
        "epochs": session.epochs,
        "error": error,
        "node": socket.gethostname(),
        "device": session.device,
        "metrics_s": round(session.metrics_s, 3),
        **(info or {}),
    }
    session.store_logger.publish()
    store.write_run_info(folder, record)  # the record is final before any tracker is closed
    session.close_trackers()
    return RunResult(run_id, sweep, status, session.store_logger.final_values(), error, folder)


WANDB_FINISH_TIMEOUT_S = 60.0


def _finish_wandb(logger, timeout_s: float = WANDB_FINISH_TIMEOUT_S) -> None:
    """Close the wandb run, waiting at most `timeout_s` for its upload.

    The store already holds the final record; an upload stuck on a dead network must not hold the
    trial (and the sweep's next trial) back. What it had not sent stays in the run's wandb folder.
    """
    log = logging.getLogger("geocont")

    def finish() -> None:
        try:
            logger.experiment.finish()
        except Exception as err:  # the store, not wandb, is the source of truth
            log.warning("wandb finish failed: %s", err)

    closer = threading.Thread(target=finish, name="wandb-finish", daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        log.warning("wandb still uploading after %.0f s; left behind (`wandb sync` its folder later)", timeout_s)


class _Session:
    """The Lightning objects of one run, built and driven in order; keeps train() short."""

    def __init__(self, cfg, on_metrics, run_name, wandb_group, progress, accelerator, wandb_id):
        import pytorch_lightning as pl

        _quiet_lightning()
        self.pl = pl
        self.cfg = cfg
        self.on_metrics, self.run_name, self.wandb_group, self.progress = on_metrics, run_name, wandb_group, progress
        self.accelerator, self.wandb_id = accelerator, wandb_id
        self.steps = self.epochs = 0
        self.device, self.metrics_s = "cpu", 0.0
        self.wandb_run = None

    def prepare(self, cache_dir: Path) -> None:
        """Load the data: the one step whose failure is the user's input rather than the run."""
        from geocont.data import build_datamodule

        self.datamodule = build_datamodule(self.cfg, cache_dir)
        self.datamodule.setup("fit")

    def run(self, folder: Path, run_id: str) -> tuple[str, str | None]:
        from geocont.lit.loggers import StoreLogger

        self.folder = folder
        self.store_logger = StoreLogger(folder, run_id)
        monitor = None
        try:
            self.pl.seed_everything(self.cfg.train.seed, verbose=False)
            datamodule = self.datamodule
            module, monitor = self._build()
            trainer = self._trainer(monitor)
            self.wandb_run = next((lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"), None)
            trainer.fit(module, datamodule=datamodule)
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

    def close_trackers(self) -> None:
        if self.wandb_run is not None:
            _finish_wandb(self.wandb_run)

    def _build(self):
        from geocont.lit.callbacks import GeometryMonitor
        from geocont.lit.module import Classifier, LanguageModel
        from geocont.models import build_model

        cfg, datamodule = self.cfg, self.datamodule
        if cfg.model.kind == "mlp":
            model = build_model(cfg, in_features=datamodule.in_features, num_classes=datamodule.num_classes)
            module = Classifier(model, cfg.optim, LOG_EVERY_N_STEPS)
        else:
            model = build_model(cfg, vocab_size=datamodule.vocab_size)
            module = LanguageModel(model, cfg.optim, LOG_EVERY_N_STEPS)
        monitor = GeometryMonitor(self.on_metrics, language_model=cfg.model.kind == "transformer")
        return module, monitor

    def _trainer(self, monitor):
        cfg = self.cfg.train
        every = cfg.metrics_every_n_steps
        return self.pl.Trainer(
            max_epochs=cfg.epochs if cfg.max_steps is None else -1,
            max_steps=cfg.max_steps or -1,
            accelerator=self.accelerator,
            devices=1,
            precision=cfg.precision,
            logger=self._loggers(),
            callbacks=[monitor],
            val_check_interval=every,
            check_val_every_n_epoch=None if every else 1,
            log_every_n_steps=LOG_EVERY_N_STEPS,
            num_sanity_val_steps=0,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=self.progress,
            default_root_dir=str(self.folder),
        )

    def _loggers(self) -> list:
        loggers: list = [self.store_logger]
        tracking = self.cfg.tracking
        if tracking.tensorboard:
            from pytorch_lightning.loggers import TensorBoardLogger

            loggers.append(
                TensorBoardLogger(save_dir=str(self.folder), name="tensorboard", version="", default_hp_metric=False)
            )
        if tracking.wandb.mode != "disabled":
            from geocont.lit.loggers import wandb_logger

            loggers.append(wandb_logger(self.cfg, self.folder, self.run_name, self.wandb_group, self.wandb_id))
        return loggers
