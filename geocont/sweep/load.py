"""The ways to a SweepConfig: a YAML file, a file with `--set` pairs, or the sweep recorded in a store.

Each goes through `parse_sweep`, which validates the whole sweep once (geocont.sweep.validate) and
raises one ConfigError with every problem, each line naming its source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from geocont import store
from geocont.config import ConfigError, deep_merge, parse_overrides, parse_yaml, read_text, read_yaml, with_problems
from geocont.sweep.spec import SweepConfig
from geocont.sweep.validate import model_problems, sweep_problems

# Top-level sweep fields a `--set` may change; grid/include/exclude/search keys are dotted run paths
# themselves, so they are edited in the file.
SETTABLE = ("name", "base", "seeds", "resources", "tracking", "retries")


def parse_sweep(data: dict[str, Any], source: str = "sweep") -> SweepConfig:
    """A validated SweepConfig from a parsed mapping; every problem is one line of one ConfigError."""
    try:
        sweep = SweepConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError([f"{source}: {line}" for line in model_problems(err)]) from None
    problems = sweep_problems(sweep)
    if problems:
        raise ConfigError([f"{source}: {line}" for line in problems])
    return sweep


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and fully validate a sweep YAML file (raises ConfigError listing every problem)."""
    duplicates: list[str] = []
    data = read_yaml(path, duplicates)
    return with_problems(duplicates, lambda: parse_sweep(data, str(path)))


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


def launch_text(path: str | Path, overrides: list[str]) -> tuple[SweepConfig, str]:
    """SWEEP.yaml (+ `--set` pairs) validated, and the text to record as launched."""
    if overrides:
        return with_overrides(path, overrides)
    return load_sweep(path), read_text(Path(path))


def sweep_from_text(text: str, source: str) -> SweepConfig:
    """The sweep stored in a results store (sweep.yaml as launched)."""
    return parse_sweep(parse_yaml(text, source) or {}, source)


def stored_sweep(store_dir: str | Path, name: str) -> tuple[SweepConfig, str]:
    """The sweep as launched (`<store>/<name>/sweep.yaml`) and its text: all that `resume` needs."""
    text = store.read_spec(store_dir, name)
    return sweep_from_text(text, str(store.spec_path(store_dir, name))), text
