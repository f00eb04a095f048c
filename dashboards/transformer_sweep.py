"""The transformer sweeps' wandb workspace and report, defined as code.

    python dashboards/transformer_sweep.py --entity ENTITY [--project geocont]
        [--sweep sweeps/paper_transformer.yaml] [--dry-run]

Sections (geocont.dashboard.sections("transformer")): per-projection v1 and u1 continuity of q, k, v,
o, gate, up and down vs step, per-projection Delta_GW and update ratio, perplexity and loss; runs
filtered to the sweep's wandb group and grouped by the keys its variants vary (mean line, stddev
band over seeds). The same as `geocont dashboard push SWEEP --entity ENTITY --project PROJECT`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from geocont.dashboard import DashboardSpec, build_report, build_workspace, run_script, spec_from_sweep_file

ROOT = Path(__file__).resolve().parents[1]
SWEEP_FILE = ROOT / "sweeps" / "paper_transformer.yaml"


def spec(sweep_file: Path = SWEEP_FILE) -> DashboardSpec:
    return spec_from_sweep_file(sweep_file)


def workspace(entity: str, project: str = "geocont", sweep_file: Path = SWEEP_FILE):
    return build_workspace(spec(sweep_file), entity, project)


def report(entity: str, project: str = "geocont", sweep_file: Path = SWEEP_FILE):
    return build_report(spec(sweep_file), entity, project)


if __name__ == "__main__":
    sys.exit(run_script(sys.argv[1:], SWEEP_FILE))
