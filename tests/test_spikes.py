"""SpikeDetector: known spikes found, ordinary noise ignored, and the invariants of a ratio test."""

import json
import math
import random

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from synthetic_store import write_mlp_sweep

from geocont import store
from geocont.metrics.spikes import SpikeDetector, detect
from geocont.paper import format_paper_table, paper_table
from geocont.report import build_report
from geocont.report.data import curves, load_sweeps, mark_spikes
from geocont.sweep.live import SweepView, table
from geocont.tables import aggregate_table, runs_table

positive_losses = st.lists(st.floats(1e-6, 1e6, allow_nan=False), min_size=1, max_size=400)


def noisy_decay(steps: int, seed: int = 0) -> list[float]:
    """A training-loss-like curve: exponential decay with heavy-tailed batch noise (log-normal, sigma 1)."""
    rng = random.Random(seed)
    return [(2.0 * math.exp(-i / 300) + 0.05) * math.exp(rng.gauss(0.0, 1.0)) for i in range(steps)]


def test_a_known_spike_is_found_once_with_its_level_and_peak():
    losses = [0.3] * 300 + [4e4, 9e4, 2e3] + [0.3] * 100
    (spike,) = detect(losses)
    assert (spike["step"], spike["loss"], spike["level"]) == (300, 4e4, 0.3)
    assert (spike["peak"], spike["peak_step"], spike["length"], spike["end"]) == (9e4, 301, 3, 302)


def test_update_returns_the_record_at_the_onset_only():
    detector = SpikeDetector(factor=10, window=20, warmup=10)
    returned = [detector.update(i, v) for i, v in enumerate([1.0] * 20 + [50.0, 60.0, 1.0])]
    assert [i for i, r in enumerate(returned) if r is not None] == [20]
    assert returned[20] == {
        "step": 20,
        "loss": 50.0,
        "level": 1.0,
        "peak": 50.0,
        "peak_step": 20,
        "length": 1,
        "end": 20,
    }
    assert detector.spikes[0]["peak"] == 60.0  # the stored record follows the excursion


def test_two_separate_excursions_are_two_spikes():
    losses = [1.0] * 50 + [1e4] + [1.0] * 50 + [1e4] + [1.0] * 5
    assert [s["step"] for s in detect(losses, factor=100, window=40, warmup=20, gap=10)] == [50, 101]


def test_a_blow_up_that_dips_below_the_threshold_is_one_excursion():
    # The shape of the Res+None blow-up on MNIST: above the threshold, briefly back, above again.
    losses = [0.3] * 200 + [490.0, 10.0, 294.0, 1972.0, 5.0, 5.0, 1782.0, 3.9e4] + [0.3] * 100
    (spike,) = detect(losses, gap=5)
    assert (spike["step"], spike["peak"], spike["peak_step"], spike["length"], spike["end"]) == (
        200,
        3.9e4,
        207,
        5,
        207,
    )
    assert len(detect(losses, gap=1)) == 3


def test_nothing_before_warmup():
    assert detect([1.0] * 5 + [1e6], factor=10, window=20, warmup=10) == []


def test_non_finite_losses_are_not_spikes_and_do_not_move_the_level():
    detector = SpikeDetector(factor=10, window=20, warmup=10)
    for i in range(20):
        detector.update(i, 1.0)
    assert detector.update(20, float("nan")) is None
    assert detector.update(21, float("inf")) is None
    assert detector.level == 1.0
    assert detector.update(22, 20.0) is not None


def test_steps_must_increase():
    detector = SpikeDetector()
    detector.update(5, 1.0)
    with pytest.raises(ValueError, match="steps must increase"):
        detector.update(5, 1.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"factor": 1.0}, {"window": 0}, {"warmup": 0}, {"window": 10, "warmup": 11}, {"gap": 0}, {"quantile": 1.5}],
)
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        SpikeDetector(**kwargs)


def test_the_level_is_a_quantile_of_the_window():
    values = [9.0, 1.0, 5.0, 3.0, 7.0, 2.0]  # the window of five keeps 1, 5, 3, 7, 2
    levels = {}
    for q in (0.0, 0.5, 0.9, 1.0):
        detector = SpikeDetector(factor=2, window=5, warmup=1, quantile=q)
        for i, v in enumerate(values):
            detector.update(i, v)
        levels[q] = detector.level
    assert levels == {0.0: 1.0, 0.5: 3.0, 0.9: 5.0, 1.0: 7.0}


