"""Metric dicts with docs/contracts.md's names for groups of same-role weights (role '' = the MLP stack).

These helpers turn {role: (L, m, n) stack} into {"weight/q/v1_continuity": value, ...}; callers
decide when to call them. Non-finite stacks (a diverged run) give NaN instead of raising.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geocont.metrics import spectral

WEIGHT_KEYS = ("v1_continuity", "u1_continuity", "sigma2_continuity", "sigma2_continuity_u", "spectral_gap")
DIRECTION_KEYS = ("v1_continuity", "u1_continuity")


def metric_name(kind: str, role: str, key: str) -> str:
    """'weight', 'q', 'v1_continuity' -> 'weight/q/v1_continuity'; role '' drops that level."""
    return f"{kind}/{role}/{key}" if role else f"{kind}/{key}"


def _named(kind: str, role: str, values: dict[str, float]) -> dict[str, float]:
    return {metric_name(kind, role, k): v for k, v in values.items()}


def _or_nan(compute, W: Tensor, keys: tuple[str, ...]) -> dict[str, float]:
    """compute(W), or NaN for every key when W is non-finite or LAPACK gives up on it."""
    try:
        return compute(W)
    except (spectral.NonFiniteMatrix, torch.linalg.LinAlgError):
        return dict.fromkeys(keys, math.nan)


def weight_metrics(stacks: dict[str, Tensor], initial: dict[str, Tensor]) -> dict[str, float]:
    """weight/* continuity, spectral gap and update_ratio (per role for transformers)."""
    out: dict[str, float] = {}
    for role, W in stacks.items():
        values = _or_nan(spectral.weight_continuity, W, WEIGHT_KEYS)
        out.update(_named("weight", role, values))
        out["update_ratio" if not role else f"update_ratio/{role}"] = spectral.update_ratio(W, initial[role])
    if len(stacks) > 1:  # transformers: also the mean over roles under the plain name
        roles = [r for r in stacks]
        out["update_ratio"] = sum(out[f"update_ratio/{r}"] for r in roles) / len(roles)
    return out


def direction_metrics(kind: str, stacks: dict[str, Tensor], warm: dict[str, Tensor] | None = None) -> dict[str, float]:
    """v1/u1 continuity of gradient stacks under `kind` ('grad_init' or 'grad_cum').

    Only the leading pair is needed, so subspace iteration replaces the full eigendecomposition; `warm`
    (role -> previous subspace) carries the starting vectors from one call to the next and is updated.
    """
    out: dict[str, float] = {}
    for role, G in stacks.items():
        total = G.flatten(1).norm(dim=1).sum()  # one pass: NaN/inf anywhere, or an all-zero stack
        if not (bool(torch.isfinite(total)) and total > 0):
            out.update(_named(kind, role, dict.fromkeys(DIRECTION_KEYS, math.nan)))
            continue
        _, u, v, basis = spectral.top_singular_pair(G, start=None if warm is None else warm.get(role))
        if warm is not None:
            warm[role] = basis
        values = {
            "v1_continuity": spectral.adjacent_abs_cos(v).mean().item(),
            "u1_continuity": spectral.adjacent_abs_cos(u).mean().item(),
        }
        out.update(_named(kind, role, values))
    return out


def delta_gw_metrics(values: dict[str, float], roles: list[str]) -> dict[str, float]:
    """delta_gw/{role/}v1|u1 = grad_cum continuity - weight continuity, from already computed values."""
    out: dict[str, float] = {}
    for role in roles:
        for space in ("v1", "u1"):
            key = f"{space}_continuity"
            grad, weight = values[metric_name("grad_cum", role, key)], values[metric_name("weight", role, key)]
            out[metric_name("delta_gw", role, space)] = grad - weight
    return out
