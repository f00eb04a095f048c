"""The sweep file's shape: pydantic models of its fields (types, unknown keys).

What types cannot say (a grid value the run config refuses, a repeated seed, a search over a seed) is
checked in `geocont.sweep.validate`; `geocont.sweep.load` is the one way from a file to a SweepConfig,
and runs both: a file that loads is a sweep that expands.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, StrictInt

from geocont.fields import Number, Strict


class Resources(Strict):
    """Per trial (per pack when `pack` > 1). Fractions of a GPU share one device; more than one GPU is refused."""

    cpu: Number = Field(1.0, gt=0)
    gpu: Number = Field(0.0, ge=0)
    pack: StrictInt = Field(1, ge=1)  # at most this many same-shape trials per process (geocont.pack)

    def threads(self) -> int:
        """torch threads for one trial: its whole CPUs, at least one."""
        return max(1, math.floor(self.cpu))


Scalar = bool | StrictInt | float | str | None


class SpaceParam(Strict):
    """One searched parameter: float or int in [low, high] (log scale optional), or categorical choices."""

    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(None, gt=0)
    choices: list[Scalar] | None = None


class SearchConfig(Strict):
    """An optuna search: `n_trials` configs drawn by the sampler over `space` (dotted path -> distribution)."""

    metric: str
    mode: Literal["min", "max"]
    n_trials: StrictInt = Field(gt=0)
    space: dict[str, SpaceParam]
    sampler: Literal["tpe", "random"] = "tpe"
    seed: StrictInt = 0  # the sampler's seed, so a search draws the same first configs every time


class SweepConfig(Strict):
    """A sweep file (docs/contracts.md). `base` is a raw RunConfig mapping; grid/include/exclude use dotted paths."""

    name: str
    base: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    include: list[dict[str, Any]] = []
    exclude: list[dict[str, Any]] = []
    seeds: list[StrictInt] = [0]
    search: SearchConfig | None = None
    resources: Resources = Resources()
    tracking: dict[str, Any] | None = None  # a TrackingConfig mapping laid over base.tracking
    retries: StrictInt = Field(1, ge=0)  # re-runs of a trial that failed (diverged trials are never retried)
