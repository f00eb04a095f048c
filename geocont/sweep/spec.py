"""The sweep file: a pydantic model of its shape, and load_sweep() that validates all of it.

Shape checks (types, unknown keys) live in the models; checks that need the run config (every grid
value, include entry, exclude entry and search range resolved into a RunConfig) live in
`geocont.sweep.grid.check`, which load_sweep runs too: a file that loads is a sweep that expands.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from geocont.config import (
    ROLES,
    ConfigError,
    Number,
    deep_merge,
    describe_errors,
    parse_overrides,
    parse_yaml,
    read_yaml,
    with_problems,
)
from geocont.store import sweep_name_problem

RESERVED_NAMES = ("single",)  # `geocont train` writes single runs there

# Metrics that train() reports and a search may optimise (docs/contracts.md's names); transformers add
# one name per projection role.
METRICS = (
    "train/loss", "val/loss", "val/acc", "val/ppl",
    "weight/v1_continuity", "weight/u1_continuity", "weight/sigma2_continuity", "weight/sigma2_continuity_u",
    "weight/spectral_gap", "grad_init/v1_continuity", "grad_init/u1_continuity",
    "grad_cum/v1_continuity", "grad_cum/u1_continuity", "delta_gw/v1", "delta_gw/u1", "update_ratio",
)  # fmt: skip
ROLE_METRIC = re.compile(rf"(weight|grad_init|grad_cum)/({'|'.join(ROLES)})/(v1|u1)_continuity")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Strict):
    """Per trial. Fractions of a GPU share one device between trials; more than one GPU is refused."""

    cpu: Number = Field(1.0, gt=0)
    gpu: Number = Field(0.0, ge=0)

    def threads(self) -> int:
        """torch threads for one trial: its whole CPUs, at least one."""
        return max(1, math.floor(self.cpu))


Scalar = bool | StrictInt | float | str | None


class SpaceParam(_Strict):
    """One searched parameter: float or int in [low, high] (log scale optional), or categorical choices."""

    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(None, gt=0)
    choices: list[Scalar] | None = None


class SearchConfig(_Strict):
    """An optuna search: `n_trials` configs drawn by the sampler over `space` (dotted path -> distribution)."""

    metric: str
    mode: Literal["min", "max"]
    n_trials: StrictInt = Field(gt=0)
    space: dict[str, SpaceParam]
    sampler: Literal["tpe", "random"] = "tpe"
    seed: StrictInt = 0  # the sampler's seed, so a search draws the same first configs every time


class SweepConfig(_Strict):
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


def parse_sweep(data: dict[str, Any], source: str = "sweep") -> SweepConfig:
    """A validated SweepConfig from a parsed mapping; every problem is one line of one ConfigError."""
    try:
        sweep = SweepConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError([_with_source(source, _say_allowed(line)) for line in describe_errors(err)]) from None
    problems = shape_problems(sweep)
    # A bad name, seed or resource does not stop the grid's checks: every problem of the file at once.
    if not any(line.startswith(("grid.", "search")) for line in problems):
        from geocont.sweep.grid import check  # grid builds on this module; imported late to avoid a cycle

        problems += check(sweep)
    if problems:
        raise ConfigError([_with_source(source, line) for line in problems])
    return sweep


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and fully validate a sweep YAML file (raises ConfigError listing every problem)."""
    duplicates: list[str] = []
    data = read_yaml(path, duplicates)
    return with_problems(duplicates, lambda: parse_sweep(data, str(path)))


# Top-level sweep fields a `--set` may change; grid/include/exclude/search keys are dotted run paths
# themselves, so they are edited in the file.
SETTABLE = ("name", "base", "seeds", "resources", "tracking", "retries")


def with_overrides(path: str | Path, pairs: list[str]) -> tuple[SweepConfig, str]:
    """SWEEP.yaml with `--set` pairs laid over it: (validated sweep, the YAML text to record as launched).

    `base.preset=paper-transformer` scales a whole sweep; give it a new `name=` too, so its runs do not
    share a store folder with the unscaled ones.
    """
    raw = read_yaml(path)
    overrides = parse_overrides(pairs)
    unknown = [key for key in overrides if key not in SETTABLE]
    if unknown:
        raise ConfigError(
            [f"--set {key}: not settable from the command line; allowed: {', '.join(SETTABLE)}" for key in unknown]
        )
    merged = deep_merge(raw, overrides)
    sweep = parse_sweep(merged, f"{path} with --set")
    header = f"# {Path(path).name} launched with --set {' --set '.join(pairs)}\n"
    return sweep, header + yaml.safe_dump(merged, sort_keys=False)


