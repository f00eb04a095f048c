import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geocont.metrics import spectral
from geocont.metrics.geometry import delta_gw_metrics, direction_metrics, weight_metrics


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def test_identical_layers_are_perfectly_continuous():
    W = torch.randn(1, 32, 24).repeat(6, 1, 1)
    values = spectral.weight_continuity(W)
    for key in ("v1_continuity", "u1_continuity"):
        assert values[key] == pytest.approx(1.0, abs=1e-5)
    # sigma^2 weights sum to one, every |cos| is one
    assert values["sigma2_continuity"] == pytest.approx(1.0, abs=1e-4)
    assert values["sigma2_continuity_u"] == pytest.approx(1.0, abs=1e-4)


def test_random_layers_sit_at_the_random_baseline():
    d = 256
    W = torch.randn(64, d, d, generator=torch.Generator().manual_seed(0))
    values = spectral.weight_continuity(W)
    baseline = spectral.random_baseline(d)
    assert baseline == pytest.approx(math.sqrt(2 / (math.pi * d)))
    for key in ("v1_continuity", "u1_continuity", "sigma2_continuity", "sigma2_continuity_u"):
        assert values[key] == pytest.approx(baseline, rel=0.25), key


def test_sign_flips_change_nothing():
    W = torch.randn(5, 20, 12, generator=torch.Generator().manual_seed(1))
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0]).view(5, 1, 1)
    a, b = spectral.weight_continuity(W), spectral.weight_continuity(W * signs)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-5)


@pytest.mark.parametrize("shape", [(4, 30, 30), (4, 40, 16), (4, 16, 40)], ids=["square", "tall", "wide"])
def test_svd_top_matches_numpy(shape):
    W = torch.randn(*shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    spec = spectral.svd_top(W)
    for layer in range(shape[0]):
        U, s, Vt = np.linalg.svd(W[layer].numpy(), full_matrices=False)
        np.testing.assert_allclose(spec.s[layer].numpy(), s, rtol=1e-8, atol=1e-10)
        # vectors agree up to sign, column by column
        cos_v = np.abs(np.sum(spec.V[layer].numpy() * Vt.T, axis=0))
        cos_u = np.abs(np.sum(spec.U[layer].numpy() * U, axis=0))
        np.testing.assert_allclose(cos_v, 1.0, atol=1e-6)
        np.testing.assert_allclose(cos_u, 1.0, atol=1e-6)


def test_known_spectrum_and_gap():
    # W = U diag(s) V^T with chosen s: the gap must come out as s1 / s2
    d = 16
    s = torch.linspace(8.0, 1.0, d, dtype=torch.float64)
    W = torch.stack([random_orthogonal(d, i) @ torch.diag(s) @ random_orthogonal(d, 100 + i).T for i in range(3)])
    assert spectral.weight_continuity(W)["spectral_gap"] == pytest.approx(float(s[0] / s[1]), rel=1e-6)


def test_sigma2_alignment_against_a_direct_numpy_sum():
    W = torch.randn(3, 12, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = []
    for layer in range(2):
        _, s, Vt = np.linalg.svd(W[layer].numpy())
        _, _, Vt2 = np.linalg.svd(W[layer + 1].numpy())
        weights = s**2 / np.sum(W[layer].numpy() ** 2)
        expected.append(np.sum(weights * np.abs(np.sum(Vt * Vt2, axis=1))))
    assert spectral.weight_continuity(W)["sigma2_continuity"] == pytest.approx(np.mean(expected), rel=1e-9)


def test_shared_leading_direction_is_found_among_random_layers():
    # layers = strong common rank-one part + noise: v1 and u1 continuity near one, sigma2 in between
    g = torch.Generator().manual_seed(4)
    u, v = torch.randn(64, 1, generator=g), torch.randn(1, 48, generator=g)
    W = torch.stack([10 * u @ v / (u.norm() * v.norm()) + 0.05 * torch.randn(64, 48, generator=g) for _ in range(5)])
    values = spectral.weight_continuity(W)
    assert values["v1_continuity"] > 0.99 and values["u1_continuity"] > 0.99
    assert spectral.random_baseline(48) < values["sigma2_continuity"] < 1.0


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), warm=st.booleans(), shape=st.sampled_from([(40, 30), (30, 40), (12, 12)]))
def test_subspace_iteration_matches_the_exact_leading_pair(seed, warm, shape):
    g = torch.Generator().manual_seed(seed)
    m, n = shape
    low_rank = torch.randn(4, m, 5, generator=g) @ torch.randn(4, 5, n, generator=g)
    W = low_rank + 0.1 * torch.randn(4, m, n, generator=g)
    exact = spectral.svd_top(W, k=1)
    side = exact.U if m < n else exact.V
    start = side[:, :, 0] + 0.3 * torch.randn(side.shape[:2], generator=g) if warm else None
    s, u, v, _ = spectral.top_singular_pair(W, start=start)
    torch.testing.assert_close(s, exact.s[:, 0], rtol=1e-4, atol=1e-4)
    assert (v * exact.V[:, :, 0]).sum(-1).abs().min() > 0.9999
    assert (u * exact.U[:, :, 0]).sum(-1).abs().min() > 0.9999


