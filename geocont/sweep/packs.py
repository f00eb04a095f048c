"""Which trials of a sweep train together: `resources.pack: K` groups same-shape trials into packs.

Trials whose configs share a `pack_key` (they differ only in seed, init_std and optimizer
hyperparameters) go into packs of at most K, in the grid's order, so the three seeds of a
variant land in one pack. Only the pending trials are packed: a resumed sweep packs what is left.
"""

from __future__ import annotations

from typing import Any

from geocont.pack import pack_key


def group(trials: list[Any], size: int) -> list[list[Any]]:
    """`trials` in packs of at most `size`; each pack's members share one pack_key, grid order kept."""
    if size <= 1:
        return [[t] for t in trials]
    open_packs: dict[tuple, list[Any]] = {}
    packs: list[list[Any]] = []
    for trial in trials:
        key = pack_key(trial.config)
        pack = open_packs.get(key)
        if pack is None or len(pack) == size:
            pack = open_packs[key] = []
            packs.append(pack)
        pack.append(trial)
    return packs


def payload(pack: list[Any]) -> dict[str, Any]:
    """What crosses to the Ray worker: a lone trial's payload, or a pack's with its members'."""
    first = pack[0]
    if len(pack) == 1:
        return first.payload()
    name = f"{first.name} +{len(pack) - 1} packed"
    return {"run_id": first.run_id, "name": name, "members": [t.payload() for t in pack]}


def members(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials a Tune trial's payload trains: its members, or itself."""
    return spec.get("members", [spec])
