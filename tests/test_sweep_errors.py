"""Bad sweep files: one clear line per problem naming the dotted path and what is allowed; exit 2; nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from geocont.config import ConfigError
from geocont.sweep.load import load_sweep

BASE = """\
name: bad
base:
  model: {kind: mlp, depth: 3, width: 16}
  data: {name: digits}
  train: {epochs: 1}
"""

# (id, sweep file text after the common base, substrings that one problem line must contain)
CASES = [
    ("not-yaml", "grid: {model.activation: [relu, gelu}\n", ["not valid YAML"]),
    ("not-a-mapping", None, ["expected a mapping"]),
    ("missing-name", "!drop-name", ["name: field required"]),
    ("bad-name", "!name my sweep", ["name: 'my sweep' is not usable as a folder name", "allowed: ASCII letters"]),
    ("reserved-name", "!name single", ["name: 'single' is reserved"]),
    (
        "unknown-top-key",
        "grids: {model.activation: [relu]}\n",
        ["grids: unknown key; allowed: name, base, grid, include", "search, resources"],
    ),
    ("unknown-axis", "grid: {model.activaton: [relu]}\n", ["grid.model.activaton: unknown key", "allowed under model"]),
    ("unknown-section", "grid: {modle.depth: [2]}\n", ["grid.modle: unknown key", "allowed under the top level"]),
    ("axis-not-list", "grid: {model.activation: relu}\n", ["grid.model.activation", "valid list"]),
    ("empty-axis", "grid: {model.activation: []}\n", ["grid.model.activation: empty axis"]),
    (
        "bad-grid-literal",
        "grid: {model.activation: [relu, swish]}\n",
        ["grid.model.activation: got 'swish'", "allowed"],
    ),
    ("wrong-grid-type", "grid: {model.depth: [2, deep]}\n", ["grid.model.depth", "valid integer", "'deep'"]),
    ("negative-grid-value", "grid: {optim.lr: [1.0e-3, -1]}\n", ["grid.optim.lr", "greater than 0"]),
    ("duplicate-axis-value", "grid: {model.init_std: [1.0e-4, 0.0001]}\n", ["grid.model.init_std", "more than once"]),
    ("seed-as-axis", "grid: {train.seed: [0, 1]}\n", ["grid.train.seed: seeds are not a grid axis"]),
    (
        "cross-field",
        "grid: {model.kind: [transformer]}\n",
        ["grid.model.kind: 'transformer' conflicts with the base", "'digits' is an image set"],
    ),
    ("empty-seeds", "seeds: []\n", ["seeds: empty"]),
    ("duplicate-seeds", "seeds: [0, 1, 1]\n", ["seeds: 1 listed more than once"]),
    ("negative-seed", "seeds: [0, -3]\n", ["seeds.1: -3 is negative"]),
    ("non-int-seed", "seeds: [0, one]\n", ["seeds.1", "valid integer"]),
    ("bad-base-value", "!base-depth -2", ["base.model.depth", "greater than or equal to 2"]),
    ("unknown-base-key", "!base-key", ["base.model.dept: unknown key; allowed under model: kind, depth"]),
    ("zero-cpu", "resources: {cpu: 0}\n", ["resources.cpu", "greater than 0"]),
    ("negative-gpu", "resources: {cpu: 1, gpu: -0.5}\n", ["resources.gpu", "greater than or equal to 0"]),
    ("fractional-gpu-above-one", "resources: {cpu: 1, gpu: 1.5}\n", ["resources.gpu: 1.5 per trial, but a trial"]),
    ("two-gpus-per-trial", "resources: {cpu: 1, gpu: 2}\n", ["resources.gpu: 2 per trial, but a trial trains on one"]),
    ("unknown-resource", "resources: {cpu: 1, memory: 4}\n", ["resources.memory: unknown key; allowed: cpu, gpu"]),
    ("bad-retries", "retries: -1\n", ["retries", "greater than or equal to 0"]),
    ("include-not-mapping", "include: [relu]\n", ["include.0", "valid dictionary"]),
    ("include-unknown-path", "include: [{model.activaton: gelu}]\n", ["include.0.model.activaton: unknown key"]),
    ("include-bad-value", "include: [{model.norm: batchnorm}]\n", ["include.0.model.norm: got 'batchnorm'"]),
    (
        "exclude-not-axis",
        "grid: {model.activation: [relu, gelu]}\nexclude: [{model.norm: none}]\n",
        ["exclude.0.model.norm: not a grid axis; axes: model.activation"],
    ),
    (
        "exclude-unknown-value",
        "grid: {model.activation: [relu, gelu]}\nexclude: [{model.activation: silu}]\n",
        ["exclude.0.model.activation: 'silu' is not a value of grid.model.activation (relu, gelu)"],
    ),
    (
        "exclude-everything",
        "grid: {model.activation: [relu]}\nexclude: [{model.activation: relu}]\n",
        ["exclude: removes every grid point"],
    ),
    ("bad-tracking", "tracking: {wandb: {mode: loud}}\n", ["tracking.wandb.mode: got 'loud'"]),
    (
        "pack-of-a-kind-without-packed-model",  # once found only inside the trial, for a kind set by an include
        "include: [{model.kind: transformer, data.name: stdlib}]\nresources: {cpu: 1, pack: 2}\n",
        ["resources.pack: 2, but model.kind 'transformer' has no packed model; allowed: 1"],
    ),
    (
        "pack-under-fp16-loss-scaling",  # a GradScaler's one scale cannot serve K members
        "grid: {train.precision: ['32', 16-mixed]}\nresources: {cpu: 1, pack: 2}\n",
        ["train.precision: '16-mixed' cannot be packed (fp16 loss scaling is per run)", "allowed in a pack: 32, bf16"],
    ),
    (
        "search-unknown-distribution",
        "!search optim.lr: {type: gaussian, low: 0.001, high: 0.1}",
        ["search.space.optim.lr.type: got 'gaussian'", "'float', 'int' or 'categorical'"],
    ),
    (
        "search-low-above-high",
        "!search optim.lr: {type: float, low: 0.1, high: 0.001}",
        ["search.space.optim.lr.low: 0.1 is not below high (0.001)"],
    ),
    (
        "search-log-nonpositive",
        "!search optim.beta2: {type: float, low: 0.0, high: 0.99, log: true}",
        ["search.space.optim.beta2.low: a log-scale range needs low > 0"],
    ),
    ("search-missing-range", "!search optim.lr: {type: float, low: 0.001}", ["search.space.optim.lr.high: missing"]),
    (
        "search-empty-choices",
        "!search model.activation: {type: categorical, choices: []}",
        ["search.space.model.activation.choices: missing or empty"],
    ),
    (
        "search-bad-choice",
        "!search model.activation: {type: categorical, choices: [relu, swish]}",
        ["search.space.model.activation: got 'swish'"],
    ),
    (
        "search-float-on-int-field",
        "!search model.depth: {type: float, low: 2, high: 8}",
        ["search.space.model.depth: an integer field; use type: int"],
    ),
    (
        "search-unknown-path",
        "!search model.dept: {type: int, low: 2, high: 8}",
        ["search.space.model.dept: unknown key"],
    ),
    (
        "search-unknown-metric",
        "!search-metric val/accuracy",
        ["search.metric: unknown metric 'val/accuracy'", "val/acc"],
    ),
    ("search-bad-mode", "!search-mode best", ["search.mode: got 'best'", "'min' or 'max'"]),
    ("search-zero-trials", "!search-trials 0", ["search.n_trials", "greater than 0"]),
    ("search-with-grid", "!search-grid", ["search: a search sweep takes no grid"]),
    ("search-many-seeds", "!search-seeds", ["seeds: a search runs each sampled config with one seed"]),
]


def _search(space: str = "optim.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}", **over: str) -> str:
    fields = {"metric": "val/acc", "mode": "max", "n_trials": "4", **over}
    head = "".join(f"  {k}: {v}\n" for k, v in fields.items())
    return f"search:\n{head}  space:\n    {space}\n"


def sweep_text(edit: str | None) -> str:
    """The valid base sweep with one edit applied (plain text appended, or a named '!' rewrite)."""
    if edit is None:
        return "- just\n- a list\n"
    specials = {
        "!drop-name": BASE.replace("name: bad\n", ""),
        "!base-depth -2": BASE.replace("depth: 3", "depth: -2"),
        "!base-key": BASE.replace("depth: 3", "dept: 3"),
        "!search-metric val/accuracy": BASE + _search(metric="val/accuracy"),
        "!search-mode best": BASE + _search(mode="best"),
        "!search-trials 0": BASE + _search(n_trials="0"),
        "!search-grid": BASE + "grid: {model.activation: [relu]}\n" + _search(),
        "!search-seeds": BASE + "seeds: [0, 1]\n" + _search(),
    }
    if edit in specials:
        return specials[edit]
    if edit.startswith("!name "):
        return BASE.replace("name: bad", f"name: {edit[6:]}")
    if edit.startswith("!search "):
        return BASE + _search(edit[8:])
    return BASE + edit


@pytest.mark.parametrize(("edit", "expected"), [(e, x) for _, e, x in CASES], ids=[c[0] for c in CASES])
def test_bad_sweep_names_path_and_allowed(tmp_path, edit, expected):
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_text(edit))
    with pytest.raises(ConfigError) as caught:
        load_sweep(path)
    lines = caught.value.problems
    assert any(all(part in line for part in expected) for line in lines), lines
    assert all("\n" not in line and line.startswith(str(path)) for line in lines)


def test_every_problem_is_reported_at_once(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "seeds: [1, 1]\nresources: {cpu: 1, gpu: 2.5}\n")
    with pytest.raises(ConfigError) as caught:
        load_sweep(path)
    assert len(caught.value.problems) == 2


def test_enough_kinds_of_mistakes_are_covered():
    assert len(CASES) >= 20


def test_cli_bad_sweep_exits_2_and_writes_nothing(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(BASE + "grid: {model.activation: [relu, swish]}\n")
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "geocont.cli", "sweep", "launch", str(path), "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {path}: grid.model.activation: got 'swish'; allowed: 'relu', 'gelu', 'silu', 'tanh', 'none' or "
        "'radial'"
    ]
    assert not store.exists()


def test_every_problem_of_the_grid_include_and_exclude_is_reported_at_once(tmp_path):
    # once, a bad grid value hid the bad include and exclude behind it: fix one, see the next
    path = tmp_path / "bad.yaml"
    path.write_text(
        BASE + "grid: {model.activation: [relu, swish]}\ninclude: [{model.norm: batchnorm}]\n"
        "exclude: [{model.norm: none}]\n"
    )
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    text = "\n".join(err.value.problems)
    assert "grid.model.activation: got 'swish'" in text
    assert "include.0.model.norm: got 'batchnorm'" in text
    assert "exclude.0.model.norm: not a grid axis" in text
