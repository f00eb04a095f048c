"""The registry of model kinds: `model.kind` -> its ModelKind (geocont.kinds.base).

The built-in kinds are registered here. Another family registers itself with `register(KIND)`; to
reach every process of a sweep (Ray workers import geocont afresh), name its module in the
GEOCONT_KINDS environment variable (comma-separated import paths), which is read when this
registry is first imported. See docs/architecture.md, "Adding a model kind".
"""

from __future__ import annotations

import importlib
import os

from geocont import catalog
from geocont.fields import ConfigError
from geocont.kinds.base import ModelKind
from geocont.kinds.mlp import MLP
from geocont.kinds.transformer import TRANSFORMER

PLUGINS_ENV = "GEOCONT_KINDS"
DEFAULT = "mlp"  # a model section without `kind` is the MLP

_KINDS: dict[str, ModelKind] = {}


def register(kind: ModelKind) -> ModelKind:
    """Add a kind (again under the same name replaces it, e.g. a reloaded module). Returns it."""
    unknown = [m for m in kind.metric_names() if catalog.find(m) is None]
    if unknown:
        raise ValueError(f"model kind {kind.name!r}: its dashboard names metrics not in the catalogue: {unknown}")
    if kind.config.model_fields["kind"].default != kind.name:
        raise ValueError(f"model kind {kind.name!r}: its config's `kind` must default to {kind.name!r}")
    _KINDS[kind.name] = kind
    return kind


def get(name: str) -> ModelKind:
    """The kind called `name`; ConfigError naming the registered ones otherwise."""
    try:
        return _KINDS[name]
    except KeyError:
        allowed = ", ".join(names())
        raise ConfigError(
            [
                f"model.kind: unknown kind {name!r}; allowed: {allowed} (another package's kind: name its module in "
                f"{PLUGINS_ENV})"
            ]
        ) from None


def names() -> list[str]:
    return list(_KINDS)


def registered() -> list[ModelKind]:
    return list(_KINDS.values())


def every_role() -> tuple[str, ...]:
    """The roles of every registered kind, each once (what per-role metric names may contain)."""
    return tuple(dict.fromkeys(r for k in _KINDS.values() for r in k.roles))


def load_plugins(spec: str | None = None) -> None:
    """Import the kind modules named in `spec` (default: $GEOCONT_KINDS); each registers itself."""
    for name in (spec if spec is not None else os.environ.get(PLUGINS_ENV, "")).split(","):
        if name.strip():
            importlib.import_module(name.strip())


register(MLP)
register(TRANSFORMER)
load_plugins()
