"""A whole sweep on Ray vs the ideal: the same trials as plain PyTorch loops, spread perfectly over the cores.

    python benchmarks/bench_sweep.py [--sweep sweeps/paper_mlp.yaml] [--epochs N] [--all-seeds]

Reference: each distinct config of the sweep trained by bench_train's plain loop (same model, data,
optimizer, per-epoch validation; one thread, in this process), times the number of seeds (seeds do
not change the work; --all-seeds times every trial). Ideal = sum / cores. Then the sweep itself runs
exactly as `geocont sweep launch` does (embedded Ray, one CPU per trial) into a throwaway store.

Prints: ratio = sweep wall / ideal (target <= 1.3), Ray start-up, train()'s own overhead (run.json
durations vs plain), what is left per trial (scheduling, worker start-up, reporting), and the sweep
against its own trials' train() time spread over the cores: the orchestrator's share alone. The cores
may be shared with other work: the load average is printed beside the numbers, and the plain loops
are also timed on a pool of processes, which meets the same contention as the sweep.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import plain_loop  # noqa: E402

from geocont import store  # noqa: E402
from geocont.sweep.grid import expand  # noqa: E402
from geocont.sweep.launch import run_sweep  # noqa: E402
from geocont.sweep.load import load_sweep, parse_sweep  # noqa: E402

ROOT = Path(__file__).parents[1]


def sweep_file(path: Path, epochs: int | None, folder: Path) -> Path:
    """The sweep to measure, with the epochs overridden when asked, written where the store lives."""
    data = yaml.safe_load(path.read_text())
    if epochs is not None:
        data["base"].setdefault("train", {})["epochs"] = epochs
    out = folder / path.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def reference(trials, all_seeds: bool) -> tuple[float, float]:
    """(wall, cpu) of the plain loops: every trial, or one seed per config scaled by the seed count."""
    torch.set_num_threads(1)
    chosen = trials if all_seeds else [t for t in trials if t.config.train.seed == trials[0].config.train.seed]
    scale = len(trials) / len(chosen)
    wall = cpu = 0.0
    for t in chosen:
        w, c = plain_loop(t.config)
        wall, cpu = wall + w, cpu + c
        print(f"  plain {t.name:40s} {w:6.2f} s wall  {c:6.2f} s cpu", flush=True)
    return wall * scale, cpu * scale


def _plain(config: dict) -> float:
    """One trial's plain loop in a pool worker (configs cross the process boundary as dicts)."""
    from geocont.config import RunConfig

    torch.set_num_threads(1)
    return plain_loop(RunConfig.model_validate(config))[0]


def parallel_reference(trials, cores: int) -> float:
    """Wall time of every trial's plain loop on a pool of `cores` processes: the ideal under the same contention."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(cores) as pool:
        pool.map(_plain, [trials[0].config.to_dict()] * cores)  # warm-up: imports and a first run
        t0 = time.perf_counter()
        pool.map(_plain, [t.config.to_dict() for t in trials], chunksize=1)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, default=ROOT / "sweeps" / "paper_mlp.yaml")
    parser.add_argument("--epochs", type=int, default=None, help="override base.train.epochs (quick runs)")
    parser.add_argument("--all-seeds", action="store_true", help="time every trial's plain loop, not one seed")
    args = parser.parse_args()
    cores = os.cpu_count()

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        path = sweep_file(args.sweep, args.epochs, Path(tmp))
        sweep = load_sweep(path)
        trials = expand(sweep)
        print(f"{sweep.name}: {len(trials)} trials, {cores} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
        plain_wall, plain_cpu = reference(trials, args.all_seeds)
        ideal = plain_wall / cores
        pool_wall = parallel_reference(trials, cores)

        store_dir = Path(tmp) / "store"
        t0 = time.perf_counter()
        outcome = run_sweep(parse_sweep(yaml.safe_load(path.read_text())), path.read_text(), store_dir)
        wall = time.perf_counter() - t0
        assert outcome.counts.get("completed") == len(trials), outcome.counts
        durations = [info["duration_s"] for info in store.list_run_infos(store_dir, sweep.name)]

    slots = len(trials) / cores  # trials per core, if spread perfectly
    train_total = sum(durations)
    per_trial = (wall - outcome.ray_start_s) / slots - train_total / len(trials)
    print(f"plain PyTorch, all trials     {plain_wall:7.1f} s wall  {plain_cpu:7.1f} s cpu  -> ideal {ideal:.1f} s")
    print(f"sweep on Ray (wall)           {wall:7.1f} s   load average now {os.getloadavg()[0]:.1f}")
    print(f"ratio sweep / ideal           {wall / ideal:7.3f}   (target <= 1.3)")
    print(f"plain loops on {cores} processes   {pool_wall:7.1f} s   -> ratio sweep / that {wall / pool_wall:.3f}")
    print(f"Ray start-up                  {outcome.ray_start_s:7.1f} s")
    share = train_total / plain_wall
    print(f"train() inside trials         {train_total:7.1f} s = {share:.3f} x plain (Lightning, metrics)")
    print(f"left per trial (Ray/Tune)     {per_trial:7.2f} s   (worker start-up, imports, scheduling, reporting)")
    print(f"sweep / (train() time / {cores})  {wall / (train_total / cores):7.3f}   (the orchestrator's own overhead)")


if __name__ == "__main__":
    main()
