"""PackedMLP: each member computes its solo ResidualMLP's function and gradient, and members never mix.

Tolerance: torch.testing's fp32 default (rtol 1.3e-6, atol 1e-5). The packed forward runs the same
arithmetic in a different kernel (baddbmm vs addmm, layer_norm + addcmul vs fused layer_norm), so
only the summation order differs: a few ulps per op, far below 1e-5 through a 3-block net of width 8.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geocont.config import MLPConfig, RunConfig
from geocont.models.layers import ACTIVATIONS, NORMS
from geocont.models.mlp import ResidualMLP
from geocont.models.packed import PACKED_NORMS, PackedMLP
from geocont.pack import pack_key

IN, CLASSES, B = 6, 5, 7


def members(cfgs: list[MLPConfig]) -> list[ResidualMLP]:
    """Solo models, each seeded on its own as a solo run seeds its model."""
    out = []
    for seed, cfg in enumerate(cfgs):
        torch.manual_seed(100 + seed)
        out.append(ResidualMLP(cfg, IN, CLASSES))
    return out


def test_packed_norms_cover_the_solo_registry():
    assert list(PACKED_NORMS) == list(NORMS)


@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_every_member_computes_its_solo_function_and_gradient(activation, norm, residual):
    base = MLPConfig(depth=3, width=8, activation=activation, norm=norm, residual=residual)
    # init_std differs between members (None is PyTorch's default init): only the initial weights change
    solos = members([base, base.model_copy(update={"init_std": 0.3}), base.model_copy(update={"init_std": 0.05})])
    for solo in solos:  # non-trivial norm gains, so a member mix-up in the affine part would show
        for name, p in solo.named_parameters():
            if ".norm." in name:
                p.data.uniform_(0.5, 1.5)
    packed = PackedMLP.from_members(solos)
    x = torch.randn(len(solos), B, IN)  # (K, B, in)
    out = packed(x)  # (K, B, C)
    out.square().sum().backward()
    for k, solo in enumerate(solos):
        ref = solo(x[k])
        torch.testing.assert_close(out[k], ref)
        ref.square().sum().backward()
        grads = dict(packed.named_parameters())
        for name, p in solo.named_parameters():
            torch.testing.assert_close(grads[name].grad[k], p.grad, msg=name)


@pytest.mark.parametrize("activation", ["radial", "relu"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_members_never_see_each_others_inputs(activation, norm):
    # Radial and the norms reduce over features: a reduction over the wrong dim would mix members
    packed = PackedMLP.from_members(members([MLPConfig(depth=2, width=8, activation=activation, norm=norm)] * 3))
    x = torch.randn(3, B, IN)
    moved = x.clone()
    moved[1] *= 50.0
    before, after = packed(x), packed(moved)
    torch.testing.assert_close(before[[0, 2]], after[[0, 2]], rtol=0, atol=0)
    assert not torch.allclose(before[1], after[1])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_member_state_dict_loads_into_a_solo_model(bias):
    cfg = MLPConfig(depth=3, width=8, norm="layernorm", bias=bias)
    packed = PackedMLP.from_members(members([cfg] * 2))
    with torch.no_grad():  # move the pack away from its members, as training would
        for p in packed.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(2, B, IN)
    for k in range(2):
        solo = ResidualMLP(cfg, IN, CLASSES)
        solo.load_state_dict(packed.member_state_dict(k))  # strict: same names, same shapes
        torch.testing.assert_close(solo(x[k]), packed(x)[k])


def test_weight_groups_are_the_packed_hidden_matrices():
    packed = PackedMLP.from_members(members([MLPConfig(depth=4, width=8)] * 3))
    (group,) = packed.weight_groups().values()
    assert len(group) == 4 and all(w.shape == (3, 8, 8) for w in group)


def test_members_of_different_shapes_are_refused():
    with pytest.raises(ValueError, match="member 1"):
        PackedMLP.from_members(members([MLPConfig(depth=2, width=8), MLPConfig(depth=2, width=8, activation="gelu")]))


# -- pack_key ----------------------------------------------------------------------------------

FREE = {
    "train.seed": st.integers(0, 1000),
    "model.init_std": st.one_of(st.none(), st.floats(1e-4, 1.0)),
    "optim.lr": st.floats(1e-5, 1.0),
    "optim.beta1": st.floats(0.0, 0.99),
    "optim.beta2": st.sampled_from([0.0, 0.9, 0.999]),
    "optim.weight_decay": st.floats(0.0, 0.5),
}
# One change per field that alters shapes, the forward function, the data or the step budget.
BOUND = {
    "model.depth": 5,
    "model.width": 24,
    "model.residual": False,
    "model.activation": "radial",
    "model.norm": "rmsnorm",
    "model.bias": False,
    "data.name": "mnist",
    "data.val_fraction": 0.2,
    "optim.name": "sgd",
    "train.batch_size": 32,
    "train.epochs": 3,
    "train.max_steps": 100,
    "train.precision": "bf16-mixed",
}


def run_config(changes: dict[str, object]) -> RunConfig:
    raw: dict = {}
    for path, value in changes.items():
        section, key = path.split(".")
        raw.setdefault(section, {})[key] = value
    return RunConfig.model_validate(raw)


@settings(max_examples=30, deadline=None)
@given(st.fixed_dictionaries({}, optional=FREE))
def test_configs_differing_only_in_free_fields_share_a_pack(changes):
    assert pack_key(run_config(changes)) == pack_key(RunConfig())


@pytest.mark.parametrize("path", list(BOUND))
def test_any_shape_or_forward_change_gets_its_own_pack(path):
    assert pack_key(run_config({path: BOUND[path]})) != pack_key(RunConfig())
    hash(pack_key(RunConfig()))  # usable as a dict key for grouping
