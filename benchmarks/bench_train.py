"""geocont train (every metric, every epoch) vs a plain PyTorch loop doing the same training.

Both run in this process on one thread: the paper MLP (16 x 256, ReLU, residual), Adam 1e-3, batch 64,
a validation pass each epoch, on digits (24 steps an epoch, the offline default) or on MNIST (938
steps an epoch, the paper's workload: `--data mnist --data-path ../shared/mnist`). The reference
loop uses the same in-memory batches and the same optimizer kernels as geocont (fused Adam), so the
ratio measures geocont's own cost. Printed, in wall-clock and in process CPU time (with one thread,
CPU time is what the work costs even when other processes share the cores):

- the whole run's ratio, and the steady-state ratio of one epoch (median over epochs 2..N);
- where geocont's extra time goes per step: the cumulative-gradient add (after each backward), the
  epoch-end metrics, the loss reads and logging, and the rest (Lightning's loop, hooks, validation
  bookkeeping);
- with `--processes`: whole processes over the same epochs (a fresh `geocont train` against a fresh
  plain-loop process that imports no Lightning), with start-up broken out (importing torch, importing
  Lightning, `geocont train` before its first epoch).

Targets on MNIST: steady-state epoch <= 1.10x, whole processes over 3 epochs <= 1.15x. On digits the
exact full-spectrum metrics every 24-step epoch are ~30 % of the run by design (docs/contracts.md).

    python benchmarks/bench_train.py [--data digits|mnist] [--data-path DIR] [--epochs N] [--processes]
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from geocont.config import resolve
from geocont.data import build_datamodule
from geocont.lit import callbacks, module
from geocont.lit.module import build_optimizer
from geocont.models import build_model
from geocont.train import train

ROOT = Path(__file__).resolve().parents[1]


def textbook_adam(params, cfg):
    """What a hand-written loop uses: torch.optim.Adam with its defaults (per-tensor kernels on CPU)."""
    return torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def plain_loop(cfg, make_optimizer=build_optimizer, epoch_times: list | None = None) -> tuple[float, float]:
    """The reference: the same model, data order, optimizer and validation, nothing else. (wall, cpu) s.

    `epoch_times`, when given, receives (wall, cpu) of each epoch (training and its validation pass).
    """
    torch.manual_seed(cfg.train.seed)
    dm = build_datamodule(cfg)
    dm.setup()
    model = build_model(cfg, in_features=dm.in_features, num_classes=dm.num_classes)
    opt = make_optimizer(model.parameters(), cfg.optim)
    train_batches, val_batches = dm.train_dataloader(), dm.val_dataloader()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(cfg.train.epochs):
        e0, ec0 = time.perf_counter(), time.process_time()
        model.train()
        for x, y in train_batches:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(-1) == y).sum().item() for x, y in val_batches)
        if epoch_times is not None:
            epoch_times.append((time.perf_counter() - e0, time.process_time() - ec0))
    assert correct >= 0
    return time.perf_counter() - t0, time.process_time() - c0


class Timers:
    """Adds up (wall, cpu) spent in named hooks of geocont's training step, by wrapping them."""

    HOOKS = {
        "grad add": (callbacks.GeometryMonitor, "on_after_backward"),  # + grad_init, once
        "metrics": (callbacks.GeometryMonitor, "emit"),
        "loss reads and logging": (module.GeoModule, "read_losses"),
    }

    def __init__(self):
        self.totals = dict.fromkeys(self.HOOKS, (0.0, 0.0))
        for name, (owner, attr) in self.HOOKS.items():
            setattr(owner, attr, self._timed(name, getattr(owner, attr)))

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.HOOKS, (0.0, 0.0))

    def _timed(self, name, fn):
        def wrapper(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = self.totals[name]
                self.totals[name] = (wall + time.perf_counter() - t0, cpu + time.process_time() - c0)

        return wrapper


def geocont_run(cfg, timers: Timers, epoch_times: list | None = None) -> tuple[float, float, dict]:
    """(wall, cpu) of the whole train() call and the hook totals; `epoch_times` gets (wall, cpu) per epoch."""
    timers.reset()
    marks = []

    def on_metrics(epoch: int, step: int, values: dict) -> None:
        marks.append((time.perf_counter(), time.process_time()))

    with tempfile.TemporaryDirectory() as store:
        t0, c0 = time.perf_counter(), time.process_time()
        result = train(cfg, store, progress=False, on_metrics=on_metrics)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert result.status == "completed", result.error
    if epoch_times is not None:  # one metrics event per epoch end; the last may repeat at the end of training
        epoch_times.extend((b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:]))
    return wall, cpu, dict(timers.totals)


