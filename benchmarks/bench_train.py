"""geocont train (every metric, every epoch) vs a plain PyTorch loop doing the same training.

Both run on one thread: the paper MLP (16 x 256, ReLU, residual), Adam 1e-3, batch 64, a validation
pass each epoch, on digits (24 steps an epoch, the offline default) or on MNIST (938 steps an epoch,
the paper's workload: `--data mnist --data-path ../shared/mnist`). The reference loop uses the same
in-memory batches and the same optimizer kernels as geocont (fused Adam), so the ratio measures
geocont's own cost. Runs alternate plain / geocont (`--repeats` pairs) so that a change in the
machine's load hits both; every pair's ratio is printed, then the median. Times are wall-clock and
process CPU time (with one thread, CPU time is what the work costs even when other processes share
the cores).

digits (in this process, 30 epochs): the whole run's ratio, the steady-state epoch's, the metrics'
share of the run (the exact full spectrum every 24-step epoch is ~30 % by design, docs/contracts.md),
and where geocont's extra time goes per step.

mnist (3 epochs): the two targets of the project,
- steady-state epoch (median over epochs 2..N, in this process): target <= 1.10;
  `--interleaved` instead pairs epochs seconds apart: one geocont run of `--epochs` epochs with a plain
  epoch run after each of its epochs, in the same process (this machine's neighbours move a whole run
  by 10-20 % from one minute to the next; adjacent epochs see the same load);
- whole processes (a fresh `geocont train paper-mlp` against a fresh plain-loop process that imports
  no Lightning): target <= 1.15, with start-up broken out (importing torch, importing Lightning, each
  process before its first step, and the training part alone); `--no-processes` skips them.
Per step: the cumulative-gradient add (before each optimizer step), the epoch-end metrics, the loss reads and
logging, and the rest (Lightning's loop, hooks, validation bookkeeping).

    python benchmarks/bench_train.py [--data digits|mnist] [--data-path DIR] [--epochs N] [--repeats R]
                                     [--interleaved]
"""

from __future__ import annotations

import argparse
import gzip
import json
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
    plain = PlainEpochs(cfg, make_optimizer)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(cfg.train.epochs):
        times = plain.epoch()
        if epoch_times is not None:
            epoch_times.append(times)
    return time.perf_counter() - t0, time.process_time() - c0


class PlainEpochs:
    """The plain loop's model, optimizer and batches, trained one epoch (and its validation pass) per call."""

    def __init__(self, cfg, make_optimizer=build_optimizer):
        torch.manual_seed(cfg.train.seed)
        dm = build_datamodule(cfg)
        dm.setup()
        self.model = build_model(cfg, in_features=dm.in_features, num_classes=dm.num_classes)
        self.opt = make_optimizer(self.model.parameters(), cfg.optim)
        self.train_batches, self.val_batches = dm.train_dataloader(), dm.val_dataloader()

    def epoch(self) -> tuple[float, float]:
        """(wall, cpu) s of one epoch. Grad mode forced on: it may run inside Lightning's validation loop."""
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode(False), torch.enable_grad():
            self.model.train()
            for x, y in self.train_batches:
                loss = F.cross_entropy(self.model(x), y)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
        self.model.eval()
        with torch.no_grad():
            correct = sum((self.model(x).argmax(-1) == y).sum().item() for x, y in self.val_batches)
        assert correct >= 0
        return time.perf_counter() - t0, time.process_time() - c0


