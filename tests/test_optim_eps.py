"""Adam with beta2 = 0 (the paper's optimizer ablation): PyTorch's eps diverges at once, the shipped eps trains."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from geocont.config import resolve
from geocont.data import build_datamodule
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.sweep.grid import expand
from geocont.sweep.load import load_sweep

SWEEP_DIR = Path(__file__).parents[1] / "sweeps"


def first_non_finite_step(eps: float, steps: int) -> int | None:
    """Train the paper MLP (ReLU) on digits with beta2 = 0; the step whose loss is first non-finite, or None."""
    cfg = resolve({"optim": {"beta2": 0.0, "eps": eps}, "train": {"seed": 0}})
    dm = build_datamodule(cfg)
    dm.setup("fit")
    torch.manual_seed(0)
    model = build_model(cfg, in_features=dm.in_features, num_classes=dm.num_classes)
    opt = build_optimizer(model.parameters(), cfg.optim)
    batches = iter(dm.train_dataloader())
    for step in range(steps):
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        if not torch.isfinite(loss):
            return step
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return None


def test_beta2_zero_diverges_with_pytorch_eps_and_trains_with_the_shipped_one():
    assert first_non_finite_step(1e-8, steps=20) is not None  # lr * m / 1e-8 on zero-gradient coordinates
    assert first_non_finite_step(0.1, steps=20) is None


@pytest.mark.parametrize("name", ["mlp_full_grid.yaml", "beta2_mnist.yaml"])
def test_shipped_beta2_zero_trials_set_the_eps_that_trains(name):
    trials = expand(load_sweep(SWEEP_DIR / name))
    zero = [t.config.optim for t in trials if t.config.optim.beta2 == 0.0]
    assert zero and all(o.eps == 0.1 for o in zero)
    assert all(t.config.optim.eps == 1e-8 for t in trials if t.config.optim.beta2 != 0.0)
