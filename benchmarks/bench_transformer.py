"""geocont train (every metric, every role) vs a plain PyTorch loop training the same transformer.

Both run in this process with the same thread count: the `transformer-cpu` preset (6 x 128 Llama-style
model, stdlib corpus, byte tokens, sequence 128, batch 32, Adam 1e-3), validating every
`train.metrics_every_n_steps` steps as train() does. geocont's time is the whole train() call
(Trainer, loggers, data from the cache, metrics, store files); the plain loop's is its training and
validation steps only. Prints tokens/s of each and the ratio (target <= 1.15), in wall-clock and in
process CPU time: on a shared machine the CPU-time ratio is the one that other jobs do not move.

    python benchmarks/bench_transformer.py [--steps 600] [--threads 1] [--repeats 1] [--preset transformer-cpu]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import torch
import torch.nn.functional as F

from geocont.config import resolve
from geocont.data.text import TextDataModule
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.train import train


def plain_loop(cfg) -> tuple[float, float, float]:
    """The reference: the same model, batches, optimizer and validation schedule, nothing else.

    Returns (wall seconds in total, wall seconds in training steps only, CPU seconds in total)."""
    torch.manual_seed(cfg.train.seed)
    dm = TextDataModule(cfg.data, cfg.train.batch_size, cfg.train.seed)
    dm.setup()
    model = build_model(cfg, vocab_size=dm.vocab_size)
    opt = build_optimizer(model.parameters(), cfg.optim)  # geocont's kernels (fused): the ratio is its own cost
    every, steps = cfg.train.metrics_every_n_steps, cfg.train.max_steps
    val_batches = dm.val_dataloader()
    step, train_s, t0, c0 = 0, 0.0, time.perf_counter(), time.process_time()
    while step < steps:
        for x, y in dm.train_dataloader():
            t_step = time.perf_counter()
            model.train()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            train_s += time.perf_counter() - t_step
            if step % every == 0 or step == steps:
                model.eval()
                with torch.no_grad():
                    val = sum(F.cross_entropy(model(xv).flatten(0, 1), yv.flatten()).item() for xv, yv in val_batches)
                assert math.isfinite(val)
            if step == steps:
                break
    return time.perf_counter() - t0, train_s, time.process_time() - c0


def geocont_run(cfg) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one train() call."""
    with tempfile.TemporaryDirectory() as store:
        t0, c0 = time.perf_counter(), time.process_time()
        result = train(cfg, store, progress=False)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert result.status == "completed", result.error
    assert any(k.startswith("weight/down/") for k in result.final), "per-role metrics missing"
    return total, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="transformer-cpu")
    parser.add_argument("--steps", type=int, default=None, help="train.max_steps (default: the preset's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="alternate the two runs; report the fastest of each")
    parser.add_argument("--wandb", default="disabled", choices=["disabled", "offline"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_section = {"max_steps": args.steps} if args.steps else {}
    cfg = resolve(
        {
            "preset": args.preset,
            "train": train_section,
            "tracking": {"wandb": {"mode": args.wandb}, "tensorboard": True},
        }
    )
    warm = {"preset": "transformer-smoke", "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False}}
    geocont_run(resolve(warm))  # imports, and the tokenized corpus into the cache
    TextDataModule(cfg.data, cfg.train.batch_size, cfg.train.seed).setup()
    tokens = cfg.train.max_steps * cfg.train.batch_size * cfg.data.seq_len
    plain, ours = [], []
    for _ in range(args.repeats):
        plain.append(plain_loop(cfg))
        ours.append(geocont_run(cfg))
    p_wall, p_train, p_cpu = min(plain)
    g_wall, g_cpu = min(ours)
    print(f"config                  {args.preset}, {cfg.train.max_steps} steps, {args.threads} thread(s)")
    print(f"plain PyTorch loop      {p_wall:7.2f} s  ({tokens / p_train:8.0f} tokens/s in training steps)")
    print(f"geocont train (metrics) {g_wall:7.2f} s  (wandb {args.wandb}, tensorboard on)")
    print(f"overall tokens/s        plain {tokens / p_wall:8.0f}   geocont {tokens / g_wall:8.0f}")
    print(f"ratio, wall clock       {g_wall / p_wall:7.3f}   (target <= 1.15)")
    print(f"ratio, CPU time         {g_cpu / p_cpu:7.3f}   ({p_cpu:.1f} s vs {g_cpu:.1f} s)")


if __name__ == "__main__":
    main()