class Timers:
    """Adds up (wall, cpu) spent in named hooks of geocont's training step, by wrapping them."""

    HOOKS = {
        "grad add": (callbacks.GeometryMonitor, "on_before_optimizer_step"),  # + grad_init, once
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


def plain_process(data_path: str, epochs: int, out: str | None = None) -> None:
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
    t0 = time.perf_counter()
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
    if out:
        Path(out).write_text(json.dumps({"train_s": time.perf_counter() - t0}))


def geocont_process(data_path: str, epochs: int, env: dict[str, str]) -> tuple[float, float, float]:
    """(wall, cpu) of a fresh `geocont train paper-mlp` process and its training part (run.json duration_s)."""
    geocont = str(Path(sys.executable).with_name("geocont"))
    with tempfile.TemporaryDirectory() as store:
        sets = ["data.name=mnist", f"data.path={data_path}", f"train.epochs={epochs}", "tracking.wandb.mode=disabled"]
        cmd = [geocont, "train", "paper-mlp", "--store", store, "--no-progress"]
        for s in sets:
            cmd += ["--set", s]
        wall, cpu = child_cpu(cmd, env)
        (info,) = [json.loads(p.read_text()) for p in Path(store).glob("single/*/run.json")]
    assert info["status"] == "completed", info
    return wall, cpu, info["duration_s"]


def plain_child(data_path: str, epochs: int, env: dict[str, str]) -> tuple[float, float, float]:
    """(wall, cpu) of a fresh plain-loop process and its training part (from its first step to its end)."""
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    out.close()
    try:
        cmd = [sys.executable, __file__, "--plain-process", "--data-path", data_path, "--epochs", str(epochs)]
        wall, cpu = child_cpu(cmd + ["--plain-out", out.name], env)
        return wall, cpu, json.loads(Path(out.name).read_text())["train_s"]
    finally:
        os.unlink(out.name)


def processes(data_path: str, epochs: int, repeats: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    py = sys.executable
    imp_torch = child_cpu([py, "-c", "import torch"], env)
    imp_pl = child_cpu([py, "-c", "import pytorch_lightning"], env)
    pairs = []
    for _ in range(repeats):  # alternated: a change in load hits both
        plain = plain_child(data_path, epochs, env)
        ours = geocont_process(data_path, epochs, env)
        pairs.append((plain, ours))
    print(f"\nwhole processes, {epochs} MNIST epochs, one thread (OMP_NUM_THREADS=1), wall / cpu s; "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"  import torch                  {imp_torch[0]:6.2f} / {imp_torch[1]:6.2f}")
    print(f"  import pytorch_lightning      {imp_pl[0]:6.2f} / {imp_pl[1]:6.2f}   (torch included)")
    for i, (plain, ours) in enumerate(pairs, 1):
        print(f"  pair {i}: plain process {plain[0]:6.2f} / {plain[1]:6.2f}, geocont train {ours[0]:6.2f} / "
              f"{ours[1]:6.2f}: ratio {ours[0] / plain[0]:.3f} / {ours[1] / plain[1]:.3f}")  # fmt: skip
        print(f"    before the first step: plain {plain[0] - plain[2]:5.2f} s, geocont {ours[0] - ours[2]:5.2f} s; "
              f"training: plain {plain[2]:6.2f} s, geocont {ours[2]:6.2f} s ({ours[2] / plain[2]:.3f})")  # fmt: skip
    wall = statistics.median(o[0] / p[0] for p, o in pairs)
    cpu = statistics.median(o[1] / p[1] for p, o in pairs)
    part = statistics.median(o[2] / p[2] for p, o in pairs)
    print(f"  ratio (median of pairs)       {wall:6.3f} / {cpu:6.3f}   (target <= 1.15); training part {part:.3f}")
    extra = imp_pl[1] - imp_torch[1]
    plain_cpu = statistics.median(p[1] for p, _ in pairs)
    print(f"  of which Lightning's import   {extra:6.2f} s cpu = {extra / plain_cpu:.1%} of the plain process")
    print("  (geocont's part before the first step: its CLI, Lightning's import, data, preflight and fingerprint;"
          " its training part, run.json duration_s, includes building the Trainer and the final metrics)")  # fmt: skip


# ---------------------------------------------------------------------------------------------


def per_step(hooks: dict, total_steps: int, g_cpu: float, extra_per_step: float) -> None:
    """geocont's extra CPU time per step: the timed hooks, and the rest of `extra_per_step` (s)."""
    named = 0.0
    for name, (_, cpu) in hooks.items():
        named += cpu / total_steps
        print(f"  {name:24s} {cpu / total_steps * 1e6:8.1f} us/step  ({cpu / g_cpu:6.1%} of the run)")
    rest = extra_per_step - named
    print(f"  {'Lightning and the rest':24s} {rest * 1e6:8.1f} us/step  (steady-state epoch minus the above)")


def alternated(cfg, timers: Timers, repeats: int, textbook: bool = False) -> list[tuple]:
    """`repeats` pairs, the plain loop then geocont: (plain, [textbook,] geocont (wall, cpu), hooks, plain's
    epoch times, geocont's epoch times). `textbook` adds a run of the plain loop with torch.optim.Adam's defaults."""
    pairs = []
    for _ in range(repeats):
        plain_epochs, ours_epochs = [], []
        plain = plain_loop(cfg, epoch_times=plain_epochs)
        extra = (plain_loop(cfg, textbook_adam),) if textbook else ()
        g_wall, g_cpu, hooks = geocont_run(cfg, timers, ours_epochs)
        pairs.append((plain, *extra, (g_wall, g_cpu), hooks, plain_epochs, ours_epochs))
    return pairs


def digits(cfg, timers: Timers, repeats: int) -> None:
    """Whole run and steady-state epoch, plain vs geocont alternated, and the metrics' share."""
    n = cfg.train.epochs
    steps = steps_per_epoch(cfg)
    pairs = alternated(cfg, timers, repeats, textbook=True)
    print(f"digits: {steps} steps an epoch, {n} epochs, one thread; load {os.getloadavg()[0]:.1f}")
    for i, (plain, textbook, ours, hooks, pe, ge) in enumerate(pairs, 1):
        metrics = hooks["metrics"][1] / ours[1]
        print(f"  pair {i}: plain {plain[1]:6.2f} s cpu, textbook Adam {textbook[1]:6.2f}, geocont {ours[1]:6.2f}: "
              f"whole run {ours[1] / plain[1]:.3f}, steady epoch {steady(ge)[1] / steady(pe)[1]:.3f}, "
              f"vs textbook {ours[1] / textbook[1]:.3f}; metrics {metrics:.1%} of the run")  # fmt: skip
    plain, textbook, ours, hooks, pe, ge = min(pairs, key=lambda p: p[2][1])
    print(f"whole-run cpu ratio (median of pairs) {statistics.median(p[2][1] / p[0][1] for p in pairs):.3f}; "
          f"metrics' share {statistics.median(p[3]['metrics'][1] / p[2][1] for p in pairs):.1%}")  # fmt: skip
    print(f"per step (cpu, us), the fastest geocont run: plain {steady(pe)[1] / steps * 1e6:.0f}; geocont's extra:")
    per_step(hooks, n * steps, ours[1], (steady(ge)[1] - steady(pe)[1]) / steps)


def mnist(cfg, timers: Timers, repeats: int) -> None:
    """The steady-state epoch, plain vs geocont alternated in this process."""
    n = cfg.train.epochs
    steps = steps_per_epoch(cfg)
    pairs = alternated(cfg, timers, repeats)
    print(f"mnist: {steps} steps an epoch, {n} epochs, one thread; load {os.getloadavg()[0]:.1f}")
    for i, (plain, ours, hooks, pe, ge) in enumerate(pairs, 1):
        (pw, pc), (gw, gc) = steady(pe), steady(ge)
        print(f"  pair {i}: steady-state epoch plain {pc:6.2f} s cpu, geocont {gc:6.2f}: ratio wall {gw / pw:.3f} "
              f"cpu {gc / pc:.3f}; whole run in-process cpu {ours[1] / plain[1]:.3f}")  # fmt: skip
    wall = statistics.median(steady(p[4])[0] / steady(p[3])[0] for p in pairs)
    cpu = statistics.median(steady(p[4])[1] / steady(p[3])[1] for p in pairs)
    print(f"steady-state epoch ratio (median of pairs) wall {wall:.3f}  cpu {cpu:.3f}   (target <= 1.10)")
    plain, ours, hooks, pe, ge = min(pairs, key=lambda p: steady(p[4])[1])
    print(f"per step (cpu, us), the fastest geocont run: plain {steady(pe)[1] / steps * 1e6:.0f}; geocont's extra:")
    per_step(hooks, n * steps, ours[1], (steady(ge)[1] - steady(pe)[1]) / steps)


def interleaved(cfg) -> None:
    """One geocont run with one plain epoch run between each two of its epochs, in the same process.

    Each geocont epoch (training, validation and its metrics, from one metrics event to the next) is paired
    with the plain epoch right after it, seconds apart: the machine's load, which drifts over minutes, hits
    both alike. The first geocont epoch (warm-up) is left out.
    """
    plain, marks, plain_times = PlainEpochs(cfg), [], []

    def on_metrics(epoch: int, step: int, values: dict) -> None:
        marks.append((time.perf_counter(), time.process_time()))  # geocont's epoch ends here
        plain_times.append(plain.epoch())
        marks.append((time.perf_counter(), time.process_time()))  # and its next one starts here

    plain.epoch()  # warm-up, as geocont's first epoch
    with tempfile.TemporaryDirectory() as store:
        result = train(cfg, store, progress=False, on_metrics=on_metrics)
    assert result.status == "completed", result.error
    ours = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks[1::2], marks[2::2])]  # epochs 2..N
    pairs = list(zip(ours, plain_times[1:]))
    print(f"mnist, interleaved: {steps_per_epoch(cfg)} steps an epoch, {cfg.train.epochs} geocont epochs with a plain "
          f"epoch after each, one thread; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    for k, ((gw, gc), (pw, pc)) in enumerate(pairs, 2):
        print(f"  epoch {k}: plain {pc:6.2f} s cpu, geocont {gc:6.2f}: ratio wall {gw / pw:.3f} cpu {gc / pc:.3f}")
    wall = statistics.median(g[0] / p[0] for g, p in pairs)
    cpu = statistics.median(g[1] / p[1] for g, p in pairs)
    print(f"steady-state epoch ratio (median of {len(pairs)} adjacent pairs) wall {wall:.3f}  cpu {cpu:.3f}"
          "   (target <= 1.10)")  # fmt: skip


def steps_per_epoch(cfg) -> int:
    dm = build_datamodule(cfg)
    dm.setup()
    return len(dm.train_dataloader())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="digits", choices=["digits", "mnist"])
    parser.add_argument("--data-path", default=str(ROOT.parent / "shared" / "mnist"))
    parser.add_argument("--epochs", type=int, default=None, help="default: 30 on digits, 3 on MNIST")
    parser.add_argument("--repeats", type=int, default=2, help="plain / geocont pairs, alternated")
    parser.add_argument("--wandb", default="disabled", choices=["disabled", "offline"])
    parser.add_argument("--no-processes", action="store_true", help="MNIST: skip the whole-process comparison")
    parser.add_argument("--processes-only", action="store_true", help="MNIST: only the whole-process comparison")
    parser.add_argument(
        "--interleaved", action="store_true", help="MNIST: one geocont run with a plain epoch after each of its epochs"
    )
    parser.add_argument("--plain-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plain-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    epochs = args.epochs or (30 if args.data == "digits" else 3)
    torch.set_num_threads(1)
    if args.plain_process:
        plain_process(args.data_path, epochs, args.plain_out)
        return
    if args.data == "mnist" and args.processes_only:
        processes(args.data_path, epochs, args.repeats)
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
    if args.data == "digits":
        digits(cfg, timers, args.repeats)
        return
    if args.interleaved:
        interleaved(cfg)
        return
    mnist(cfg, timers, args.repeats)
    if not args.no_processes:
        processes(args.data_path, epochs, args.repeats)


if __name__ == "__main__":
    main()
