"""GPU smoke: geocont's training on one CUDA device, timed, and checked against the same config on the CPU.

Every training part is `geocont.train.train(cfg, store)` with a config built as `geocont train PRESET --set ...`
builds it (a preset plus dotted overrides), read back from the store (run.json, metrics.parquet):

    mlp-fp32            the paper MLP (16 x 256) on MNIST, fp32
    mlp-bf16            the same, bf16-mixed
    mlp-fp16            the same, 16-mixed (fp16 with a GradScaler), against the fp32 run on the CPU: Lightning
                        has no fp16 autocast on a CPU
    transformer-smoke   the preset as it is (20 steps)
    paper-transformer   the paper's 33.7M model (BPE 8192, bf16-mixed) for 200 steps on the stdlib corpus
    ray                 4 paper-MLP trials at `resources: {cpu: 1, gpu: 0.25}` through `geocont sweep launch`
                        on an embedded Ray, against the mlp-fp32 run as the one-trial reference
    pack                packed trials (`geocont.pack.train_pack`): K = 1, 8, 12, 32, 64 paper-MLP members on the
                        workload of sweeps/mlp_full_grid.yaml (digits, 30 epochs = 720 steps, every metric every
                        epoch), trial-steps/s for each K; the grid's wall time on one GPU extrapolated from its
                        own packs (30 shapes x 12 members: init scale x beta2 x seeds); and a K = 2 pack on the
                        GPU against each member's solo run on the CPU

For each training part it prints steps/s of a timed run on the GPU, its peak GPU memory, the share of the run's
wall time spent computing geometry metrics, and whether a short run of the same config (`match_steps`) ends at
the same final values on the GPU and on the CPU: |gpu - cpu| <= tol * max(1, |cpu|) for every final value both
runs logged (losses, accuracy or perplexity, every continuity metric), with tol 2e-3 in fp32 and 5e-2 in bf16.

    python benchmarks/gpu_smoke.py --mnist DIR [--json FILE] [--parts mlp-fp32,ray]
    GPU_SMOKE_ALLOW_CPU=1 python benchmarks/gpu_smoke.py --parts mlp-fp32   # the tiny CPU dry run

Without a CUDA device it refuses to run unless GPU_SMOKE_ALLOW_CPU=1 is set; then every part runs a few steps
of a shrunken config on the CPU ("GPU" runs included): a check of the plumbing, not a measurement.
benchmarks/gpu_smoke.sh runs it on the GPU machine with the packages that travel to it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from geocont import store
from geocont.config import parse_overrides, resolve
from geocont.lit import callbacks
from geocont.pack import train_pack
from geocont.train import train

ROOT = Path(__file__).resolve().parents[1]
# Timed runs track as a user's run does by default; the comparison runs track nothing (it changes no result).
TRACKING = ("tracking.wandb.mode=offline", "tracking.tensorboard=true")
NO_TRACKING = ("tracking.wandb.mode=disabled", "tracking.tensorboard=false")


@dataclass(frozen=True)
class Part:
    name: str
    preset: str
    sets: tuple[str, ...]  # `--set` overrides, as the CLI takes them
    timed_steps: int  # the GPU run whose speed is reported
    match_steps: int  # the GPU and CPU runs whose final values are compared
    tol: float
    budget_s: float  # this part's share of the 8 minutes on an H200 (an estimate; the output says how it went)
    dry_sets: tuple[str, ...] = ()  # what the CPU dry run adds to keep it to seconds
    cpu_sets: tuple[str, ...] = ()  # what a run on the CPU (the reference, every dry run) adds


@dataclass
class Outcome:
    part: str
    device: str = ""
    steps: int = 0
    steps_per_s: float = 0.0
    wall_s: float = 0.0
    gpu_peak_mib: float | None = None
    metrics_share: float | None = None
    metrics_source: str = ""
    match: bool | None = None
    compared: int = 0
    worst: str = ""
    notes: list[str] = field(default_factory=list)


# The MLP parts read MNIST from --mnist (two epochs: 2 x 938 steps); each run's device is set by `config`.
DRY_MLP = ("model.depth=4", "model.width=32")
PARTS = {
    "mlp-fp32": Part("mlp-fp32", "paper-mlp", ("train.precision=32",), 1876, 100, 2e-3, 60, DRY_MLP),
    "mlp-bf16": Part("mlp-bf16", "paper-mlp", ("train.precision=bf16-mixed",), 1876, 100, 5e-2, 60, DRY_MLP),
    "mlp-fp16": Part(
        "mlp-fp16", "paper-mlp", ("train.precision=16-mixed",), 938, 100, 5e-2, 30, DRY_MLP, ("train.precision=32",)
    ),
    "transformer-smoke": Part("transformer-smoke", "transformer-smoke", (), 20, 20, 2e-3, 30),
    "paper-transformer": Part(
        "paper-transformer",
        "paper-transformer",
        ("data.name=stdlib", "data.val_fraction=0.02"),
        200,
        4,
        5e-2,
        120,  # BPE training on the corpus, 200 GPU steps, 4 CPU steps of the 33.7M model
        # Shrunk for a CPU: 2 x 64, byte tokens (no BPE training), short sequences.
        (
            "model.depth=2",
            "model.width=64",
            "model.heads=2",
            "model.kv_heads=2",
            "model.mlp_width=128",
            "data.tokenizer=bytes",
            "data.seq_len=64",
            "train.batch_size=4",
        ),
    ),  # fmt: skip
}
RAY_TRIALS, RAY_GPU_SHARE, RAY_BUDGET_S = 4, 0.25, 90


# ---------------------------------------------------------------------------------------------
# One run through geocont's public entry point


class MetricTimer:
    """Seconds spent in the geometry monitor's hooks: the fallback when run.json has no `metrics_s`."""

    HOOKS = ("on_before_optimizer_step", "emit")

    def __init__(self):
        self.seconds = 0.0
        self.available = all(hasattr(callbacks.GeometryMonitor, name) for name in self.HOOKS)
        if self.available:
            for name in self.HOOKS:
                hook = getattr(callbacks.GeometryMonitor, name)
                hook = getattr(hook, "untimed", hook)  # a second timer (a second main()) replaces the first
                setattr(callbacks.GeometryMonitor, name, self._timed(hook))

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        wrapper.untimed = fn
        return wrapper


