"""Batched optimizers: member k steps exactly as torch.optim on member k alone; frozen members stay put.

Checked after every one of 50 steps. Against torch.optim with fused=True (what build_optimizer gives a solo
run) the weights are bitwise equal: the pack calls that same kernel on member k's slices with member k's
hyperparameters. Against torch.optim's default (foreach) implementation, which associates a few products
differently, torch.testing's fp32 default tolerance (rtol 1.3e-6, atol 1e-5).
"""

import copy

import pytest
import torch

from geocont.config import OptimConfig
from geocont.optim.batched import BatchedAdam, BatchedSGD, build_batched_optimizer

K, STEPS = 4, 50
SHAPES = [(5, 4), (4,), (3, 2, 2)]
# per member: one default-like, two with beta2 = 0 (the paper's ablation; one without momentum), two with weight decay
HYPER = {
    "lr": [1e-2, 3e-3, 1e-1, 1e-3],
    "beta1": [0.9, 0.0, 0.5, 0.9],
    "beta2": [0.999, 0.0, 0.0, 0.99],
    "eps": [1e-8, 1e-6, 1e-8, 1e-3],
    "weight_decay": [0.0, 0.1, 0.01, 0.0],
}


def solo_optimizer(kind: str, params, k: int, fused: bool = False) -> torch.optim.Optimizer:
    h = {name: values[k] for name, values in HYPER.items()}
    if kind == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], momentum=h["beta1"], weight_decay=h["weight_decay"], fused=fused)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(
        params, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], weight_decay=h["weight_decay"], fused=fused
    )


def batched_optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "sgd":
        return BatchedSGD(params, K, lr=HYPER["lr"], beta1=HYPER["beta1"], weight_decay=HYPER["weight_decay"])
    return BatchedAdam(params, K, **HYPER, decoupled=kind == "adamw")


def packed_params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(K, *shape, generator=g)) for shape in SHAPES]


def random_grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(K, *shape, generator=g) for shape in SHAPES]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("kind", ["adam", "adamw", "sgd"])
def test_each_member_follows_torch_optim_step_by_step(kind, fused):
    exact = {"rtol": 0, "atol": 0} if fused else {}
    packed = packed_params()
    solos = [[torch.nn.Parameter(p[k].detach().clone()) for p in packed] for k in range(K)]
    opt = batched_optimizer(kind, packed)
    refs = [solo_optimizer(kind, params, k, fused) for k, params in enumerate(solos)]
    for step in range(STEPS):
        grads = random_grads(step)
        for p, g in zip(packed, grads):
            p.grad = g.clone()
        opt.step()
        for k, (params, ref) in enumerate(zip(solos, refs)):
            for p, g in zip(params, grads):
                p.grad = g[k].clone()
            ref.step()
            for p, q in zip(packed, params):
                torch.testing.assert_close(p[k], q, **exact, msg=f"{kind} member {k} step {step}")


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_frozen_member_keeps_its_weights_and_state_while_the_others_go_on(kind):
    packed = packed_params()
    alone = [torch.nn.Parameter(p.detach().clone()) for p in packed]  # same pack, never frozen
    opt, ref = batched_optimizer(kind, packed), batched_optimizer(kind, alone)
    for step in range(20):
        if step == 8:
            assert opt.freeze(torch.tensor([True, False, True, True])).tolist() == [True, False, True, True]
            frozen_params = [p[1].detach().clone() for p in packed]
            frozen_state = [{n: t[1].clone() for n, t in opt.state[p].items()} for p in packed]
        if step == 12:  # a later all-finite step does not thaw it
            opt.freeze(torch.ones(K, dtype=torch.bool))
        grads = random_grads(step)
        for p, q, g in zip(packed, alone, grads):
            p.grad, q.grad = g.clone(), g.clone()
            if step >= 8:
                p.grad[1] = float("nan")  # a diverged member's gradient: must not leak into anything
        opt.step()
        ref.step()
    for p, q, before, state in zip(packed, alone, frozen_params, frozen_state):
        torch.testing.assert_close(p[1], before, rtol=0, atol=0)
        for name, t in opt.state[p].items():
            torch.testing.assert_close(t[1], state[name], rtol=0, atol=0)
        torch.testing.assert_close(p[[0, 2, 3]], q[[0, 2, 3]], rtol=0, atol=0)  # the others: as if alone
    assert opt.param_groups[0]["step"].tolist() == [20, 8, 20, 20]


