"""`geocont sweep launch --set`: scaling a shipped sweep with one override, and its bad input."""

import subprocess
import sys
from pathlib import Path

import pytest

from geocont.sweep.grid import expand
from geocont.sweep.load import sweep_from_text, with_overrides

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def test_the_paper_transformer_sweep_scales_to_the_paper_preset_with_one_override():
    scale = ["base.preset=paper-transformer", "name=paper-transformer-gpu", "resources.gpu=1"]
    sweep, text = with_overrides(SWEEPS / "paper_transformer.yaml", scale)
    trials = expand(sweep)
    assert sweep.name == "paper-transformer-gpu" and sweep.resources.gpu == 1
    assert len(trials) == 6
    assert {t.config.model.width for t in trials} == {512}
    assert {t.config.data.name for t in trials} == {"wikitext103"}
    # what is recorded as launched resumes to the same trials
    assert [t.run_id for t in expand(sweep_from_text(text, "stored"))] == [t.run_id for t in trials]


@pytest.mark.parametrize(
    "pair, message",
    [
        ("grid.model.depth=[2]", "--set grid: not settable from the command line; allowed: name, base"),
        ("resources.cpu=-1", "resources.cpu"),
        ("base.model.activation=swish", "allowed: 'relu'"),
        ("seeds", "expected dotted.path=value"),
    ],
)
def test_bad_overrides_exit_2_and_write_nothing(tmp_path, pair, message):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "geocont.cli", "sweep", "launch", str(SWEEPS / "smoke.yaml"), "--set", pair]
    cmd += ["--store", str(store)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not store.exists()