def config(part: Part, steps: int, accelerator: str, args: argparse.Namespace, tracking=NO_TRACKING):
    sets = [*part.sets, *tracking, f"train.max_steps={steps}", f"train.accelerator={accelerator}"]
    if part.preset == "paper-mlp":
        sets += ["data.name=mnist", f"data.path={args.mnist}"] if args.mnist else ["data.name=digits"]
    if args.dry:
        sets += part.dry_sets
    if accelerator == "cpu":
        sets += part.cpu_sets
    return resolve({"preset": part.preset}, parse_overrides(sets))


def run(cfg, store_dir: Path, timer: MetricTimer) -> tuple[dict, dict[str, float], float]:
    """Train once; (run.json, final values, seconds in metric hooks)."""
    cuda = cfg.train.accelerator == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timer.seconds = 0.0
    result = train(cfg, store_dir, sweep="gpu-smoke", progress=False)
    info = store.read_run_info(store_dir, "gpu-smoke", result.run_id) or {}
    if result.status != "completed":
        raise RuntimeError(f"{result.status}: {result.error}")
    if cuda:
        torch.cuda.synchronize()
    return info, dict(result.final), timer.seconds


def device_of(info: dict, cuda: bool) -> str:
    if "device" in info:
        return str(info["device"])
    if cuda and torch.cuda.max_memory_allocated() > 0:
        return "cuda (run.json has no 'device'; inferred from GPU memory use)"
    return "cpu" if not cuda else "unknown"


def compare(gpu: dict[str, float], cpu: dict[str, float], tol: float) -> tuple[bool, int, str]:
    """Every final value both runs logged, within tol * max(1, |cpu|); (all within, how many, the worst)."""
    names = sorted(set(gpu) & set(cpu) - {"epoch"})
    worst, worst_ratio = "", -1.0
    for name in names:
        a, b = gpu[name], cpu[name]
        ratio = abs(a - b) / (tol * max(1.0, abs(b))) if a == a and b == b else float("inf")  # NaN never matches
        if ratio > worst_ratio:
            worst, worst_ratio = f"{name}: gpu {a:.6g} cpu {b:.6g}", ratio
    return bool(names) and worst_ratio <= 1.0, len(names), worst


