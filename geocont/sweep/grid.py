"""Grid expansion: a SweepConfig -> the list of trials it runs, each a resolved RunConfig.

Variants are the cartesian product of the grid axes (dotted paths, in file order), minus every
variant that matches an `exclude` entry, plus the `include` entries; each variant runs once per
seed (seed-major order, so stopping early leaves whole seeds). A trial's run_id is the content
hash of its resolved config, so the same trial launched twice is the same run.

`check` runs every value, entry and trial through `geocont.config.resolve` with a prefix naming
where it came from ("grid.model.activation: got 'swish'; allowed: ...").
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from geocont.config import ConfigError, RunConfig, TrackingConfig, deep_merge, describe_errors, resolve, set_dotted
from geocont.sweep.spec import SpaceParam, SweepConfig

SEED_PATH = "train.seed"
SHORT_NAMES = {"activation": "act", "residual": "res", "init_std": "init", "weight_decay": "wd", "batch_size": "bs"}


@dataclass(frozen=True)
class Trial:
    run_id: str
    name: str  # readable: "act=gelu res=false seed=1" (also the wandb run name)
    overrides: dict[str, Any]  # dotted path -> value over the sweep's base, train.seed included
    config: RunConfig

    def payload(self) -> dict[str, Any]:
        """What crosses the Ray process boundary: plain data only."""
        return {"run_id": self.run_id, "name": self.name, "config": self.config.to_dict()}


# ---------------------------------------------------------------------------------------------
# Expansion


def base_raw(sweep: SweepConfig) -> dict[str, Any]:
    """The sweep's base run config with the sweep-level tracking block laid over it."""
    return deep_merge(sweep.base, {"tracking": sweep.tracking}) if sweep.tracking is not None else dict(sweep.base)


def expand(sweep: SweepConfig) -> list[Trial]:
    """Every trial of a grid sweep, validated. Raises ConfigError listing every problem."""
    problems = check(sweep)
    if problems:
        raise ConfigError(problems)
    return _trials(sweep)


def _trials(sweep: SweepConfig) -> list[Trial]:
    raw, keys = base_raw(sweep), name_keys(sweep)
    trials, seen = [], set()
    for seed in sweep.seeds:
        for variant in variants(sweep):
            overrides = {**variant} if SEED_PATH in variant else {**variant, SEED_PATH: seed}
            config = resolve(raw, to_tree(overrides))
            if config.run_id() not in seen:  # an include entry may repeat a grid point
                seen.add(config.run_id())
                trials.append(Trial(config.run_id(), trial_name(config, keys), overrides, config))
    return trials


def variants(sweep: SweepConfig) -> list[dict[str, Any]]:
    """Dotted overrides of every variant (before seeds): grid product minus excludes, then includes."""
    axes = list(sweep.grid)
    grid = [dict(zip(axes, values)) for values in itertools.product(*sweep.grid.values())]
    if sweep.exclude:
        raw = base_raw(sweep)
        rules = [_coerced(raw, rule) for rule in sweep.exclude]
        grid = [v for v in grid if not any(_matches(_coerced(raw, v), rule) for rule in rules)]
    return grid + [dict(entry) for entry in sweep.include]


def name_keys(sweep: SweepConfig) -> list[str]:
    """The paths that differ between variants, in file order: they make up a trial's readable name."""
    keys = list(sweep.grid)
    for entry in sweep.include:
        keys += [k for k in entry if k not in keys and k != SEED_PATH]
    return keys


def trial_name(config: RunConfig, keys: list[str]) -> str:
    """'act=gelu res=false seed=1': each key's value read from the resolved config."""
    tree = config.to_dict()
    # A section's `name` reads best as the section ("optim=sgd", "data=mnist"); other fields by their leaf.
    leaves = [k.split(".")[-2] if k.endswith(".name") and "." in k else k.rsplit(".", 1)[-1] for k in keys]
    parts = []
    for key, leaf in zip(keys, leaves):
        if not _has_dotted(tree, key):  # an include of another model kind names fields this trial lacks
            continue
        label = SHORT_NAMES.get(leaf, leaf) if leaves.count(leaf) == 1 else key
        parts.append(f"{label}={format_value(get_dotted(tree, key))}")
    return " ".join([*parts, f"seed={config.train.seed}"])


