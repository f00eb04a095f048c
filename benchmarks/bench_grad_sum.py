"""What the cumulative gradient sum_t G_l(t) costs per training step, two ways, against no sum at all.

The paper MLP (16 x 256, ReLU, residual), Adam (fused), batch 64, one thread, on MNIST
(`--data-path ../shared/mnist`) or on MNIST-shaped random data (the default: the cost does not depend
on the values). One training loop, three ways of running a step, rotated every `--segment` steps so
that a change in the machine's load hits all three alike:
- none: zero_grad, backward, step (bench_train's plain loop);
- after: the same, then every layer's gradient added into the accumulator after backward
  (`torch._foreach_add_`: what GeometryMonitor.on_before_optimizer_step does);
- hooks: each layer's gradient added by a post-accumulate-grad hook the moment backward made it,
  while it is still in cache (the alternative; see below).

Measured (2026-12, 2 shared cores, MNIST, five runs; extra us/step, after / hooks): 468 / 250,
390 / 735, 466 / 317, 244 / -90, 254 / 544. The machine's neighbours move a step by 10-20 % between
runs, so neither is reliably cheaper: geocont keeps the simpler one, one call after backward.
Prints CPU ms per step (median over rounds) and each sum's extra cost over `none`: the median over
rounds of that round's difference, per step and as a share of the step. The accumulators are the
monitor's: one (L, m, n) fp32 tensor, per-layer views.

    python benchmarks/bench_grad_sum.py [--data-path ../shared/mnist] [--segment 50] [--rounds 12]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from geocont.config import RunConfig
from geocont.data import build_datamodule
from geocont.lit.module import build_optimizer
from geocont.models import build_model

MODES = ("none", "after", "hooks")


def batches(data_path: str | None, n: int, batch: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n training batches: MNIST's through geocont's own loader, or random MNIST-shaped ones."""
    if data_path:
        cfg = RunConfig.model_validate({"data": {"name": "mnist", "path": data_path}, "train": {"batch_size": batch}})
        dm = build_datamodule(cfg)
        dm.setup("fit")
        return list(itertools.islice(dm.train_dataloader(), n))
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(n * batch, 784, generator=gen), torch.randint(0, 10, (n * batch,), generator=gen)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-path", default=None)
    parser.add_argument("--segment", type=int, default=50, help="steps per mode before the next mode's turn")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = RunConfig.model_validate({"model": {"depth": 16, "width": 256}, "data": {"name": "digits"}})
    torch.manual_seed(0)
    model = build_model(cfg, in_features=784, num_classes=10)
    opt = build_optimizer(model.parameters(), cfg.optim)
    weights = model.weight_groups()[""]
    grad_sum = torch.zeros(len(weights), *weights[0].shape)
    views = list(grad_sum.unbind(0))
    data = batches(args.data_path, args.segment)

    def add(view, weight):
        view.add_(weight.grad)

    hooks: list = []

    def use_hooks(on: bool) -> None:
        for h in hooks:
            h.remove()
        hooks.clear()
        if on:
            hooks.extend(w.register_post_accumulate_grad_hook(partial(add, v)) for w, v in zip(weights, views))

    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds + 1):  # round 0 warms up, not counted
        for mode in MODES[r % 3 :] + MODES[: r % 3]:  # the order rotates too
            use_hooks(mode == "hooks")
            c0 = time.process_time()
            for x, y in data:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if mode == "after":
                    with torch.no_grad():
                        torch._foreach_add_(views, [w.grad for w in weights])
                opt.step()
            if r:
                times[mode].append((time.process_time() - c0) / len(data) * 1e3)
    use_hooks(False)
    source = f"MNIST ({args.data_path})" if args.data_path else "random MNIST-shaped data"
    print(f"paper MLP on {source}, one thread, {args.rounds} rounds of {args.segment} steps per mode")
    print(f"  none  {statistics.median(times['none']):6.2f} ms/step")
    for mode in MODES[1:]:
        # each round's own difference to `none`: a load change between rounds cancels
        extra = statistics.median(t - t0 for t, t0 in zip(times[mode], times["none"]))
        share = statistics.median(t / t0 - 1 for t, t0 in zip(times[mode], times["none"]))
        ms = statistics.median(times[mode])
        print(f"  {mode:5s} {ms:6.2f} ms/step  extra {1e3 * extra:5.0f} us/step ({share:+.1%})")


if __name__ == "__main__":
    main()
