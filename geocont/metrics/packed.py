"""geometry.py's metric dicts for K packed trials at once: one decomposition call per role for all K.

A packed stack is (K, L, m, n): member k's L same-role matrices. Its K * L matrices go through one
batched eigh (weights) or one batched subspace iteration (gradients) as a (K * L, m, n) stack, and the
adjacent-layer cosines are taken within each member only. The result is a list of K dicts with exactly
the names and values geometry.weight_metrics / direction_metrics give for each member alone, NaN for a
member whose stack is non-finite (a diverged member), as there.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geocont.metrics import spectral
from geocont.metrics.geometry import DIRECTION_KEYS, WEIGHT_KEYS, metric_name


def packed_stack(params: list[Tensor]) -> Tensor:
    """L packed matrices (K, m, n) as one (K, L, m, n) fp32 stack, detached (the solo `stack` per member)."""
    return torch.stack([p.detach().float() for p in params], dim=1)


def weight_metrics(stacks: dict[str, Tensor], initial: dict[str, Tensor]) -> list[dict[str, float]]:
    """geometry.weight_metrics for each of K members: stacks and initial are role -> (K, L, m, n)."""
    K = next(iter(stacks.values())).shape[0]
    out: list[dict[str, float]] = [{} for _ in range(K)]
    for role, W in stacks.items():
        values = _weight_values(W)
        ratio = spectral.update_ratio_values(W, initial[role])  # (K,)
        values["update_ratio" if not role else f"update_ratio/{role}"] = ratio.nan_to_num(math.nan, math.nan, math.nan)
        names = {key: key if key.startswith("update_ratio") else metric_name("weight", role, key) for key in values}
        _scatter(out, {names[key]: v for key, v in values.items()})
    if len(stacks) > 1:  # transformers: also the mean over roles under the plain name, as geometry does
        for member in out:
            member["update_ratio"] = sum(member[f"update_ratio/{r}"] for r in stacks) / len(stacks)
    return out


def _weight_values(W: Tensor) -> dict[str, Tensor]:
    """spectral.continuity_values per member, (K,) each, from one eigh over the finite members' matrices."""
    K, L = W.shape[:2]
    good = torch.isfinite(W).flatten(1).all(1).nonzero().squeeze(1)  # a diverged member gives NaN, not an error
    values = {key: torch.full((K,), math.nan) for key in WEIGHT_KEYS}
    if len(good) == 0:
        return values
    try:
        spec = spectral._spectrum(_members(W, good).flatten(0, 1))  # (G * L, ...): one eigh
        found = spectral.continuity_values(spectral.Spectrum(*(t.unflatten(0, (len(good), L)) for t in spec)))
    except torch.linalg.LinAlgError:  # LAPACK gave up on some matrix: find whose, as the solo route would
        return _weight_values_one_by_one(W)
    for key, v in found.items():
        values[key][good.cpu()] = v.float().cpu()
    return values


def _weight_values_one_by_one(W: Tensor) -> dict[str, Tensor]:
    rows = []
    for member in W:
        try:
            rows.append(spectral.continuity_values(spectral._spectrum(member)))
        except (spectral.NonFiniteMatrix, torch.linalg.LinAlgError):
            rows.append({key: torch.tensor(math.nan) for key in WEIGHT_KEYS})
    return {key: torch.stack([r[key].float().cpu() for r in rows]) for key in WEIGHT_KEYS}


def direction_metrics(
    kind: str, stacks: dict[str, Tensor], warm: dict[str, Tensor] | None = None
) -> list[dict[str, float]]:
    """geometry.direction_metrics for each of K members: stacks are role -> (K, L, m, n) gradient stacks.

    `warm` (role -> (K, L, d, block) subspaces, updated in place of the solo dict's (L, d, block)) carries
    each member's own starting block between calls. A member without one starts from the solo cold start
    (the same fixed random block every solo run uses), so a member's iteration follows its solo run's.
    The iteration stops when every layer of every member meets the tolerance, so members may take a
    step or two more than alone: values agree within the iteration's own accuracy (sine 1e-4), not to
    the last ulp.
    """
    K = next(iter(stacks.values())).shape[0]
    out: list[dict[str, float]] = [{} for _ in range(K)]
    for role, G in stacks.items():
        values = _direction_values(G, warm, role)
        _scatter(out, {metric_name(kind, role, key): v for key, v in values.items()})
    return out


def _direction_values(G: Tensor, warm: dict[str, Tensor] | None, role: str) -> dict[str, Tensor]:
    K, L, m, n = G.shape
    total = G.flatten(2).norm(dim=-1).sum(-1)  # (K,) one pass: NaN/inf anywhere, or an all-zero stack
    good = (torch.isfinite(total) & (total > 0)).nonzero().squeeze(1)
    values = {key: torch.full((K,), math.nan) for key in DIRECTION_KEYS}
    if len(good) == 0:
        return values
    basis = _basis(warm, role, K, L, min(m, n), G.device)
    pair = spectral.top_singular_pair(_members(G, good).flatten(0, 1), start=_members(basis, good).flatten(0, 1))
    if warm is not None:
        basis[good] = pair.basis.unflatten(0, (len(good), L))
        warm[role] = basis
    for key, vectors in (("v1_continuity", pair.v), ("u1_continuity", pair.u)):
        values[key][good.cpu()] = spectral.adjacent_abs_cos(vectors.unflatten(0, (len(good), L))).mean(-1).cpu()
    return values


def _basis(warm: dict[str, Tensor] | None, role: str, K: int, L: int, d: int, device: torch.device) -> Tensor:
    """The (K, L, d, block) starting subspaces: the warm ones, else the solo cold start for every member."""
    if warm is not None and role in warm:
        return warm[role]
    block = min(spectral.SUBSPACE_BLOCK, d)  # top_singular_pair's default
    cold = spectral._start_block(None, L, d, block, device)  # (L, d, block), what a solo run starts from
    return cold.unsqueeze(0).repeat(K, 1, 1, 1)


def _members(X: Tensor, good: Tensor) -> Tensor:
    """X's rows for the members in `good`; X itself when that is all of them (no copy of a large stack)."""
    return X if len(good) == len(X) else X[good]


def _scatter(out: list[dict[str, float]], values: dict[str, Tensor]) -> None:
    """{name: (K,) tensor} into the K members' dicts, with one host transfer per name."""
    for name, v in values.items():
        for member, value in zip(out, v.tolist()):
            member[name] = value
