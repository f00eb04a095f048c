"""`geocont report` on a store the size of the full MLP grid (target: <= 10 s), and the HTML size.

Writes a synthetic store with geocont.store's writer functions: one run per trial of
sweeps/mlp_full_grid.yaml (120 configs x 3 seeds = 360 runs, 30 epochs of every MLP metric each),
then times, in this order:
  - the reference: reading the store with polars alone (store.runs + store.metrics, collected),
  - the report in this process (build + write), split into load / figures / HTML,
  - `geocont report` as a user runs it: a fresh process, imports included.
Prints each time, its ratio to the store read, the ratio to the 10 s target, and the HTML size.

    python benchmarks/bench_report.py [--sweep sweeps/mlp_full_grid.yaml] [--epochs 30] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic store writer shared with the tests

from synthetic_store import write_run  # noqa: E402

from geocont import store  # noqa: E402
from geocont.sweep.grid import expand  # noqa: E402
from geocont.sweep.load import load_sweep  # noqa: E402

TARGET_S = 10.0


def write_store(root: Path, sweep_file: Path, epochs: int | None) -> tuple[str, int]:
    sweep = load_sweep(sweep_file)
    trials = expand(sweep)
    store.record_spec(root, sweep.name, sweep_file.read_text())
    for trial in trials:
        raw = trial.config.to_dict()
        if epochs is not None:
            raw["train"]["epochs"] = epochs
        write_run(root, sweep.name, raw)
    return sweep.name, len(trials)


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=ROOT / "sweeps" / "mlp_full_grid.yaml")
    parser.add_argument("--epochs", type=int, default=None, help="override the sweep's epochs")
    parser.add_argument("--keep", type=Path, default=None, help="write the store and report here and keep them")
    args = parser.parse_args()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="geocont-bench-report-"))
    root, html = folder / "store", folder / "report.html"
    if root.exists():
        shutil.rmtree(root)
    (name, n_runs), t_write = timed(write_store, root, args.sweep, args.epochs)
    print(f"store: {n_runs} runs of sweep {name!r} written in {t_write:.1f} s -> {root}")

    from geocont.report import Report, data, page
    from geocont.report.build import sweep_section

    def read_only():
        runs = store.runs(root).collect()
        long = store.metrics(root).collect()
        return runs.height, long.height

    (n, rows), t_read = timed(read_only)
    sweeps, t_load = timed(data.load_sweeps, root, None)
    sections, t_figs = timed(lambda: [sweep_section(s) for s in sweeps])
    report = Report("geocont report", page.subtitle(root, None), sections)
    _, t_bundle = timed(page.javascript_bundle)  # cached after the first call; a fresh process pays it once
    text, t_html = timed(report.html)
    html.write_text(text)
    t_inproc = t_load + t_figs + t_bundle + t_html

    cli = [str(Path(sys.executable).with_name("geocont")), "report", "--store", str(root), "-o", str(html)]
    done, t_cli = timed(subprocess.run, cli, None)
    if done.returncode != 0:
        raise SystemExit(f"geocont report failed: exit {done.returncode}")
    size = html.stat().st_size
    n_figs = sum(len(s.figures) for s in report.sections)

    print(f"runs {n}, metric rows {rows:,}, figures {n_figs}")
    print(f"reference: polars read of the store            {t_read:6.2f} s")
    print(f"report in-process: load {t_load:.2f} + figures {t_figs:.2f} + JS bundle {t_bundle:.2f} + HTML {t_html:.2f}"
          f" = {t_inproc:6.2f} s  ({t_inproc / t_read:.1f}x the read)")  # fmt: skip
    print(f"geocont report (fresh process, imports included) {t_cli:6.2f} s  ({t_cli / t_read:.1f}x the read)")
    print(f"target <= {TARGET_S:.0f} s: {t_cli / TARGET_S:.2f} of the budget ({'ok' if t_cli <= TARGET_S else 'OVER'})")
    print(f"HTML {size / 1e6:.2f} MB (JS bundle {len(page.javascript_bundle()) / 1e6:.2f} MB, "
          f"data + markup {(size - len(page.javascript_bundle())) / 1e6:.2f} MB) -> {html}")  # fmt: skip
    if args.keep is None:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
