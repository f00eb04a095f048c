"""Packed geometry metrics: each member's dict is the solo geometry.py dict for that member alone.

Tolerances. Weight metrics: abs 1e-6. The K * L matrices go through the same Gram products and the
same LAPACK eigh as alone (batched eigh solves each matrix on its own), so only reduction order can
differ. Direction metrics: abs 2e-4. The subspace iteration stops when every layer's Davis-Kahan sine
bound is below tol = 1e-4; packed, it runs until the slowest layer of all K members gets there, so a
member's vectors may be one or two steps better than alone. Each solo vector is within 1e-4 (sine) of
the exact one, so the adjacent |cos| of two runs differ by at most about 2 * 1e-4.
"""

import math

import pytest
import torch

from geocont.metrics import geometry, spectral
from geocont.metrics.packed import direction_metrics, packed_stack, weight_metrics

K, L = 3, 5


def stacks(m: int, n: int, seed: int) -> torch.Tensor:
    """(K, L, m, n): a shared rank-one direction of different strength per member, plus noise."""
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(K, 1, m, 1, generator=g), torch.randn(K, 1, 1, n, generator=g)
    strength = torch.tensor([0.0, 3.0, 10.0]).view(K, 1, 1, 1)  # random, partly and strongly continuous
    return strength * u @ v / math.sqrt(m * n) + 0.1 * torch.randn(K, L, m, n, generator=g)


def assert_dicts_close(packed: dict[str, float], solo: dict[str, float], atol: float) -> None:
    assert list(packed) == list(solo)  # the same names, in the same order
    for name, value in solo.items():
        assert packed[name] == pytest.approx(value, abs=atol, nan_ok=True), name


SHAPES = pytest.mark.parametrize("shape", [(12, 12), (16, 10), (10, 16)], ids=["square", "tall", "wide"])


@SHAPES
def test_weight_metrics_match_the_solo_dicts(shape):
    W, W0 = stacks(*shape, seed=1), stacks(*shape, seed=2)
    packed = weight_metrics({"": W}, {"": W0})
    assert len(packed) == K
    for k in range(K):
        assert_dicts_close(packed[k], geometry.weight_metrics({"": W[k]}, {"": W0[k]}), atol=1e-6)


def test_weight_metrics_take_one_eigh_for_all_members(monkeypatch):
    calls = []

    def counting(A):
        calls.append(A.shape)
        return torch.linalg.eigh(A)

    monkeypatch.setattr(spectral, "eigh", counting)
    weight_metrics({"": stacks(12, 12, seed=1)}, {"": stacks(12, 12, seed=2)})
    assert calls == [(K * L, 12, 12)]


def test_several_roles_keep_the_solo_names_and_the_mean_update_ratio():
    W = {"q": stacks(8, 8, seed=3), "o": stacks(8, 8, seed=4)}
    W0 = {"q": stacks(8, 8, seed=5), "o": stacks(8, 8, seed=6)}
    packed = weight_metrics(W, W0)
    for k in range(K):
        solo = geometry.weight_metrics({r: w[k] for r, w in W.items()}, {r: w[k] for r, w in W0.items()})
        assert_dicts_close(packed[k], solo, atol=1e-6)


def test_a_diverged_member_gives_nan_and_leaves_the_others_alone():
    W, W0 = stacks(12, 12, seed=1), stacks(12, 12, seed=2)
    W[1, 2, 3, 4] = float("nan")
    W[2, 0, 0, 0] = float("inf")
    packed = weight_metrics({"": W}, {"": W0})
    for k in (1, 2):
        assert all(math.isnan(v) for v in packed[k].values())
    assert_dicts_close(packed[0], geometry.weight_metrics({"": W[0]}, {"": W0[0]}), atol=1e-6)


@SHAPES
def test_direction_metrics_match_the_solo_dicts_cold_and_warm(shape):
    G = stacks(*shape, seed=7)
    moved = G + 0.01 * stacks(*shape, seed=8)
    warm: dict[str, torch.Tensor] = {}
    solo_warm = [{} for _ in range(K)]
    for step, stack in enumerate((G, moved)):  # the second call starts from the first call's subspaces
        packed = direction_metrics("grad_cum", {"": stack}, warm=warm)
        for k in range(K):
            solo = geometry.direction_metrics("grad_cum", {"": stack[k]}, warm=solo_warm[k])
            assert_dicts_close(packed[k], solo, atol=2e-4)
        assert warm[""].shape == (K, L, min(shape), spectral.SUBSPACE_BLOCK)


def test_direction_metrics_nan_for_zero_or_non_finite_members():
    G = stacks(10, 10, seed=9)
    G[0] = 0.0
    G[2, 1, 0, 0] = float("nan")
    packed = direction_metrics("grad_init", {"": G})
    for k in (0, 2):
        assert all(math.isnan(v) for v in packed[k].values())
    assert_dicts_close(packed[1], geometry.direction_metrics("grad_init", {"": G[1]}), atol=2e-4)


def test_packed_stack_is_the_solo_stack_per_member():
    layers = [torch.randn(K, 6, 4) for _ in range(L)]
    packed = packed_stack(layers)
    assert packed.shape == (K, L, 6, 4)
    for k in range(K):
        torch.testing.assert_close(packed[k], torch.stack([w[k] for w in layers]), rtol=0, atol=0)
