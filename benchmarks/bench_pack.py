"""Packed trials vs the plain solo loop: trial-steps per second per core for K = 1, 3, 8.

The paper MLP (16 x 256, ReLU, residual), batch 64, Adam 1e-3, one thread. For each K:
- solo: K trials trained one after the other, each the plain loop (its own seeded model and data order,
  build_optimizer's fused Adam, in-memory TensorBatches) for `--steps` steps;
- packed: the same K trials as one PackedMLP + batched Adam + classifier_step for `--steps` steps.
Each trial's lr differs (as in a sweep), so the batched optimizer really has per-member values.
- bound: the same pack stepped by torch's fused Adam with one lr for all members. Not a valid sweep (the
  members' hyperparameters are lost); it shows what the batched optimizer costs against a fused kernel.

Solo and packed runs alternate (ABAB..., the order flipped every repeat) so that a change in the
machine's load hits both; the machine is shared, so CPU time (time.process_time, one thread: what the
work costs however busy the cores are) is reported beside wall time, and the load average is printed.

    python benchmarks/bench_pack.py [--steps 40] [--repeats 3] [--ks 1 3 8] [--data digits|mnist]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from itertools import islice

import torch
import torch.nn.functional as F

from geocont.config import RunConfig
from geocont.data import build_datamodule
from geocont.data.packed import PackedBatches
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.models.packed import PackedMLP
from geocont.optim.batched import build_batched_optimizer
from geocont.optim.step import classifier_step, member_losses

MNIST = "/work/shared/mnist"


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


def epochs(batches):
    while True:
        yield from batches


def prepared(cfg: RunConfig):
    dm = build_datamodule(cfg)
    dm.setup("fit")
    torch.manual_seed(cfg.train.seed)
    return dm, build_model(cfg, in_features=dm.in_features, num_classes=dm.num_classes)


def timed(step, batches, steps: int) -> tuple[float, float]:
    """(wall, cpu) seconds for `steps` calls of step(x, y), after one untimed warm-up step."""
    stream = epochs(batches)
    step(*next(stream))
    t0, c0 = time.perf_counter(), time.process_time()
    for x, y in islice(stream, steps):
        step(x, y)
    return time.perf_counter() - t0, time.process_time() - c0


def solo(cfgs: list[RunConfig], steps: int) -> tuple[float, float]:
    wall = cpu = 0.0
    for cfg in cfgs:
        dm, model = prepared(cfg)
        opt = build_optimizer(model.parameters(), cfg.optim)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        w, c = timed(step, dm.train_dataloader(), steps)
        wall, cpu = wall + w, cpu + c
    return wall, cpu


def packed(cfgs: list[RunConfig], steps: int) -> tuple[float, float]:
    dms, models = zip(*(prepared(c) for c in cfgs))
    model = PackedMLP.from_members(list(models))
    opt = build_batched_optimizer(model.parameters(), [c.optim for c in cfgs])
    batches = PackedBatches([dm.train_dataloader() for dm in dms])
    return timed(lambda x, y: classifier_step(model, opt, x, y), batches, steps)


def bound(cfgs: list[RunConfig], steps: int) -> tuple[float, float]:
    dms, models = zip(*(prepared(c) for c in cfgs))
    model = PackedMLP.from_members(list(models))
    opt = build_optimizer(model.parameters(), cfgs[0].optim)  # fused, one lr

    def step(x, y):
        loss = member_losses(model, x, y).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return timed(step, PackedBatches([dm.train_dataloader() for dm in dms]), steps)


KINDS = {"solo": solo, "packed": packed, "bound": bound}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--data", choices=["digits", "mnist"], default="digits")
    args = parser.parse_args()
    if args.data == "mnist" and not os.path.isdir(MNIST):
        parser.error(f"--data mnist needs the IDX files in {MNIST}")
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; torch threads 1")
    runs = {(K, kind): [] for K in args.ks for kind in KINDS}
    for rep in range(args.repeats):
        for K in args.ks:
            cfgs = trial_configs(K, args.data)
            order = list(KINDS) if rep % 2 == 0 else list(KINDS)[::-1]
            for kind in order:
                runs[K, kind].append(KINDS[kind](cfgs, args.steps))
    print(f"load average after: {os.getloadavg()}")
    report(runs, args.ks, args.steps)


def report(runs: dict, ks: list[int], steps: int) -> None:
    """Median over repeats of trial-steps per second (wall and CPU), and each against solo."""
    print(f"\n{'K':>3} {'clock':>5} {'solo':>7} {'packed':>7} {'ratio':>6} {'bound':>7} {'ratio':>6}")
    for K in ks:
        for i, clock in enumerate(("wall", "cpu")):
            rate = {kind: statistics.median(K * steps / r[i] for r in runs[K, kind]) for kind in KINDS}
            print(
                f"{K:>3} {clock:>5} {rate['solo']:>7.1f} {rate['packed']:>7.1f} {rate['packed'] / rate['solo']:>6.2f}"
                f" {rate['bound']:>7.1f} {rate['bound'] / rate['solo']:>6.2f}"
            )
    print("(trial-steps per second per core, median of repeats; ratio > 1: faster than solo)")


if __name__ == "__main__":
    main()