def test_state_dict_round_trip_continues_the_same_trajectory():
    packed, twin = packed_params(), packed_params()
    opt = batched_optimizer("adam", packed)
    for step in range(5):
        for p, g in zip(packed, random_grads(step)):
            p.grad = g
        opt.step()
    opt.freeze(torch.tensor([True, True, False, True]))
    with torch.no_grad():
        for p, q in zip(packed, twin):
            q.copy_(p)
    resumed = batched_optimizer("adam", twin)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))  # as torch.save + load: no aliasing
    for step in range(5, 10):
        step_both((opt, packed), (resumed, twin), step=step)
    assert_same(packed, twin)
    assert resumed.active.tolist() == [True, True, False, True]


def test_a_parameter_whose_storage_is_replaced_is_still_updated():
    """The optimizer keeps member views of the parameters between steps; `p.data = ...` must not strand them."""
    packed, twin = packed_params(), packed_params()
    opt, ref = batched_optimizer("adam", packed), batched_optimizer("adam", twin)
    for step in range(4):
        if step == 2:
            for p in packed:
                p.data = p.data.clone()  # new storage, same values
        step_both((opt, packed), (ref, twin), step=step)
    assert_same(packed, twin)


def step_both(*pairs, step: int) -> None:
    """Give each (optimizer, params) pair step `step`'s gradients and step it."""
    grads = random_grads(step)
    for opt, params in pairs:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()


def assert_same(params, others) -> None:
    for p, q in zip(params, others):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("name", "cls", "decoupled"),
    [("adam", BatchedAdam, False), ("adamw", BatchedAdam, True), ("sgd", BatchedSGD, None)],
)
def test_build_batched_optimizer_reads_each_member_config(name, cls, decoupled):
    cfgs = [OptimConfig(name=name, lr=1e-2, beta1=0.5, weight_decay=0.1), OptimConfig(name=name, lr=3e-3, beta2=0.0)]
    params = [torch.nn.Parameter(torch.zeros(2, 3))]
    opt = build_batched_optimizer(params, cfgs)
    assert type(opt) is cls and getattr(opt, "decoupled", None) == decoupled
    group = opt.param_groups[0]
    assert group["lr"].tolist() == [1e-2, 3e-3] and group["beta1"].tolist() == [0.5, 0.9]
    assert group["weight_decay"].tolist() == [0.1, 0.0]
    if name != "sgd":
        assert group["beta2"].tolist() == [0.999, 0.0] and group["eps"].tolist() == [1e-8, 1e-8]


def test_refusals():
    with pytest.raises(ValueError, match="one optimizer algorithm"):
        build_batched_optimizer([torch.nn.Parameter(torch.zeros(2, 3))], [OptimConfig(), OptimConfig(name="sgd")])
    with pytest.raises(ValueError, match="leading member dim"):
        BatchedAdam([torch.nn.Parameter(torch.zeros(3, 3))], K=2)
    with pytest.raises(ValueError, match="K=2 values"):
        BatchedAdam([torch.nn.Parameter(torch.zeros(2, 3))], K=2, lr=[1e-3, 1e-3, 1e-3])
    with pytest.raises(ValueError, match="lr must be >= 0"):
        BatchedAdam([torch.nn.Parameter(torch.zeros(2, 3))], K=2, lr=[1e-3, -1e-3])
    with pytest.raises(ValueError, match="floating parameters"):
        BatchedSGD([torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.int64), requires_grad=False)], K=2)
