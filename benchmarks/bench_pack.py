"""Packed trials vs the plain solo loop: trial-steps per second per core for K = 1, 3, 8.

The paper MLP (16 x 256, ReLU, residual), batch 64, Adam, one thread, MNIST-shaped data (784 inputs,
10 classes: the real MNIST with `--data mnist`, random tensors of that shape with `--data synthetic`,
the default, which is all step throughput needs). For each K:
- solo: K trials trained one after the other, each bench_train's plain loop (its own seeded model and
  batch order, build_optimizer's fused Adam, in-memory TensorBatches) for `--steps` steps;
- packed: the same K trials as one PackedMLP + batched Adam + classifier_step for `--steps` steps.
Each trial's lr differs (as in a sweep), so the batched optimizer really has per-member values.

Solo and packed runs alternate (solo first on even repeats, packed first on odd ones) so that a change
in the machine's load hits both; the machine is shared, so CPU time (time.process_time, one thread: what
the work costs however busy the cores are) is reported beside wall time, and the load average is printed.
`--parts` adds where a trial-step's time goes (data, forward, backward, optimizer; ms per trial-step,
the best of the repeats), from separate runs of the same steps with a clock mark between the parts.

Measured (2026-12, 2 shared cores, load ~2-3, synthetic, 5 repeats, CPU-time ratios packed/solo): K=1 0.89,
K=3 1.17, K=8 1.23; ms per trial-step solo -> packed: forward 3.4 -> 3.2 / 2.9, backward 5.5 -> 5.1 / 4.6,
optimizer 1.5 -> 1.3 / 1.1 (K=3 / K=8). K=1 pays the pack's fixed overhead (custom autograd function,
per-member loss) with nothing to amortise it: a pack of one is best trained as a solo run.

    python benchmarks/bench_pack.py [--steps 40] [--repeats 3] [--ks 1 3 8] [--data synthetic|mnist|digits]
                                    [--parts]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch
import torch.nn.functional as F

from geocont.config import RunConfig
from geocont.data import build_datamodule
from geocont.data.batches import TensorBatches
from geocont.data.packed import PackedBatches
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.models.packed import PackedMLP
from geocont.optim.batched import build_batched_optimizer
from geocont.optim.step import classifier_step, member_losses

MNIST = "/work/shared/mnist"
SYNTHETIC = 6400  # samples: 100 batches of 64
PARTS = ("data", "forward", "backward", "optimizer")


def trial_configs(K: int, data: str) -> list[RunConfig]:
    section = {"name": "mnist", "path": MNIST} if data == "mnist" else {"name": "digits"}
    return [
        RunConfig.model_validate(
            {
                "model": {"depth": 16, "width": 256},
                "data": section,
                "optim": {"lr": 1e-3 * (1 + k)},
                "train": {"seed": k, "batch_size": 64},
            }
        )
        for k in range(K)
    ]


@functools.cache
def train_tensors(data: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A trial's training split, loaded once per process (MNIST's split is the same for every seed)."""
    if data == "synthetic":
        g = torch.Generator().manual_seed(0)
        return torch.randn(SYNTHETIC, 784, generator=g), torch.randint(0, 10, (SYNTHETIC,), generator=g)
    if data == "mnist" and seed != 0:
        return train_tensors(data, 0)
    dm = build_datamodule(trial_configs(seed + 1, data)[seed])
    dm.setup("fit")
    return dm.x_train, dm.y_train