def training_part(part: Part, args: argparse.Namespace, timer: MetricTimer, scratch: Path) -> Outcome:
    gpu = "cpu" if args.dry else "cuda"
    timed_steps = args.dry_steps if args.dry else part.timed_steps
    match_steps = min(part.match_steps, timed_steps)
    out = Outcome(part.name)

    info, final, hook_s = run(config(part, timed_steps, gpu, args, TRACKING), scratch / "timed", timer)
    duration = float(info.get("duration_s") or 0.0)
    out.device, out.steps, out.wall_s = device_of(info, gpu == "cuda"), int(info.get("steps", 0)), duration
    out.steps_per_s = out.steps / duration if duration else 0.0
    if gpu == "cuda":
        out.gpu_peak_mib = torch.cuda.max_memory_allocated() / 2**20
        if not out.device.startswith("cuda"):
            raise RuntimeError(f"{part.name}: asked for cuda, ran on {out.device}")
    if "metrics_s" in info:
        out.metrics_share, out.metrics_source = float(info["metrics_s"]) / duration, "run.json metrics_s"
    elif timer.available:
        out.metrics_share, out.metrics_source = hook_s / duration, "timed GeometryMonitor hooks"
    else:
        out.metrics_source = "n/a (no metrics_s in run.json, monitor hooks renamed)"

    gpu_final = final
    if match_steps != timed_steps:
        _, gpu_final, _ = run(config(part, match_steps, gpu, args), scratch / "match-gpu", timer)
    _, cpu_final, _ = run(config(part, match_steps, "cpu", args), scratch / "match-cpu", timer)
    out.match, out.compared, out.worst = compare(gpu_final, cpu_final, part.tol)
    out.notes.append(f"compared after {match_steps} steps, tol {part.tol:g}")
    return out


# ---------------------------------------------------------------------------------------------
# Ray: 4 trials sharing one GPU through `geocont sweep launch`


def ray_part(args: argparse.Namespace, scratch: Path) -> Outcome:
    steps = args.dry_steps if args.dry else PARTS["mlp-fp32"].timed_steps
    data = {"name": "mnist", "path": str(Path(args.mnist).resolve())} if args.mnist else {"name": "digits"}
    base = {
        "preset": "paper-mlp",
        "data": data,
        "train": {"max_steps": steps, "precision": "32"},
        "tracking": {"wandb": {"mode": "offline"}, "tensorboard": True},
    }
    if args.dry:
        base["model"] = {"depth": 4, "width": 32}
    sweep = {
        "name": "gpu-smoke-ray",
        "base": base,
        "seeds": list(range(RAY_TRIALS)),
        "resources": {"cpu": 1, "gpu": 0 if args.dry else RAY_GPU_SHARE},
        "retries": 0,
    }
    path, store_dir = scratch / "ray.yaml", scratch / "ray-store"
    scratch.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sweep))  # JSON is YAML
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "geocont.cli", "sweep", "launch", str(path), "--store", str(store_dir)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    infos = store.list_run_infos(store_dir, "gpu-smoke-ray")
    out = Outcome("ray", wall_s=wall, steps=sum(int(i.get("steps", 0)) for i in infos))
    out.notes.append(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no output)")
    completed = [i for i in infos if i.get("status") == "completed"]
    if done.returncode != 0 or len(completed) != RAY_TRIALS:
        problem = f"sweep exit {done.returncode}, {len(completed)}/{RAY_TRIALS} trials completed"
        raise RuntimeError(f"{problem}: {done.stderr[-2000:]}")
    out.steps_per_s = out.steps / wall
    out.device = ", ".join(sorted({str(i.get("device", "?")) for i in completed}))
    per_trial = [i["steps"] / i["duration_s"] for i in completed if i.get("duration_s")]
    out.notes.append(
        f"{RAY_TRIALS} trials: {out.steps_per_s:.1f} trial-steps/s over the launch's {wall:.1f} s (Ray start-up "
        f"included); each trial {min(per_trial):.1f}-{max(per_trial):.1f} steps/s inside train()"
    )
    return out


