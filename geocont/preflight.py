"""Checks of a run against the world, made before anything is written or started.

Config validation (config.py) can only see the YAML; these look at what the run needs: the GPU it asks
for, an API key for an online wandb run, data that reads back cleanly and a model that can be
allocated. Each problem is one ConfigError line, so the CLI answers with exit code 2 instead of a trial
that fails later (and `geocont sweep launch` runs the same checks before Ray starts).
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from geocont import kinds
from geocont.config import ConfigError, RunConfig
from geocont.datafiles import data_problems

WANDB_DEFAULT_HOST = "api.wandb.ai"
BYTES_PER_PARAMETER = 16  # fp32 weight, its gradient and Adam's two moments
# A cluster's nodes are unknown before Ray connects: only what no machine could hold is refused up front
# (the trial checks again on its node).
CLUSTER_NODE_MAX_MEMORY = 2**44  # 16 TiB


def check_run(cfg: RunConfig, accelerator: str | None = None) -> None:
    """Every problem of one run at once (ConfigError), or nothing."""
    problems = accelerator_problems(accelerator or cfg.train.accelerator)
    problems += wandb_problems(cfg.tracking.wandb.mode)
    problems += run_problems(cfg)
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


def run_problems(cfg: RunConfig, memory: int | None = None) -> list[str]:
    """Problems that only the run's data or the memory it trains in (default: this machine's) can show."""
    return size_problems(cfg, memory) + data_problems(cfg.data)


def parameter_count(cfg: RunConfig) -> int:
    """About how many parameters the config's network has (its model kind's estimate)."""
    return kinds.get(cfg.model.kind).parameters(cfg)


def machine_memory() -> int:
    """Bytes of physical memory on this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def size_problems(cfg: RunConfig, memory: int | None = None) -> list[str]:
    """A model that cannot be allocated: one line naming its sizes (a GPU has less memory still)."""
    memory = memory or machine_memory()
    need = parameter_count(cfg) * BYTES_PER_PARAMETER
    if need <= memory:
        return []
    m = cfg.model
    sizes = ", ".join(f"{k} {getattr(m, k)}" for k in ("depth", "width", "mlp_width") if hasattr(m, k)) or "the network"
    return [
        f"model: {sizes} has about {parameter_count(cfg):.2g} parameters, {need / 1e9:.3g} GB to train; "
        f"this machine has {memory / 1e9:.3g} GB; allowed: a model that fits in memory"
    ]
