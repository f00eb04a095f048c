"""A whole sweep with `resources.pack: K` against the same sweep with pack 1, alternated, same trials.

    python benchmarks/bench_pack_sweep.py [--sweep sweeps/paper_mlp.yaml] [--pack 3] [--epochs N] [--repeats 1]

Each repeat runs the sweep twice (pack 1, then pack K; the order flips on every other repeat), each
exactly as `geocont sweep launch` does (embedded Ray, one CPU per trial or pack) into a throwaway
store. Prints the wall ratio pack K / pack 1 per repeat (target for paper_mlp.yaml, pack 3, on 2
cores: <= 0.80) and the largest difference, over every member and every final metric, between the
two stores (packing must not change a result: fp32 tolerance). The load average is printed beside it.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import yaml

from geocont import store
from geocont.sweep.launch import run_sweep
from geocont.sweep.load import parse_sweep

ROOT = Path(__file__).parents[1]


def sweep_text(path: Path, pack: int, epochs: int | None) -> str:
    data = yaml.safe_load(path.read_text())
    data.setdefault("resources", {})["pack"] = pack
    data["tracking"] = {"wandb": {"mode": "disabled"}, "tensorboard": False}  # the same for both: not measured
    if epochs is not None:
        data["base"].setdefault("train", {})["epochs"] = epochs
    return yaml.safe_dump(data, sort_keys=False)


def run(text: str, store_dir: Path) -> float:
    t0 = time.perf_counter()
    outcome = run_sweep(parse_sweep(yaml.safe_load(text)), text, store_dir)
    wall = time.perf_counter() - t0
    assert outcome.counts.get("completed") == outcome.total, outcome.counts
    return wall


def finals(store_dir: Path, sweep: str) -> dict[str, dict[str, float]]:
    frame = store.runs(store_dir, sweep).collect()
    names = [c for c in frame.columns if "/" in c]
    return {row["run_id"]: {n: row[n] for n in names} for row in frame.iter_rows(named=True)}


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), "the two stores hold different runs"
    worst = 0.0
    for run_id, values in a.items():
        for name, value in values.items():
            other = b[run_id][name]
            if value is None or other is None or (math.isnan(value) and math.isnan(other)):
                continue
            worst = max(worst, abs(value - other))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, default=ROOT / "sweeps" / "paper_mlp.yaml")
    parser.add_argument("--pack", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help="override base.train.epochs (quick runs)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    name = yaml.safe_load(args.sweep.read_text())["name"]
    print(f"{name}: pack {args.pack} vs pack 1, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    ratios = []
    for repeat in range(args.repeats):
        order = (1, args.pack) if repeat % 2 == 0 else (args.pack, 1)
        walls, results = {}, {}
        for pack in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-pack{pack}-") as tmp:
                walls[pack] = run(sweep_text(args.sweep, pack, args.epochs), Path(tmp))
                results[pack] = finals(Path(tmp), name)
            print(
                f"  repeat {repeat}: pack {pack:2d}  {walls[pack]:7.1f} s   load {os.getloadavg()[0]:.1f}", flush=True
            )
        ratios.append(walls[args.pack] / walls[1])
        diff = largest_difference(results[1], results[args.pack])
        print(f"  repeat {repeat}: pack {args.pack} / pack 1 = {ratios[-1]:.3f} wall; largest difference {diff:.2e}")
    print(f"ratio pack {args.pack} / pack 1: {', '.join(f'{r:.3f}' for r in ratios)} (target <= 0.80)")


if __name__ == "__main__":
    main()