def test_subspace_iteration_warm_start_from_its_own_basis():
    g = torch.Generator().manual_seed(11)
    W = torch.randn(3, 64, 64, generator=g)  # random: s1/s2 close to 1, the hard case
    first = spectral.top_singular_pair(W)
    moved = W + 1e-3 * torch.randn(3, 64, 64, generator=g)
    again = spectral.top_singular_pair(moved, start=first.basis)
    exact = spectral.svd_top(moved, k=1)
    assert (again.v * exact.V[:, :, 0]).sum(-1).abs().min() > 0.9999


def test_subspace_iteration_falls_back_to_exact_when_the_gap_is_tiny():
    W = torch.stack([torch.diag(torch.tensor([1.0, 0.99999, 0.5, 0.1]))] * 2)
    s, u, v, _ = spectral.top_singular_pair(W, max_iter=3)
    assert s[0].item() == pytest.approx(1.0, abs=1e-5)
    assert abs(v[0, 0].item()) == pytest.approx(1.0, abs=1e-4)


def test_update_ratio():
    W0 = torch.ones(2, 3, 3)
    assert spectral.update_ratio(W0 * 1.5, W0) == pytest.approx(0.5)
    assert spectral.update_ratio(W0, W0) == 0.0


def test_named_metric_dicts_and_delta_gw():
    g = torch.Generator().manual_seed(5)
    stacks = {"q": torch.randn(3, 8, 8, generator=g), "o": torch.randn(3, 8, 8, generator=g)}
    weights = weight_metrics(stacks, {r: w.clone() for r, w in stacks.items()})
    assert {"weight/q/v1_continuity", "weight/o/sigma2_continuity_u", "update_ratio/q", "update_ratio"} <= set(weights)
    grads = direction_metrics("grad_cum", stacks)
    both = {**weights, **grads}
    delta = delta_gw_metrics(both, ["q", "o"])
    assert delta["delta_gw/q/v1"] == pytest.approx(both["grad_cum/q/v1_continuity"] - both["weight/q/v1_continuity"])


def test_non_finite_stacks_give_nan_instead_of_raising():
    W = torch.full((3, 4, 4), float("nan"))
    values = weight_metrics({"": W}, {"": torch.ones(3, 4, 4)})
    assert all(math.isnan(v) for v in values.values())
    assert all(math.isnan(v) for v in direction_metrics("grad_cum", {"": W}).values())


def test_one_inf_entry_is_enough_for_nan():
    W = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(6))
    W[1, 2, 3] = float("inf")
    values = weight_metrics({"": W}, {"": torch.ones(3, 6, 5)})
    assert all(math.isnan(v) for v in values.values())
    with pytest.raises(spectral.NonFiniteMatrix):
        spectral.svd_top(W)


def test_finite_but_huge_stacks_are_rescaled_not_lost():
    # 1e20 squared overflows fp32: the Gram route must rescale and still agree with float64
    W = torch.randn(4, 12, 9, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    huge = spectral.weight_continuity((W * 1e20).float())
    exact = spectral.weight_continuity(W)
    for key, value in exact.items():
        assert huge[key] == pytest.approx(value, rel=1e-4), key
    assert spectral.svd_top((W * 1e20).float()).s[0, 0].item() == pytest.approx(
        float(torch.linalg.svdvals(W[0])[0]) * 1e20, rel=1e-5
    )
