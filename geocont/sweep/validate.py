"""Every check on a sweep file, in one place: one line per problem, naming where in the file it is.

Two kinds, both run by `sweep_problems` (geocont.sweep.load runs it on every sweep it reads, once):
- shape: the sweep's own fields where pydantic's types cannot say (a name that is no folder name, a
  repeated seed, a search range with low above high);
- resolved: every grid value, include entry, exclude entry and search range run through
  `geocont.config.resolve` with a prefix naming where it came from ("grid.model.activation: got
  'swish'; allowed: ..."), and every combination of them, so a sweep that loads is a sweep that expands.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from geocont import catalog, kinds
from geocont.config import ConfigError, RunConfig, TrackingConfig, describe_errors, resolve
from geocont.pack import UNPACKABLE_PRECISIONS, precision_problem
from geocont.store import sweep_name_problem
from geocont.sweep.grid import SEED_PATH, base_raw, coerced, format_value, get_dotted, to_tree, variants
from geocont.sweep.spec import Resources, SearchConfig, SpaceParam, SweepConfig

RESERVED_NAMES = ("single",)  # `geocont train` writes single runs there


def sweep_problems(sweep: SweepConfig) -> list[str]:
    """Every problem of a sweep whose types are valid (empty: it expands cleanly)."""
    problems = shape_problems(sweep)
    # A bad name, seed or resource does not stop the grid's checks: every problem of the file at once.
    if not any(line.startswith(("grid.", "search")) for line in problems):
        problems += resolved_problems(sweep)
    return problems


def model_problems(err: ValidationError) -> list[str]:
    """pydantic's errors for a sweep mapping, an unknown key followed by the keys its section allows."""
    return [_file_keys_allowed(line) for line in describe_errors(err)]


def _file_keys_allowed(line: str) -> str:
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


# ---------------------------------------------------------------------------------------------
# Shape


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
    if sweep.resources.pack > 1:
        problems.append(f"resources.pack: {sweep.resources.pack}, but a search samples one trial at a time; allowed: 1")
    problems += _metric_problems(search.metric)
    if not search.space:
        problems.append("search.space: empty; give at least one parameter, e.g. optim.lr: {type: float, ...}")
    for path, param in search.space.items():
        problems += [f"search.space.{path}.{line}" for line in _param_problems(param)]
    return problems


def _metric_problems(name: str) -> list[str]:
    """A search may optimise a catalogue metric, plain or per role of a registered kind (weight/q/v1_continuity)."""
    roles = kinds.every_role()
    if name in catalog.searchable() or name in catalog.searchable(roles):
        return []
    return [
        f"search.metric: unknown metric {name!r}; allowed: {', '.join(catalog.searchable())}, or a per-role name "
        f"such as weight/<role>/v1_continuity for a kind with weight roles ({', '.join(roles)})"
    ]


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


# ---------------------------------------------------------------------------------------------
# Resolved into run configs


def resolved_problems(sweep: SweepConfig) -> list[str]:
    """Every problem found by resolving the sweep's values into run configs (empty when it expands cleanly)."""
    problems = _tracking_problems(sweep)
    if problems:
        return problems
    raw = base_raw(sweep)
    try:
        base = resolve(raw, prefix="base")
    except ConfigError as err:
        return [_keys_allowed_under(line, "base", _default_paths(raw)) for line in err.problems]
    paths = _known_paths(base)
    # Every check that needs only the resolved base, at once (fix one, see the next is what users hate);
    # the trials themselves are built only from values that passed.
    problems = _pack_problems(sweep, base)
    problems += _grid_problems(sweep, raw, paths)
    problems += _include_problems(sweep, raw, paths)
    problems += _exclude_problems(sweep, raw)
    if sweep.search is not None:
        problems += _space_problems(sweep.search.space, raw, base, paths)
    return problems or _trial_problems(sweep)


def _pack_problems(sweep: SweepConfig, base: RunConfig) -> list[str]:
    """pack > 1 needs a packed model for every kind the sweep trains: the base's, and any a grid or include sets."""
    if sweep.resources.pack == 1:
        return []
    used = [k for k in _swept(sweep, "model.kind", base.model.kind) if k in kinds.names()]  # others: reported elsewhere
    problems = [
        f"resources.pack: {sweep.resources.pack}, but model.kind '{name}' has no packed model; allowed: 1"
        for name in used
        if kinds.get(name).packed is None
    ]
    precisions = _swept(sweep, "train.precision", base.train.precision)
    return problems + [precision_problem(p) for p in precisions if p in UNPACKABLE_PRECISIONS]


def _swept(sweep: SweepConfig, path: str, base_value: Any) -> list[str]:
    """Every value the sweep's trials take at `path`: the base's, a grid axis's, the include rows' (once each)."""
    values = [base_value, *sweep.grid.get(path, []), *(row.get(path) for row in sweep.include)]
    return list(dict.fromkeys(str(v) for v in values if v is not None))


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
    return _known_paths(RunConfig.model_validate({"model": {"kind": kind}} if kind in kinds.names() else {}))


def _resolve_lines(
    raw: dict[str, Any], overrides: dict[str, Any], prefix: str, paths: dict[str, list[str]]
) -> list[str]:
    """Problems of base + overrides, worded under `prefix` (e.g. 'grid.model.activation: ...')."""
    try:
        resolve(raw, to_tree(overrides), prefix=prefix)
    except ConfigError as err:
        return [_keys_allowed_under(line, prefix, paths) for line in err.problems]
    return []


def _keys_allowed_under(line: str, prefix: str, paths: dict[str, list[str]]) -> str:
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
            problems += _repeats(f"grid.{axis}", [coerced(raw, {axis: v})[axis] for v in values])
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
            read_as = coerced(raw, {path: value})[path]
            allowed = [coerced(raw, {path: v})[path] for v in sweep.grid[path]]
            if read_as not in allowed:
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