def format_value(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def get_dotted(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for key in path.split("."):
        node = node[key]
    return node


def _has_dotted(tree: dict[str, Any], path: str) -> bool:
    try:
        get_dotted(tree, path)
    except (KeyError, TypeError):
        return False
    return True


def to_tree(overrides: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, value in overrides.items():
        set_dotted(tree, path, value)
    return tree


def _coerced(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Override values as the config reads them ("1e-4" -> 0.0001), so equal values compare equal."""
    tree = resolve(raw, to_tree(overrides)).to_dict()
    return {path: get_dotted(tree, path) for path in overrides}


def _matches(variant: dict[str, Any], rule: dict[str, Any]) -> bool:
    return all(path in variant and variant[path] == value for path, value in rule.items())


# ---------------------------------------------------------------------------------------------
# Validation: one line per problem, naming where in the sweep file it is


def check(sweep: SweepConfig) -> list[str]:
    """Every problem of a structurally valid sweep (empty when it expands cleanly)."""
    problems = _tracking_problems(sweep)
    if problems:
        return problems
    raw = base_raw(sweep)
    try:
        base = resolve(raw, prefix="base")
    except ConfigError as err:
        return [_say_allowed(line, "base", _default_paths(raw)) for line in err.problems]
    paths = _known_paths(base)
    problems = _grid_problems(sweep, raw, paths)
    problems += _include_problems(sweep, raw, paths)
    if problems:
        return problems
    problems = _exclude_problems(sweep, raw)
    if sweep.search is not None:
        problems += _space_problems(sweep.search.space, raw, base, paths)
    if problems:
        return problems
    return _trial_problems(sweep)


def _tracking_problems(sweep: SweepConfig) -> list[str]:
    if sweep.tracking is None:
        return []
    try:
        TrackingConfig.model_validate(sweep.tracking)
    except ValidationError as err:
        return describe_errors(err, "tracking")
    return []


def _known_paths(base: RunConfig) -> dict[str, list[str]]:
    """section path -> its keys, for 'unknown key' errors that say what is allowed."""
    sections: dict[str, list[str]] = {}

    def walk(tree: dict[str, Any], prefix: str) -> None:
        sections[prefix] = list(tree)
        for key, value in tree.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}.{key}" if prefix else key)

    walk(base.to_dict(), "")
    return sections


def _default_paths(raw: dict[str, Any]) -> dict[str, list[str]]:
    """Sections of a default config of the base's model kind, for a base that does not resolve."""
    kind = raw.get("model", {}).get("kind") if isinstance(raw.get("model"), dict) else None
    return _known_paths(RunConfig.model_validate({"model": {"kind": kind}} if kind in ("mlp", "transformer") else {}))


def _resolve_lines(
    raw: dict[str, Any], overrides: dict[str, Any], prefix: str, paths: dict[str, list[str]]
) -> list[str]:
    """Problems of base + overrides, worded under `prefix` (e.g. 'grid.model.activation: ...')."""
    try:
        resolve(raw, to_tree(overrides), prefix=prefix)
    except ConfigError as err:
        return [_say_allowed(line, prefix, paths) for line in err.problems]
    return []


def _say_allowed(line: str, prefix: str, paths: dict[str, list[str]]) -> str:
    where, sep, what = line.partition(": ")
    if what != "unknown key" or not where.startswith(prefix + "."):
        return line
    section = where[len(prefix) + 1 :].rpartition(".")[0]
    allowed = paths.get(section)
    return f"{line}; allowed under {section or 'the top level'}: {', '.join(allowed)}" if allowed else line


def _grid_problems(sweep: SweepConfig, raw: dict[str, Any], paths: dict[str, list[str]]) -> list[str]:
    problems: list[str] = []
    for axis, values in sweep.grid.items():
        if axis == SEED_PATH:
            problems.append(f"grid.{axis}: seeds are not a grid axis; list them under seeds: [...]")
            continue
        lines: list[str] = []
        for value in values:
            for line in _resolve_lines(raw, {axis: value}, "grid", paths):
                if line.startswith("grid: "):  # a rule across fields: say which value broke it
                    line = f"grid.{axis}: {format_value(value)!r} conflicts with the base: {line[6:]}"
                if line not in lines:
                    lines.append(line)
        problems += lines
        if not lines:
            problems += _repeats(f"grid.{axis}", [_coerced(raw, {axis: v})[axis] for v in values])
    return problems


def _repeats(where: str, values: list[Any]) -> list[str]:
    seen, repeated = [], []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.append(value)
    return [f"{where}: {format_value(v)!r} appears more than once; each value runs once" for v in repeated]


def _include_problems(sweep: SweepConfig, raw: dict[str, Any], paths: dict[str, list[str]]) -> list[str]:
    problems = []
    for i, entry in enumerate(sweep.include):
        if not entry:
            problems.append(f"include.{i}: empty; give dotted overrides, e.g. {{model.activation: gelu}}")
            continue
        problems += _resolve_lines(raw, entry, f"include.{i}", paths)
    return problems


def _exclude_problems(sweep: SweepConfig, raw: dict[str, Any]) -> list[str]:
    problems = []
    axes = ", ".join(sweep.grid) or "none"
    for i, rule in enumerate(sweep.exclude):
        if not rule:
            problems.append(f"exclude.{i}: empty; it would remove every grid point")
        for path, value in rule.items():
            if path not in sweep.grid:
                problems.append(f"exclude.{i}.{path}: not a grid axis; axes: {axes}")
                continue
            lines = _resolve_lines(raw, {path: value}, f"exclude.{i}", {})
            if lines:
                problems += lines
                continue
            coerced = _coerced(raw, {path: value})[path]
            allowed = [_coerced(raw, {path: v})[path] for v in sweep.grid[path]]
            if coerced not in allowed:
                values = ", ".join(format_value(v) for v in allowed)
                problems.append(f"exclude.{i}.{path}: {format_value(value)!r} is not a value of grid.{path} ({values})")
    if not problems and sweep.grid and not variants(sweep):
        problems.append("exclude: removes every grid point and include adds none; nothing would run")
    return problems


def _space_problems(
    space: dict[str, SpaceParam], raw: dict[str, Any], base: RunConfig, paths: dict[str, list[str]]
) -> list[str]:
    problems, tree = [], base.to_dict()
    for path, param in space.items():
        where = f"search.space.{path}"
        if path == SEED_PATH:
            problems.append(f"{where}: the seed is not searched; set seeds: [N]")
            continue
        probes = param.choices if param.type == "categorical" else [param.low, param.high]
        lines: list[str] = []
        for value in probes or []:
            if param.type == "int" and isinstance(value, float):
                value = int(value)
            lines += [ln for ln in _resolve_lines(raw, {path: value}, "search.space", paths) if ln not in lines]
        if not lines and param.type == "float" and _is_int_field(tree, path):
            lines.append(f"{where}: an integer field; use type: int")
        problems += lines
    return problems


def _is_int_field(tree: dict[str, Any], path: str) -> bool:
    try:
        value = get_dotted(tree, path)
    except (KeyError, TypeError):
        return False
    return isinstance(value, int) and not isinstance(value, bool)


def _trial_problems(sweep: SweepConfig) -> list[str]:
    """Combinations can be invalid where each value alone is fine (e.g. a transformer on digits)."""
    raw, first_seen = base_raw(sweep), {}
    for variant in variants(sweep) if sweep.search is None else []:
        try:
            resolve(raw, to_tree(variant), prefix="grid")
        except ConfigError as err:
            for line in err.problems:
                first_seen.setdefault(line, variant)
    return [
        f"{line} (in the trial {' '.join(f'{k}={format_value(v)}' for k, v in variant.items())})"
        for line, variant in first_seen.items()
    ]