def steady(epochs: list[tuple[float, float]]) -> tuple[float, float]:
    """Median (wall, cpu) of an epoch, the first left out (it pays for warm-up)."""
    rest = epochs[1:] or epochs
    return statistics.median(w for w, _ in rest), statistics.median(c for _, c in rest)


# ---------------------------------------------------------------------------------------------
# Whole processes


def child_cpu(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) of one child process, cpu = its user + system time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def read_idx(path: Path) -> torch.Tensor:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim :]), dtype=torch.uint8).reshape(shape)


def plain_process(data_path: str, epochs: int) -> None:
    """A user's own MNIST loop in a fresh process: torch only (no Lightning), same model, data and Adam."""
    from geocont.models.mlp import ResidualMLP  # plain torch modules; geocont.config is pydantic only

    torch.set_num_threads(1)
    folder = Path(data_path)
    find = lambda stem: next(p for p in (folder / stem, folder / f"{stem}.gz") if p.is_file())  # noqa: E731
    x_tr = read_idx(find("train-images-idx3-ubyte")).flatten(1).float() / 255
    x_va = read_idx(find("t10k-images-idx3-ubyte")).flatten(1).float() / 255
    y_tr, y_va = read_idx(find("train-labels-idx1-ubyte")).long(), read_idx(find("t10k-labels-idx1-ubyte")).long()
    mean, std = x_tr.mean(0, keepdim=True), x_tr.std(0, keepdim=True)
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    x_tr, x_va = (x_tr - mean) / std, (x_va - mean) / std
    torch.manual_seed(0)
    cfg = resolve({"data": {"name": "mnist", "path": data_path}})
    model = ResidualMLP(cfg.model, in_features=784, num_classes=10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(x_tr), generator=generator)
        for b in range(0, len(x_tr), 64):
            idx = order[b : b + 64]
            loss = F.cross_entropy(model(x_tr.index_select(0, idx)), y_tr.index_select(0, idx))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            batches = range(0, len(x_va), 512)
            correct = sum((model(x_va[i : i + 512]).argmax(-1) == y_va[i : i + 512]).sum().item() for i in batches)
    assert correct >= 0


