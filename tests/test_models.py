import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geocont.config import MLPConfig, resolve
from geocont.models import build_model
from geocont.models.layers import ACTIVATIONS, NORMS, Radial, RMSNorm, make_activation, make_norm
from geocont.models.mlp import ResidualMLP


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(2, 24), scale=st.floats(0.01, 10.0))
def test_radial_is_rotation_equivariant(seed, d, scale):
    R = random_orthogonal(d, seed)
    x = scale * torch.randn(5, d, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    radial = Radial()
    torch.testing.assert_close(radial(x @ R.T), radial(x) @ R.T)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(4, 24))
def test_relu_is_not_rotation_equivariant(seed, d):
    R = random_orthogonal(d, seed)
    x = torch.randn(16, d, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    relu = torch.nn.ReLU()
    assert (relu(x @ R.T) - relu(x) @ R.T).abs().max() > 1e-3


def test_rmsnorm_matches_torch():
    ours, ref = RMSNorm(12, eps=1e-6), torch.nn.RMSNorm(12, eps=1e-6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    x = torch.randn(3, 7, 12)
    torch.testing.assert_close(ours(x), ref(x))


def test_unknown_names_list_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: relu, gelu"):
        make_activation("swish")
    with pytest.raises(ValueError, match="allowed: none, layernorm"):
        make_norm("batchnorm", 4)


@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_variant_builds_and_trains_one_step(activation, norm, residual):
    cfg = MLPConfig(depth=3, width=8, activation=activation, norm=norm, residual=residual)
    model = ResidualMLP(cfg, in_features=6, num_classes=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    before = [w.detach().clone() for w in model.weight_groups()[""]]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.weight_groups()[""]))


def test_block_equations():
    cfg = MLPConfig(depth=2, width=4, activation="relu", norm="none", residual=True, bias=False)
    model = ResidualMLP(cfg, in_features=4, num_classes=2)
    block = model.blocks[0]
    h = torch.randn(2, 4)
    torch.testing.assert_close(block(h), h + torch.relu(h @ block.linear.weight.T))
    block.residual = False
    torch.testing.assert_close(block(h), torch.relu(h @ block.linear.weight.T))


def test_init_std_sets_the_hidden_blocks_only():
    model = build_model(resolve({"model": {"depth": 4, "width": 64, "init_std": 1e-4}}), in_features=8, num_classes=3)
    stds = [w.std().item() for w in model.weight_groups()[""]]
    assert all(5e-5 < s < 2e-4 for s in stds)
    assert model.input.weight.std().item() > 1e-2  # PyTorch default elsewhere


def test_weight_groups_are_the_hidden_stack_in_depth_order():
    model = build_model(resolve({"model": {"depth": 5, "width": 8}}), in_features=3, num_classes=2)
    group = model.weight_groups()[""]
    assert len(group) == 5 and all(w is b.linear.weight for w, b in zip(group, model.blocks))