def prepared(cfg: RunConfig, data: str) -> tuple[TensorBatches, torch.nn.Module]:
    """A trial's batches (as its datamodule's train_dataloader makes them) and its seeded model."""
    x, y = train_tensors(data, cfg.train.seed)
    batches = TensorBatches(x, y, cfg.train.batch_size, shuffle=True, seed=cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    return batches, build_model(cfg, in_features=x[0].numel(), num_classes=10)


def epochs(batches):
    while True:
        yield from batches


def timed(step, batches, steps: int, parts: list | None) -> tuple[float, float]:
    """(wall, cpu) seconds for `steps` calls of step(x, y), after one untimed warm-up step.

    With `parts`, each step's time in each part of PARTS is appended to it (step appends the marks).
    """
    stream = epochs(batches)
    step(*next(stream))
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        if parts is None:
            step(*next(stream))
            continue
        marks = [time.perf_counter()]
        x, y = next(stream)
        marks.append(time.perf_counter())
        step(x, y, marks)
        parts.append([b - a for a, b in zip(marks, marks[1:])])
    return time.perf_counter() - t0, time.process_time() - c0


def solo(cfgs: list[RunConfig], data: str, steps: int, parts: list | None = None) -> tuple[float, float]:
    wall = cpu = 0.0
    for cfg in cfgs:
        batches, model = prepared(cfg, data)
        opt = build_optimizer(model.parameters(), cfg.optim)

        def step(x, y, marks=None):
            loss = F.cross_entropy(model(x), y)
            if marks is not None:
                marks.append(time.perf_counter())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if marks is not None:
                marks.append(time.perf_counter())
            opt.step()
            if marks is not None:
                marks.append(time.perf_counter())

        w, c = timed(step, batches, steps, parts)
        wall, cpu = wall + w, cpu + c
    return wall, cpu


def packed(cfgs: list[RunConfig], data: str, steps: int, parts: list | None = None) -> tuple[float, float]:
    members = [prepared(c, data) for c in cfgs]
    model = PackedMLP.from_members([m for _, m in members])
    opt = build_batched_optimizer(model.parameters(), [c.optim for c in cfgs])
    batches = PackedBatches([b for b, _ in members])

    def step(x, y, marks=None):
        if marks is None:
            classifier_step(model, opt, x, y)
            return
        # classifier_step's ops, with the marks between its parts
        losses = member_losses(model, x, y)
        active = opt.freeze(torch.isfinite(losses.detach()))
        marks.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        torch.where(active, losses, 0.0).sum().backward()
        marks.append(time.perf_counter())
        opt.step()
        marks.append(time.perf_counter())

    return timed(step, batches, steps, parts)


KINDS = {"solo": solo, "packed": packed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--data", choices=["synthetic", "mnist", "digits"], default="synthetic")
    parser.add_argument("--parts", action="store_true", help="also time data / forward / backward / optimizer")
    args = parser.parse_args()
    if args.data == "mnist" and not os.path.isdir(MNIST):
        parser.error(f"--data mnist needs the IDX files in {MNIST}")
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; torch threads 1; data {args.data}")
    runs = {(K, kind): [] for K in args.ks for kind in KINDS}
    parts = {(K, kind): [] for K in args.ks for kind in KINDS}
    for rep in range(args.repeats):
        for K in args.ks:
            cfgs = trial_configs(K, args.data)
            for kind in list(KINDS) if rep % 2 == 0 else list(KINDS)[::-1]:
                runs[K, kind].append(KINDS[kind](cfgs, args.data, args.steps))
            if args.parts:
                for kind in list(KINDS) if rep % 2 == 0 else list(KINDS)[::-1]:
                    times = []
                    KINDS[kind](cfgs, args.data, args.steps, times)
                    trial_steps = len(times) * (K if kind == "packed" else 1)  # a packed step is K trial-steps
                    parts[K, kind].append([1e3 * sum(t[i] for t in times) / trial_steps for i in range(len(PARTS))])
    print(f"load average after: {os.getloadavg()}")
    report(runs, args.ks, args.steps)
    if args.parts:
        report_parts(parts, args.ks)


def report(runs: dict, ks: list[int], steps: int) -> None:
    """Median over repeats of trial-steps per second (wall and CPU), and packed against solo."""
    print(f"\n{'K':>3} {'clock':>5} {'solo':>7} {'packed':>7} {'ratio':>6}  (ratios of the repeats)")
    for K in ks:
        for i, clock in enumerate(("wall", "cpu")):
            rates = {kind: [K * steps / r[i] for r in runs[K, kind]] for kind in KINDS}
            rate = {kind: statistics.median(v) for kind, v in rates.items()}
            each = " ".join(f"{p / s:.2f}" for s, p in zip(rates["solo"], rates["packed"]))
            print(
                f"{K:>3} {clock:>5} {rate['solo']:>7.1f} {rate['packed']:>7.1f} {rate['packed'] / rate['solo']:>6.2f}"
                f"  ({each})"
            )
    print("(trial-steps per second per core, median of repeats; ratio > 1: packed is faster than solo)")


def report_parts(parts: dict, ks: list[int]) -> None:
    print(f"\n{'K':>3} {'kind':>6} " + " ".join(f"{p:>9}" for p in PARTS) + f" {'total':>7}")
    for K in ks:
        for kind in KINDS:
            best = [min(r[i] for r in parts[K, kind]) for i in range(len(PARTS))]
            print(f"{K:>3} {kind:>6} " + " ".join(f"{b:>9.2f}" for b in best) + f" {sum(best):>7.2f}")
    print("(ms per trial-step, wall clock, best of the repeats)")


if __name__ == "__main__":
    main()
