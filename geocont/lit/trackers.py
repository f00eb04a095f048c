"""Trackers by name: what a run logs to besides the store, built from its tracking config.

The store (StoreLogger) is the source of truth and always first; every other tracker is one entry of
`TRACKERS`: when the config enables it, how to build its Lightning logger, how to close it. Adding a
tracker (MLflow, say) is one entry here and its switch in TrackingConfig; train() never names one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytorch_lightning.loggers import Logger

from geocont.config import RunConfig
from geocont.lit.loggers import StoreLogger

WANDB_FINISH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunContext:
    """What a tracker may know of the run it follows."""

    cfg: RunConfig
    folder: Path  # the run's store folder: local tracker files go under it
    run_id: str
    sweep: str
    run_name: str | None
    shared_process: bool = False  # one of several runs alive in this process at once (a pack's member)


@dataclass(frozen=True)
class Tracker:
    enabled: Callable[[RunConfig], bool]
    build: Callable[[RunContext], Logger]
    close: Callable[[Logger], None] = lambda logger: None


def _tensorboard(run: RunContext) -> Logger:
    from pytorch_lightning.loggers import TensorBoardLogger

    return TensorBoardLogger(save_dir=str(run.folder), name="tensorboard", version="", default_hp_metric=False)


def _wandb(run: RunContext) -> Logger:
    """Lightning's WandbLogger with the mode passed explicitly and the run's own id.

    `WandbLogger(offline=True)` would set WANDB_MODE in os.environ, which leaks into later runs in the
    same process (Ray reuses actors) and overrides `disabled`; passing `mode` keeps it per run.
    `id` + `resume="allow"`: a retried or resumed trial continues its wandb run instead of adding a
    second one (wandb ids are unique per project, so the id is `<sweep>-<run_id>`, the store's key).
    """
    import wandb
    from pytorch_lightning.loggers import WandbLogger

    wb = run.cfg.tracking.wandb
    run.folder.mkdir(parents=True, exist_ok=True)
    return WandbLogger(
        project=wb.project,
        entity=wb.entity,
        name=run.run_name or run.run_id,
        id=f"{run.sweep}-{run.run_id}",
        resume="allow",
        group=wb.group,
        save_dir=str(run.folder),
        mode=wb.mode,
        config=run.cfg.to_dict(),
        log_model=False,
        # a pack's members each keep their own run open side by side; a solo run closes any previous one
        reinit="create_new" if run.shared_process else "finish_previous",
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
    )


def finish_wandb(logger, timeout_s: float = WANDB_FINISH_TIMEOUT_S) -> None:
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


TRACKERS: dict[str, Tracker] = {
    "tensorboard": Tracker(enabled=lambda cfg: cfg.tracking.tensorboard, build=_tensorboard),
    "wandb": Tracker(enabled=lambda cfg: cfg.tracking.wandb.mode != "disabled", build=_wandb, close=finish_wandb),
}


class RunTrackers:
    """The store logger plus every enabled tracker of one run, in the order Lightning gets them."""

    def __init__(self, run: RunContext):
        self.store = StoreLogger(run.folder, run.run_id)
        self.others = {name: t.build(run) for name, t in TRACKERS.items() if t.enabled(run.cfg)}

    @property
    def loggers(self) -> list[Logger]:
        return [self.store, *self.others.values()]

    def close(self) -> None:
        """After the store's record is final: a tracker's trouble never costs the run its result."""
        for name, logger in self.others.items():
            TRACKERS[name].close(logger)
