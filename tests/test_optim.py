"""build_optimizer: PyTorch's fused kernels are the same algorithm as the textbook optimizers."""

import pytest
import torch

from geocont.config import OptimConfig
from geocont.lit.module import build_optimizer


def _textbook(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.beta1, weight_decay=cfg.weight_decay)
    kind = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    return kind(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)


def _train(make, cfg: OptimConfig, steps: int = 20) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = make(model.parameters(), cfg)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "cfg",
    [
        OptimConfig(name="adam", lr=1e-2),
        OptimConfig(name="adam", lr=1e-2, beta2=0.0),
        OptimConfig(name="adamw", lr=1e-2, weight_decay=0.1),
        OptimConfig(name="sgd", lr=1e-1, weight_decay=1e-3),
    ],
    ids=["adam", "adam-beta2-0", "adamw", "sgd"],
)
def test_fused_optimizer_follows_the_textbook_trajectory(cfg):
    model = torch.nn.Linear(2, 2)
    assert build_optimizer(model.parameters(), cfg).defaults["fused"] is True
    for ours, reference in zip(_train(build_optimizer, cfg), _train(_textbook, cfg)):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)


def test_integer_parameters_fall_back_to_the_default_kernels():
    buffer_like = torch.nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2)), buffer_like], OptimConfig(name="sgd"))
    assert not opt.defaults["fused"]
