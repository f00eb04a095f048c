"""Where a sweep's trials compute, decided by `resources` and checked against the trials' configs.

- `resources.gpu: 0`: the trial trains on the CPU, even on a GPU node. Ray (>= 2.x) no longer hides a
  node's GPUs from tasks that asked for none, so the trial hides them itself and forces the CPU.
- a share in (0, 1]: the trial trains on the GPU Ray assigned it (Ray sets CUDA_VISIBLE_DEVICES);
  fractions put several trials on one device (0.25: four at a time).
- above 1: refused (sweep/validate.py). A geocont trial is one small model on one device; more GPUs per trial would sit
  idle (many trials per GPU, not many GPUs per trial, is what these sweeps need).
An explicit `train.accelerator` that contradicts the share is a launch error, never a silent override.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from geocont.config import ConfigError, RunConfig
from geocont.preflight import wandb_problems

GPU_ACCELERATORS = ("gpu", "cuda")


def check_launch(gpu_share: float, configs: Iterable[RunConfig]) -> None:
    """Every placement and tracking problem of a sweep at once (ConfigError), before Ray starts."""
    configs = list(configs)
    problems = placement_problems(gpu_share, {cfg.train.accelerator for cfg in configs})
    for mode in sorted({cfg.tracking.wandb.mode for cfg in configs}):
        problems += wandb_problems(mode)
    if problems:
        raise ConfigError(problems)


def placement_problems(gpu_share: float, accelerators: set[str]) -> list[str]:
    problems = []  # resources.gpu above 1 is refused earlier, when the sweep file is validated
    for accelerator in sorted(accelerators):
        if accelerator in GPU_ACCELERATORS and gpu_share == 0:
            problems.append(
                f"train.accelerator: {accelerator!r} but resources.gpu is 0, so Ray gives the trial no GPU; "
                "set resources.gpu (e.g. 0.25 or 1) or use accelerator auto or cpu"
            )
        if accelerator == "cpu" and gpu_share > 0:
            problems.append(
                f"train.accelerator: 'cpu' but resources.gpu is {gpu_share:g}, a GPU share that would sit idle; "
                "set resources.gpu: 0 or use accelerator auto or gpu"
            )
    return problems


def trial_accelerator(gpu_share: float, asked: str) -> str:
    """What a trial trains on: the CPU without a GPU share (and no GPU visible to it), else what it asked."""
    if gpu_share == 0:
        # Before torch touches CUDA in this worker: no context, no memory on a GPU that is not ours.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return "cpu"
    return asked
