"""geocont train (every metric, every epoch) vs a plain PyTorch loop doing the same training.

Both run in this process on one thread: the paper MLP (16 x 256, ReLU, residual) on digits for 30
epochs, Adam 1e-3, batch 64, a validation pass each epoch. Prints the ratio (target <= 1.15) and the
share of time spent computing metrics (target <= 5%), in wall-clock and in process CPU time (with one
thread, CPU time is what the work costs even when other processes share the cores).

The target ratio is against a loop with the same optimizer kernels as geocont (fused Adam), so it
measures geocont's own cost. The ratio against a textbook loop (torch.optim.Adam with its defaults,
per-tensor kernels on CPU) is what a user switching from a hand-written loop sees.

    python benchmarks/bench_train.py [--epochs 30] [--repeats 1] [--wandb offline]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.nn.functional as F

from geocont.config import resolve
from geocont.data.digits import DigitsDataModule
from geocont.lit import callbacks
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.train import train


def textbook_adam(params, cfg):
    """What a hand-written loop uses: torch.optim.Adam with its defaults (per-tensor kernels on CPU)."""
    return torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def plain_loop(cfg, make_optimizer=build_optimizer) -> tuple[float, float]:
    """The reference: the same model, data order, optimizer and validation, nothing else. (wall, cpu) s."""
    torch.manual_seed(cfg.train.seed)
    dm = DigitsDataModule(cfg.data, cfg.train.batch_size, cfg.train.seed)
    dm.setup()
    model = build_model(cfg, in_features=dm.in_features, num_classes=dm.num_classes)
    opt = make_optimizer(model.parameters(), cfg.optim)
    train_batches, val_batches = dm.train_dataloader(), dm.val_dataloader()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(cfg.train.epochs):
        model.train()
        for x, y in train_batches:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(-1) == y).sum().item() for x, y in val_batches)
    assert correct >= 0
    return time.perf_counter() - t0, time.process_time() - c0


class MetricTimer:
    """Wraps the monitor's hooks to add up the time spent in metric work."""

    def __init__(self):
        self.seconds = self.cpu = 0.0
        for name in ("on_after_backward", "emit"):
            original = getattr(callbacks.GeometryMonitor, name)
            setattr(callbacks.GeometryMonitor, name, self._timed(original))

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.cpu += time.process_time() - c0

        return wrapper


def geocont_run(cfg, timer: MetricTimer) -> tuple[float, float, float, float]:
    """(wall, cpu) of the whole train() call and (wall, cpu) spent in metric hooks."""
    timer.seconds = timer.cpu = 0.0
    with tempfile.TemporaryDirectory() as store:
        t0, c0 = time.perf_counter(), time.process_time()
        result = train(cfg, store, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert result.status == "completed", result.error
    return wall, cpu, timer.seconds, timer.cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--wandb", default="disabled", choices=["disabled", "offline"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = resolve(
        {
            "preset": "paper-mlp",
            "train": {"epochs": args.epochs},
            "tracking": {"wandb": {"mode": args.wandb}, "tensorboard": True},
        }
    )
    timer = MetricTimer()
    geocont_run(resolve({"preset": "smoke", "tracking": {"wandb": {"mode": "disabled"}}}), timer)  # warm imports
    same, textbook, ours = [], [], []
    for _ in range(args.repeats):
        same.append(plain_loop(cfg))
        textbook.append(plain_loop(cfg, textbook_adam))
        ours.append(geocont_run(cfg, timer))
    (p_wall, p_cpu), (t_wall, t_cpu) = min(same), min(textbook)
    g_wall, g_cpu, m_wall, m_cpu = min(ours)
    n = args.epochs
    print(f"plain loop, same kernels  wall {p_wall:6.2f} s  cpu {p_cpu:6.2f} s  ({p_cpu / n * 1000:.0f} ms cpu/epoch)")
    print(f"plain loop, textbook Adam wall {t_wall:6.2f} s  cpu {t_cpu:6.2f} s  ({t_cpu / n * 1000:.0f} ms cpu/epoch)")
    print(f"geocont train (metrics)   wall {g_wall:6.2f} s  cpu {g_cpu:6.2f} s  (wandb {args.wandb}, tensorboard on)")
    print(f"ratio vs same kernels     wall {g_wall / p_wall:6.3f}    cpu {g_cpu / p_cpu:6.3f}    (target <= 1.15)")
    print(f"ratio vs textbook Adam    wall {g_wall / t_wall:6.3f}    cpu {g_cpu / t_cpu:6.3f}")
    print(f"metrics share             wall {m_wall / g_wall:6.1%}    cpu {m_cpu / g_cpu:6.1%}    (target <= 5%)")
    other = (g_cpu - m_cpu - p_cpu) / n * 1000
    print(f"per epoch (cpu)           metrics {m_cpu / (n + 1) * 1000:.1f} ms, Lightning and logging {other:.1f} ms")


if __name__ == "__main__":
    main()