def test_heavy_tailed_noise_of_a_fitted_model_is_not_a_spike():
    # Late in training: most batches cost ~0.002, one in five holds a misclassified example (~0.2).
    rng = random.Random(1)
    losses = [0.2 if rng.random() < 0.2 else 0.002 * math.exp(rng.gauss(0, 0.5)) for _ in range(5000)]
    assert detect(losses) == []
    assert detect(losses, quantile=0.5)  # against the median these batches are 100x


def test_defaults_ignore_heavy_tailed_noise_and_catch_a_paper_size_spike():
    losses = noisy_decay(3000)
    assert detect(losses) == []
    losses[2500] = 4e4
    assert [s["step"] for s in detect(losses)] == [2500]


def test_spikes_property_returns_copies():
    detector = SpikeDetector(factor=10, window=20, warmup=10)
    for i, v in enumerate([1.0] * 20 + [100.0]):
        detector.update(i, v)
    detector.spikes[0]["step"] = -1
    assert detector.spikes[0]["step"] == 20


@settings(max_examples=60, deadline=None)
@given(positive_losses, st.floats(1e-3, 1e3))
def test_scaling_every_loss_keeps_the_spikes(losses, scale):
    kwargs = {"factor": 5, "window": 16, "warmup": 4}
    base = detect(losses, **kwargs)
    scaled = detect([v * scale for v in losses], **kwargs)
    assert [s["step"] for s in scaled] == [s["step"] for s in base]
    for a, b in zip(base, scaled):
        assert math.isclose(b["loss"] / b["level"], a["loss"] / a["level"], rel_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(positive_losses)
def test_a_non_increasing_curve_has_no_spikes(losses):
    assert detect(sorted(losses, reverse=True), factor=1.5, window=16, warmup=1) == []


@settings(max_examples=60, deadline=None)
@given(positive_losses)
def test_every_spike_exceeds_factor_times_its_level(losses):
    for spike in detect(losses, factor=3, window=8, warmup=2):
        assert spike["loss"] > 3 * spike["level"] > 0
        assert spike["peak"] >= spike["loss"] and spike["length"] >= 1


@settings(max_examples=40, deadline=None)
@given(positive_losses, st.integers(0, 10_000))
def test_step_numbers_only_label_the_spikes(losses, offset):
    kwargs = {"factor": 4, "window": 10, "warmup": 3}
    plain = detect(losses, **kwargs)
    shifted = detect(losses, steps=[offset + 10 * i for i in range(len(losses))], **kwargs)
    assert [offset + 10 * s["step"] for s in plain] == [s["step"] for s in shifted]


# ---------------------------------------------------------------------------------------------
# Spikes shown beside the metrics they distort: results tables, the live view, the report


def _with_spike(root, sweep: str, run_id: str, epoch: int, step: int, ratio: float) -> None:
    """Add a `train/spike` row to a stored run, as training logs it."""
    folder = store.run_dir(root, sweep, run_id)
    rows = pl.read_parquet(folder / "metrics.parquet").to_dicts()
    rows.append({"run_id": run_id, "epoch": epoch, "step": step, "name": "train/spike", "value": ratio})
    store.write_metrics(folder, rows)


@pytest.fixture()
def spiked_store(tmp_path):
    root = tmp_path / "store"
    grid = {"model.residual": [True], "model.activation": ["relu", "none"]}
    ids = write_mlp_sweep(root, "mlp", grid=grid, seeds=(0, 1), epochs=5)  # relu s0, relu s1, none s0, none s1
    _with_spike(root, "mlp", ids[2], epoch=3, step=250, ratio=1.3e5)
    return root, ids


def test_tables_count_spiked_runs_and_mark_distorted_columns(spiked_store):
    root, ids = spiked_store
    frame = store.runs(root, "mlp").collect()
    agg = {r["model.activation"]: r for r in aggregate_table(frame).iter_rows(named=True)}
    assert (agg["none"]["spiked"], agg["relu"]["spiked"]) == (1, 0)
    per_run = runs_table(frame)
    assert per_run.filter(pl.col("run_id") == ids[2])["train/spike"].item() == 1.3e5
    assert per_run["train/spike"].null_count() == 3

    table = paper_table(frame, "mlp")
    rows = {r["config"]: r for r in format_paper_table(table, "mlp").iter_rows(named=True)}
    assert rows["Res + None"]["spikes"] == "1/2 *" and rows["Res + ReLU"]["spikes"] == ""
    assert rows["Res + None"]["grad v1"].endswith(" *") and not rows["Res + None"]["weight v1"].endswith("*")
    assert not rows["Res + ReLU"]["grad v1"].endswith("*")


def test_tables_without_spikes_have_no_spike_column(tmp_path):
    write_mlp_sweep(tmp_path, "mlp", grid={"model.activation": ["relu"]}, seeds=(0,), epochs=2)
    frame = store.runs(tmp_path, "mlp").collect()
    assert "spiked" not in aggregate_table(frame).columns
    assert "spikes" not in format_paper_table(paper_table(frame, "mlp"), "mlp").columns


def test_live_view_shows_the_spike_beside_the_metrics():
    view = SweepView(Console(record=True, width=200), live=False)
    view.event("start", {"run_id": "a", "name": "act=none seed=0"}, {})
    view.event("result", {"run_id": "a", "name": "act=none seed=0"}, {"epoch": 3, "val/acc": 0.9, "train/spike": 4e4})
    view.event("start", {"run_id": "b", "name": "act=relu seed=0"}, {})
    view.event("result", {"run_id": "b", "name": "act=relu seed=0"}, {"epoch": 3, "val/acc": 0.97})
    console = Console(record=True, width=200)
    console.print(table(list(view.rows.values()), view.metrics))
    lines = console.export_text().splitlines()
    assert "spike" in lines[0]
    assert "x4e+04" in next(line for line in lines if "act=none" in line)
    assert "x" not in next(line for line in lines if "act=relu" in line).split("0.97")[1]


def test_report_lists_spikes_and_marks_the_distorted_curves(spiked_store):
    root, ids = spiked_store
    (sweep,) = load_sweeps(root, "mlp")
    found = sweep.spikes.select("variant", "seed", "step", "x", "ratio", "found_by").rows()
    assert found == [("Res + None", 0, 250, 3, 1.3e5, "training")]
    frame = mark_spikes(sweep, curves(sweep, ["grad_cum/v1_continuity", "weight/v1_continuity"]))
    marked = frame.filter(pl.col("spike")).select("variant", "metric", "x").rows()
    assert marked == [("Res + None", "grad_cum/v1_continuity", 3)]  # weights are drawn unmarked

    section = build_report(root, "mlp").sections[0]
    spikes = next(t for t in section.tables if t.title == "Loss spikes")
    assert spikes.frame.row(0) == ("Res + None", "0", "250", "3", "1.3e+05", "training")
    gradient = next(f for f in section.figures if f.id.endswith("-gradient"))
    assert "Red triangles" in gradient.caption
    assert "triangle-down" in json.dumps(gradient.spec())
    continuity = next(f for f in section.figures if f.id.endswith("-continuity"))
    assert "Red triangles" not in continuity.caption


def test_report_finds_spikes_in_the_logged_loss_of_runs_without_a_record(tmp_path):
    """A store from before the detector: the blow-up is found in train/loss as logged (every 10th step)."""
    root = tmp_path / "store"
    (run_id,) = write_mlp_sweep(root, "old", grid={"model.activation": ["none"]}, seeds=(0,), epochs=5)
    folder = store.run_dir(root, "old", run_id)
    rows = [r for r in pl.read_parquet(folder / "metrics.parquet").to_dicts() if r["name"] != "train/loss"]
    losses = noisy_decay(500, seed=3)
    losses[430:436] = [300.0, 4e4, 9e3, 700.0, 80.0, 30.0]  # a blow-up over 60 steps, at steps 4300-4350
    for i, loss in enumerate(losses):
        rows.append({"run_id": run_id, "epoch": 1 + i // 100, "step": 10 * i, "name": "train/loss", "value": loss})
    store.write_metrics(folder, rows)
    (sweep,) = load_sweeps(root, "old")
    assert sweep.spikes.select("step", "x", "found_by").rows() == [(4300, 5, "logged loss")]