# ---------------------------------------------------------------------------------------------


def report(outcomes: list[Outcome]) -> str:
    head = f"{'part':18} {'device':10} {'steps':>6} {'steps/s':>8} {'GPU MiB':>8} {'metrics':>8}  CPU match"
    lines = [head, "-" * len(head)]
    for o in outcomes:
        mem = f"{o.gpu_peak_mib:8.0f}" if o.gpu_peak_mib is not None else f"{'-':>8}"
        share = f"{o.metrics_share:8.1%}" if o.metrics_share is not None else f"{'-':>8}"
        verdict = "-" if o.match is None else ("yes" if o.match else "NO") + f" ({o.compared} values; {o.worst})"
        lines.append(f"{o.part:18} {o.device[:10]:10} {o.steps:6d} {o.steps_per_s:8.1f} {mem} {share}  {verdict}")
        lines += [f"{'':18} {note}" for note in o.notes]
    by_name = {o.part: o for o in outcomes}
    one, four = by_name.get("mlp-fp32"), by_name.get("ray")
    if one and four and one.steps_per_s and four.steps_per_s:
        lines.append(
            f"paper MLP: one trial {one.steps_per_s:.1f} steps/s; {RAY_TRIALS} trials at gpu {RAY_GPU_SHARE:g} "
            f"through Ray {four.steps_per_s:.1f} trial-steps/s ({four.steps_per_s / one.steps_per_s:.2f}x one trial)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Packed trials: K members as one batched model on one GPU

PACK_KS = (1, 8, 12, 32, 64)  # 12: a pack of sweeps/mlp_full_grid.yaml (its free fields per shape)
GRID_TRIALS, GRID_PACKS, GRID_STEPS = 360, 30, 720  # mlp_full_grid: 2 x 5 x 3 shapes, 12 members each, 30 x 24
PACK_BUDGET_S = 120


def pack_members(K: int, steps: int, accelerator: str, args: argparse.Namespace) -> list:
    """K grid-like members of one shape: seeds, init scales and learning rates differ (all free in a pack)."""
    sets = [*NO_TRACKING, f"train.max_steps={steps}", f"train.accelerator={accelerator}", "data.name=digits"]
    if args.dry:
        sets += DRY_MLP
    return [
        resolve(
            {"preset": "paper-mlp"},
            parse_overrides(
                [
                    *sets,
                    f"train.seed={k}",
                    f"optim.lr={1e-3 * (1 + k % 4)}",
                    f"model.init_std={'1.0e-4' if k % 2 else 'null'}",
                ]
            ),  # fmt: skip
        )
        for k in range(K)
    ]


def pack_part(args: argparse.Namespace, scratch: Path) -> Outcome:
    gpu = "cpu" if args.dry else "cuda"
    steps = args.dry_steps if args.dry else GRID_STEPS
    out, rates = Outcome("pack", device=gpu), {}
    for K in (1, 2) if args.dry else PACK_KS:
        results = train_pack(pack_members(K, steps, gpu, args), scratch / f"k{K}", "gpu-smoke-pack")
        if any(r.status != "completed" for r in results):
            raise RuntimeError(f"K={K}: {[r.status for r in results]}")
        info = store.read_run_info(scratch / f"k{K}", "gpu-smoke-pack", results[0].run_id) or {}
        seconds = max(float(info["duration_s"]), 1e-3)  # run.json rounds to the millisecond
        rates[K] = K * int(info["steps"]) / seconds  # the pack's steps, K trial-steps each
        out.notes.append(f"K={K:2d}: {rates[K]:8.1f} trial-steps/s ({float(info['duration_s']):.1f} s a pack)")
    best = max(rates, key=rates.get)
    out.steps, out.steps_per_s = steps, rates[best]
    if not args.dry:
        out.gpu_peak_mib = torch.cuda.max_memory_allocated() / 2**20
    grid_min = GRID_PACKS * 12 * GRID_STEPS / rates.get(12, rates[best]) / 60
    solo_min = GRID_TRIALS * GRID_STEPS / rates[1] / 60
    out.notes.append(
        f"sweeps/mlp_full_grid.yaml ({GRID_TRIALS} trials as {GRID_PACKS} packs of 12), one pack after another "
        f"on this GPU: ~{grid_min:.1f} min; one trial after another (K=1): ~{solo_min:.1f} min"
    )
    out.match, out.compared, out.worst = pack_matches_solo(args, gpu, scratch)
    out.notes.append("a K=2 pack on the GPU against each member's solo run on the CPU, tol 0.002")
    return out


def pack_matches_solo(args: argparse.Namespace, gpu: str, scratch: Path) -> tuple[bool, int, str]:
    """Each member of a K=2 pack trained on the GPU against its solo run on the CPU (compare's rule)."""
    members = pack_members(2, args.dry_steps if args.dry else 100, gpu, args)
    packed = train_pack(members, scratch / "match-gpu", "gpu-smoke-pack")
    outcomes = []
    for cfg, result in zip(members, packed):
        on_cpu = cfg.model_copy(update={"train": cfg.train.model_copy(update={"accelerator": "cpu"})})
        solo = train(on_cpu, scratch / "match-cpu", sweep="gpu-smoke-pack", progress=False)
        outcomes.append(compare(dict(result.final), dict(solo.final), 2e-3))
    failed = [o for o in outcomes if not o[0]]
    return not failed, sum(o[1] for o in outcomes), (failed or outcomes)[0][2]


EXTRA_PARTS = {"ray": (ray_part, RAY_BUDGET_S), "pack": (pack_part, PACK_BUDGET_S)}  # name -> (run, budget s)
# Most needed first: --json is rewritten after every part, so a run cut short by its time limit keeps these.
DEFAULT_ORDER = ("mlp-fp32", "pack", "mlp-fp16", "mlp-bf16", "ray", "transformer-smoke", "paper-transformer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mnist", help="folder of MNIST's IDX files (.gz); without it the MLP parts use digits")
    parser.add_argument("--parts", default=",".join(DEFAULT_ORDER), help="comma-separated parts to run")
    parser.add_argument("--json", type=Path, help="write the results here after every part")
    parser.add_argument("--dry-steps", type=int, default=12, help="steps of every run in the CPU dry run")
    args = parser.parse_args(argv)
    args.dry = not torch.cuda.is_available()
    if args.dry and os.environ.get("GPU_SMOKE_ALLOW_CPU") != "1":
        print("gpu_smoke: no CUDA device; set GPU_SMOKE_ALLOW_CPU=1 for the CPU dry run", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    unknown = set(names) - {*PARTS, *EXTRA_PARTS}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {[*PARTS, *EXTRA_PARTS]}")
    if args.dry:
        print(f"gpu_smoke: CPU dry run ({args.dry_steps} steps a run, shrunken configs): plumbing, not timings")
    else:
        print(f"gpu_smoke: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")

    timer, outcomes, status = MetricTimer(), [], 0
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as scratch:
        os.environ.setdefault("GEOCONT_CACHE", str(Path(scratch) / "cache"))  # one BPE for all of a part's runs
        for name in names:
            t0 = time.perf_counter()
            folder = Path(scratch) / name
            try:
                if name in EXTRA_PARTS:
                    outcome = EXTRA_PARTS[name][0](args, folder)
                else:
                    outcome = training_part(PARTS[name], args, timer, folder)
            except Exception as err:  # one broken part must not hide the others' numbers
                outcome, status = Outcome(name, notes=[f"FAILED: {type(err).__name__}: {err}"[:2000]]), 1
            took = time.perf_counter() - t0
            budget = EXTRA_PARTS[name][1] if name in EXTRA_PARTS else PARTS[name].budget_s
            over = "" if took <= budget or args.dry else "  OVER BUDGET"
            outcome.notes.append(f"part took {took:.1f} s of its {budget:.0f} s budget{over}")
            outcomes.append(outcome)
            print(f"[{name}] done in {took:.1f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    print(report(outcomes))
    if any(o.match is False for o in outcomes):
        status = status or 3
    return status


if __name__ == "__main__":
    sys.exit(main())
