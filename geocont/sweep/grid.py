"""Grid expansion: a SweepConfig -> the list of trials it runs, each a resolved RunConfig.

Variants are the cartesian product of the grid axes (dotted paths, in file order), minus every
variant that matches an `exclude` entry, plus the `include` entries; each variant runs once per
seed (seed-major order, so stopping early leaves whole seeds). A trial's run_id is the content
hash of its resolved config, so the same trial launched twice is the same run.

The sweep is validated once, when it is loaded (`geocont.sweep.load`); expansion trusts it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from geocont.config import RunConfig, deep_merge, resolve, set_dotted
from geocont.sweep.spec import SweepConfig

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
    """Every trial of a loaded (so validated) grid sweep, in seed-major order."""
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
        rules = [coerced(raw, rule) for rule in sweep.exclude]
        grid = [v for v in grid if not any(_matches(coerced(raw, v), rule) for rule in rules)]
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
        if not has_dotted(tree, key):  # an include of another model kind names fields this trial lacks
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


def has_dotted(tree: dict[str, Any], path: str) -> bool:
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


def coerced(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Override values as the config reads them ("1e-4" -> 0.0001), so equal values compare equal."""
    tree = resolve(raw, to_tree(overrides)).to_dict()
    return {path: get_dotted(tree, path) for path in overrides}


def _matches(variant: dict[str, Any], rule: dict[str, Any]) -> bool:
    return all(path in variant and variant[path] == value for path, value in rule.items())
