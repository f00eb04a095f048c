import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from geocont.cli import app

runner = CliRunner()
TRACKING_OFF = ["--set", "tracking.wandb.mode=disabled", "--set", "tracking.tensorboard=false"]


def geocont(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "geocont.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize(
    "command", [[], ["train"], ["list"], ["results"], ["results", "runs"], ["results", "table"]], ids=" ".join
)
def test_help(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_train_a_preset_then_query_the_store(tmp_path):
    store = tmp_path / "store"
    done = geocont("train", "smoke", "--store", str(store), "--no-progress", *TRACKING_OFF)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("completed: run ")
    assert "weight/v1_continuity" in done.stdout
    runs = geocont("results", "runs", "--store", str(store), "--format", "json")
    rows = json.loads(runs.stdout)
    assert len(rows) == 1 and rows[0]["status"] == "completed" and rows[0]["sweep"] == "single"
    table = geocont("results", "table", "--store", str(store))
    assert table.returncode == 0 and "weight/v1_continuity" in table.stdout


def test_train_a_yaml_file_with_overrides(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("preset: smoke\nmodel: {depth: 3, width: 8}\ntrain: {epochs: 1}\n")
    done = geocont(
        "train",
        str(config),
        "--set",
        "model.activation=radial",
        "--store",
        str(tmp_path / "s"),
        "--no-progress",
        *TRACKING_OFF,
    )
    assert done.returncode == 0, done.stderr
    written = next((tmp_path / "s" / "single").glob("*/config.yaml")).read_text()
    assert "activation: radial" in written and "depth: 3" in written


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "missing.yaml"], "CONFIG: 'missing.yaml' is neither a file nor a preset"),
        (["train", "smoke", "--set", "model.activation=swish"], "model.activation: got 'swish'; allowed:"),
        (["train", "smoke", "--set", "model.depth=-2"], "model.depth: input should be greater than or equal to 2"),
        (["train", "smoke", "--set", "model.colour=red"], "model.colour: unknown key"),
        (["train", "smoke", "--set", "optim.lr=fast"], "optim.lr: input should be a valid number"),
        (["train", "smoke", "--set", "data.name=mnist", "--set", "data.path=/nowhere"], "data.path: /nowhere"),
        (["results", "runs"], "is not a results store"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v)[:40],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    store = tmp_path / "store"
    done = geocont(*args, "--store", str(store), cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not store.exists()


def test_list_shows_presets():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0 and "paper-mlp" in result.output and "smoke" in result.output