def processes(data_path: str, epochs: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    py = sys.executable
    geocont = str(Path(py).with_name("geocont"))
    imp_torch = child_cpu([py, "-c", "import torch"], env)
    imp_pl = child_cpu([py, "-c", "import pytorch_lightning"], env)
    with tempfile.TemporaryDirectory() as store:
        sets = ["data.name=mnist", f"data.path={data_path}", f"train.epochs={epochs}", "tracking.wandb.mode=disabled"]
        cmd = [geocont, "train", "paper-mlp", "--store", store, "--no-progress"]
        for s in sets:
            cmd += ["--set", s]
        ours = child_cpu(cmd, env)
    plain = child_cpu([py, __file__, "--plain-process", "--data-path", data_path, "--epochs", str(epochs)], env)
    print(f"\nwhole processes, {epochs} MNIST epochs, one thread (OMP_NUM_THREADS=1), wall / cpu s")
    print(f"  import torch                  {imp_torch[0]:6.2f} / {imp_torch[1]:6.2f}")
    print(f"  import pytorch_lightning      {imp_pl[0]:6.2f} / {imp_pl[1]:6.2f}   (torch included)")
    print(f"  plain loop process            {plain[0]:6.2f} / {plain[1]:6.2f}")
    print(f"  geocont train process         {ours[0]:6.2f} / {ours[1]:6.2f}   (tensorboard on, wandb disabled)")
    print(f"  ratio                         {ours[0] / plain[0]:6.3f} / {ours[1] / plain[1]:6.3f}   (target <= 1.15)")
    extra = imp_pl[1] - imp_torch[1]
    print(f"  of which Lightning's import   {extra:6.2f} s cpu = {extra / plain[1]:.1%} of the plain process")


# ---------------------------------------------------------------------------------------------


def report(cfg, plain, plain_epochs, textbook, ours, ours_epochs, hooks) -> None:
    p_wall, p_cpu = plain
    g_wall, g_cpu = ours
    n = cfg.train.epochs
    dm = build_datamodule(cfg)
    dm.setup()
    steps = len(dm.train_dataloader())
    print(f"{cfg.data.name}: {steps} steps an epoch, {n} epochs, one thread; load {os.getloadavg()[0]:.1f}")
    print(f"plain loop, same kernels  wall {p_wall:7.2f} s  cpu {p_cpu:7.2f} s  ({p_cpu / n * 1000:.0f} ms cpu/epoch)")
    if textbook is not None:
        t_wall, t_cpu = textbook
        per_epoch = t_cpu / n * 1000
        print(f"plain loop, textbook Adam wall {t_wall:7.2f} s  cpu {t_cpu:7.2f} s  ({per_epoch:.0f} ms cpu/epoch)")
    print(f"geocont train (metrics)   wall {g_wall:7.2f} s  cpu {g_cpu:7.2f} s  (tensorboard on)")
    print(f"whole-run ratio           wall {g_wall / p_wall:7.3f}    cpu {g_cpu / p_cpu:7.3f}")
    (pe_wall, pe_cpu), (ge_wall, ge_cpu) = steady(plain_epochs), steady(ours_epochs)
    print(f"steady-state epoch        plain {pe_cpu * 1000:.0f} ms cpu, geocont {ge_cpu * 1000:.0f} ms cpu: "
          f"ratio wall {ge_wall / pe_wall:.3f}  cpu {ge_cpu / pe_cpu:.3f}")  # fmt: skip
    if textbook is not None:
        print(f"ratio vs textbook Adam    wall {g_wall / t_wall:7.3f}    cpu {g_cpu / t_cpu:7.3f}")
    total_steps = n * steps
    print(f"per step (cpu, us): plain {p_cpu / total_steps * 1e6:.0f}; geocont's extra:")
    named = 0.0
    for name, (_, cpu) in hooks.items():
        named += cpu
        print(f"  {name:24s} {cpu / total_steps * 1e6:8.1f} us/step  ({cpu / g_cpu:6.1%} of the run)")
    rest = g_cpu - p_cpu - named
    print(f"  {'Lightning and the rest':24s} {rest / total_steps * 1e6:8.1f} us/step  ({rest / g_cpu:6.1%} of the run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="digits", choices=["digits", "mnist"])
    parser.add_argument("--data-path", default=str(ROOT.parent / "shared" / "mnist"))
    parser.add_argument("--epochs", type=int, default=None, help="default: 30 on digits, 3 on MNIST")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--wandb", default="disabled", choices=["disabled", "offline"])
    parser.add_argument("--processes", action="store_true", help="also time whole processes (MNIST)")
    parser.add_argument("--plain-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    epochs = args.epochs or (30 if args.data == "digits" else 3)
    torch.set_num_threads(1)
    if args.plain_process:
        plain_process(args.data_path, epochs)
        return
    data = {"name": "mnist", "path": args.data_path} if args.data == "mnist" else {"name": "digits"}
    cfg = resolve(
        {
            "preset": "paper-mlp",
            "data": data,
            "train": {"epochs": epochs},
            "tracking": {"wandb": {"mode": args.wandb}, "tensorboard": True},
        }
    )
    timers = Timers()
    geocont_run(resolve({"preset": "smoke", "tracking": {"wandb": {"mode": "disabled"}}}), timers)  # warm imports
    same, textbook, ours = [], [], []
    for _ in range(args.repeats):
        plain_epochs, ours_epochs = [], []
        same.append(plain_loop(cfg, epoch_times=plain_epochs))
        if args.data == "digits":  # MNIST epochs are long: the textbook comparison stays a digits number
            textbook.append(plain_loop(cfg, textbook_adam))
        g_wall, g_cpu, hooks = geocont_run(cfg, timers, ours_epochs)
        ours.append(((g_wall, g_cpu), hooks, plain_epochs, ours_epochs))
    (g, hooks, plain_epochs, ours_epochs) = min(ours, key=lambda o: o[0][1])
    best_textbook = min(textbook, key=lambda t: t[1]) if textbook else None
    report(cfg, min(same, key=lambda t: t[1]), plain_epochs, best_textbook, g, ours_epochs, hooks)
    if args.processes:
        processes(args.data_path, epochs)


if __name__ == "__main__":
    main()
