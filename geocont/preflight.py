"""Checks of the machine a run will use, made before anything is written or started.

Config validation (config.py) can only see the YAML; these look at the environment: whether the GPU a
run asks for is visible, and whether an online wandb run has a key to log in with. Each raises
ConfigError, so the CLI answers with one line and exit code 2 instead of a trial that fails later.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from geocont.config import ConfigError, RunConfig

WANDB_DEFAULT_HOST = "api.wandb.ai"


def check_run(cfg: RunConfig, accelerator: str | None = None) -> None:
    """Every environment problem of one run at once (ConfigError), or nothing."""
    problems = accelerator_problems(accelerator or cfg.train.accelerator)
    problems += wandb_problems(cfg.tracking.wandb.mode)
    if problems:
        raise ConfigError(problems)


def accelerator_problems(accelerator: str) -> list[str]:
    """An explicit GPU (or MPS) request on a machine that shows none."""
    import torch

    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return [f"train.accelerator: {accelerator!r} but no CUDA device is visible here{seen}; allowed here: auto, cpu"]
    if accelerator == "mps" and not torch.backends.mps.is_available():
        return ["train.accelerator: 'mps' but this machine has no MPS device; allowed here: auto, cpu"]
    return []


def wandb_problems(mode: str) -> list[str]:
    """`online` needs an API key: without one wandb would fail (or prompt) inside every trial."""
    if mode != "online" or has_wandb_key():
        return []
    return [
        "tracking.wandb.mode: 'online' but no wandb API key is set (WANDB_API_KEY, or `wandb login`); "
        "use offline (sync later with `wandb sync`) or disabled"
    ]


def has_wandb_key() -> bool:
    """WANDB_API_KEY, or a netrc entry for the wandb host: the two places wandb itself reads a key from."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", f"https://{WANDB_DEFAULT_HOST}")).hostname or WANDB_DEFAULT_HOST
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])
