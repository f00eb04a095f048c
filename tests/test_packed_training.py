"""The heart of packing: K members trained as one pack follow, step by step, their solo runs.

Each solo run is what geocont trains for that config, minus Lightning: its own digits split and seeded
batch order (DigitsDataModule), its model built after seeding, build_optimizer's fused Adam, and a stop
at the first non-finite loss before any update from it (GeoModule on a CPU).

Tolerance: none. Member k's losses at every step and its final weights are its solo run's bit for bit:
the packed forward runs the same GEMMs per member (one batched call), the loss is each member's own
log_softmax + nll_loss on its solo layout (geocont.optim.step.member_losses), the backward writes each
weight gradient as nn.Linear's does (dy^T x), and the optimizer is torch's fused kernel called on member
k's slices with member k's hyperparameters. This holds for this CPU stack (torch 2.13, MKL); a BLAS whose
batched GEMM summed in another order than its single GEMM would drift by ulps, and fp32 tolerance
(torch.testing's default) would then be the contract. Not covered, on purpose: Adam with beta2 = 0
divides by |g| + eps, so an ulp of gradient noise on an entry with |g| near eps changes its update by
O(1) (tests/test_batched_optim.py checks beta2 = 0 on exact gradients).
"""

from itertools import islice

import pytest
import torch

from geocont.config import RunConfig
from geocont.data.digits import DigitsDataModule
from geocont.data.packed import PackedBatches
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.models.packed import PackedMLP
from geocont.optim.batched import build_batched_optimizer
from geocont.optim.step import classifier_step
from geocont.pack import pack_key

STEPS = 30  # more than the 24 batches of an epoch: each member's reshuffle at the epoch boundary is exercised


def member(
    seed: int,
    lr: float,
    beta2: float,
    init_std: float | None,
    name: str = "adam",
    weight_decay: float = 0.0,
    norm: str = "none",
) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"depth": 4, "width": 32, "init_std": init_std, "norm": norm},
            "optim": {"name": name, "lr": lr, "beta2": beta2, "weight_decay": weight_decay},
            "train": {"seed": seed, "batch_size": 64},
        }
    )


def data(cfg: RunConfig) -> DigitsDataModule:
    dm = DigitsDataModule(cfg.data, cfg.train.batch_size, cfg.train.seed)
    dm.setup()
    return dm


def initial_model(cfg: RunConfig, dm: DigitsDataModule) -> torch.nn.Module:
    torch.manual_seed(cfg.train.seed)  # as seed_everything does before a solo run builds its model
    return build_model(cfg, in_features=dm.in_features, num_classes=dm.num_classes)


def epochs(batches):
    while True:
        yield from batches


def solo_run(cfg: RunConfig) -> tuple[list[float], torch.nn.Module]:
    dm = data(cfg)
    model = initial_model(cfg, dm)
    opt = build_optimizer(model.parameters(), cfg.optim)
    losses = []
    for x, y in islice(epochs(dm.train_dataloader()), STEPS):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if not torch.isfinite(loss):  # diverged: nothing from this loss on is applied
            break
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return losses, model


def packed_run(cfgs: list[RunConfig]) -> tuple[torch.Tensor, PackedMLP, torch.optim.Optimizer]:
    dms = [data(c) for c in cfgs]
    model = PackedMLP.from_members([initial_model(c, dm) for c, dm in zip(cfgs, dms)])
    opt = build_batched_optimizer(model.parameters(), [c.optim for c in cfgs])
    batches = PackedBatches([dm.train_dataloader() for dm in dms])
    losses = [classifier_step(model, opt, x, y) for x, y in islice(epochs(batches), STEPS)]
    return torch.stack(losses), model, opt  # (STEPS, K)


def assert_member_matches_solo(k: int, losses: torch.Tensor, model: PackedMLP, solo) -> None:
    solo_losses, solo_model = solo
    exact = {"rtol": 0, "atol": 0}
    solo_losses = torch.tensor(solo_losses)
    torch.testing.assert_close(losses[: len(solo_losses), k], solo_losses, **exact, msg=f"member {k} losses")
    weights = model.member_state_dict(k)
    for name, p in solo_model.state_dict().items():
        torch.testing.assert_close(weights[name], p, **exact, msg=f"member {k} {name}")


def test_every_member_follows_its_solo_run():
    cfgs = [
        member(seed=0, lr=1e-3, beta2=0.999, init_std=None),
        member(seed=1, lr=3e-3, beta2=0.9, init_std=0.05),
        member(seed=2, lr=2e-3, beta2=0.99, init_std=None),
        member(seed=3, lr=1e-3, beta2=0.95, init_std=0.02),
    ]
    assert len({pack_key(c) for c in cfgs}) == 1
    losses, model, opt = packed_run(cfgs)
    assert bool(torch.isfinite(losses).all()) and opt.active.all()
    for k, cfg in enumerate(cfgs):
        assert_member_matches_solo(k, losses, model, solo_run(cfg))
    assert losses[-1].mean() < losses[0].mean() - 0.5  # it learned: the comparison is not of idle weights


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_every_member_follows_its_solo_run_through_a_norm(norm):
    # LayerNorm once drifted by an ulp a step (a shared normalisation, then the affine), which a few
    # hundred steps grew into another run: the norms are held to the same exactness as the rest
    cfgs = [member(seed=s, lr=1e-3 * (s + 1), beta2=0.999, init_std=None, norm=norm) for s in range(3)]
    losses, model, _ = packed_run(cfgs)
    for k, cfg in enumerate(cfgs):
        assert_member_matches_solo(k, losses, model, solo_run(cfg))


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_every_member_follows_its_solo_run_with_weight_decay(name):
    lr = 10.0 if name == "sgd" else 1.0  # SGD's steps are lr * g: a larger lr to move as far as Adam
    cfgs = [
        member(seed=0, lr=1e-3 * lr, beta2=0.999, init_std=None, name=name, weight_decay=0.1),
        member(seed=1, lr=3e-3 * lr, beta2=0.9, init_std=0.05, name=name),
        member(seed=2, lr=2e-3 * lr, beta2=0.99, init_std=None, name=name, weight_decay=0.01),
    ]
    losses, model, _ = packed_run(cfgs)
    for k, cfg in enumerate(cfgs):
        assert_member_matches_solo(k, losses, model, solo_run(cfg))
    assert losses[-1].mean() < losses[0].mean() - 0.2


def test_a_diverging_member_freezes_at_its_last_finite_weights_while_the_others_go_on():
    cfgs = [
        member(seed=0, lr=1e-3, beta2=0.999, init_std=None),
        member(seed=1, lr=1e6, beta2=0.999, init_std=None),  # blows up the forward after its first update
        member(seed=2, lr=3e-3, beta2=0.99, init_std=0.05),
    ]
    losses, model, opt = packed_run(cfgs)
    solos = [solo_run(c) for c in cfgs]
    diverged_at = len(solos[1][0])
    assert 1 <= diverged_at < STEPS  # the solo run applied an update, then met a non-finite loss
    assert opt.active.tolist() == [True, False, True]
    assert opt.param_groups[0]["step"].tolist() == [STEPS, diverged_at, STEPS]  # the solo run's diverged_at
    assert not torch.isfinite(losses[diverged_at, 1])
    for k in range(3):
        assert_member_matches_solo(k, losses, model, solos[k])