def sweep_from_text(text: str, source: str) -> SweepConfig:
    """The sweep stored in a results store (sweep.yaml as launched)."""
    return parse_sweep(parse_yaml(text, source) or {}, source)


def _with_source(source: str, line: str) -> str:
    return f"{source}: {line}"


def _say_allowed(line: str) -> str:
    """'resources.memory: unknown key' -> '...; allowed: cpu, gpu' (the keys of that section of the file)."""
    where, _, what = line.partition(": ")
    if what != "unknown key":
        return line
    section = where.rpartition(".")[0] if "." in where else ""
    if section.startswith("search.space."):
        model: type[BaseModel] | None = SpaceParam
    else:
        model = {"": SweepConfig, "resources": Resources, "search": SearchConfig}.get(section)
    return f"{line}; allowed: {', '.join(model.model_fields)}" if model else line


def shape_problems(sweep: SweepConfig) -> list[str]:
    """Checks on the sweep's own fields that pydantic's types cannot say."""
    problems = []
    bad_name = sweep_name_problem(sweep.name)
    if bad_name:
        problems.append(f"name: {bad_name}")
    elif sweep.name in RESERVED_NAMES:
        problems.append(f"name: {sweep.name!r} is reserved for single runs; choose another name")
    problems += _seed_problems(sweep.seeds)
    gpu = sweep.resources.gpu
    if gpu > 1:  # see sweep/placement.py
        problems.append(
            f"resources.gpu: {gpu:g} per trial, but a trial trains on one device; allowed: 0 (CPU) or a share up "
            "to 1 (0.25 puts four trials on one GPU)"
        )
    for path, values in sweep.grid.items():
        if not values:
            problems.append(f"grid.{path}: empty axis; give at least one value")
    if sweep.search is not None:
        problems += _search_problems(sweep)
    return problems


def _seed_problems(seeds: list[int]) -> list[str]:
    if not seeds:
        return ["seeds: empty; give at least one seed, e.g. seeds: [0]"]
    problems = [f"seeds.{i}: {s} is negative; allowed: integers >= 0" for i, s in enumerate(seeds) if s < 0]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        problems.append(f"seeds: {', '.join(map(str, repeated))} listed more than once; each seed runs once")
    return problems


def _search_problems(sweep: SweepConfig) -> list[str]:
    search, problems = sweep.search, []
    if sweep.grid or sweep.include or sweep.exclude:
        problems.append(
            "search: a search sweep takes no grid, include or exclude; put the axes in search.space "
            "as {type: categorical, choices: [...]}"
        )
    if len(sweep.seeds) != 1:
        problems.append(
            f"seeds: a search runs each sampled config with one seed (got {len(sweep.seeds)}); "
            "rerun the best configs over seeds with a grid sweep"
        )
    if search.metric not in METRICS and not ROLE_METRIC.fullmatch(search.metric):
        problems.append(f"search.metric: unknown metric {search.metric!r}; allowed: {', '.join(METRICS)}, "
                        "or weight|grad_init|grad_cum/<role>/v1|u1_continuity for transformers")  # fmt: skip
    if not search.space:
        problems.append("search.space: empty; give at least one parameter, e.g. optim.lr: {type: float, ...}")
    for path, param in search.space.items():
        problems += [f"search.space.{path}.{line}" for line in _param_problems(param)]
    return problems


def _param_problems(param: SpaceParam) -> list[str]:
    if param.type == "categorical":
        return _categorical_problems(param)
    problems = [f"{key}: missing; a {param.type} range needs low and high" for key in ("low", "high")
                if getattr(param, key) is None]  # fmt: skip
    if param.choices is not None:
        problems.append(f"choices: only categorical parameters take choices (this one is {param.type})")
    if problems:
        return problems
    if param.type == "int":
        problems += [f"{key}: {getattr(param, key)} is not a whole number" for key in ("low", "high", "step")
                     if getattr(param, key) is not None and not float(getattr(param, key)).is_integer()]  # fmt: skip
    if not param.low < param.high:
        problems.append(f"low: {param.low:g} is not below high ({param.high:g})")
    if param.log and param.low <= 0:
        problems.append(f"low: a log-scale range needs low > 0 (got {param.low:g})")
    if param.log and param.step is not None:
        problems.append("step: optuna cannot combine step with log: true; drop one")
    return problems


def _categorical_problems(param: SpaceParam) -> list[str]:
    extra = [key for key in ("low", "high", "step") if getattr(param, key) is not None]
    problems = [f"{key}: categorical parameters take choices only" for key in extra]
    if not param.choices:
        problems.append("choices: missing or empty; give at least one choice")
    elif len({repr(c) for c in param.choices}) != len(param.choices):
        problems.append("choices: a choice repeats")
    return problems
