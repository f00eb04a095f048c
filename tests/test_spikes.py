"""SpikeDetector: known spikes found, ordinary noise ignored, and the invariants of a ratio test."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geocont.metrics.spikes import SpikeDetector, detect

positive_losses = st.lists(st.floats(1e-6, 1e6, allow_nan=False), min_size=1, max_size=400)


def noisy_decay(steps: int, seed: int = 0) -> list[float]:
    """A training-loss-like curve: exponential decay with heavy-tailed batch noise (log-normal, sigma 1)."""
    rng = random.Random(seed)
    return [(2.0 * math.exp(-i / 300) + 0.05) * math.exp(rng.gauss(0.0, 1.0)) for i in range(steps)]


def test_a_known_spike_is_found_once_with_its_level_and_peak():
    losses = [0.3] * 300 + [4e4, 9e4, 2e3] + [0.3] * 100
    (spike,) = detect(losses)
    assert (spike["step"], spike["loss"], spike["level"]) == (300, 4e4, 0.3)
    assert (spike["peak"], spike["peak_step"], spike["length"]) == (9e4, 301, 3)


def test_update_returns_the_record_at_the_onset_only():
    detector = SpikeDetector(factor=10, window=20, warmup=10)
    returned = [detector.update(i, v) for i, v in enumerate([1.0] * 20 + [50.0, 60.0, 1.0])]
    assert [i for i, r in enumerate(returned) if r is not None] == [20]
    assert returned[20] == {"step": 20, "loss": 50.0, "level": 1.0, "peak": 50.0, "peak_step": 20, "length": 1}
    assert detector.spikes[0]["peak"] == 60.0  # the stored record follows the excursion


def test_two_separate_excursions_are_two_spikes():
    losses = [1.0] * 50 + [1e4] + [1.0] * 50 + [1e4] + [1.0] * 5
    assert [s["step"] for s in detect(losses, factor=100, window=40, warmup=20)] == [50, 101]


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


@pytest.mark.parametrize("kwargs", [{"factor": 1.0}, {"window": 0}, {"warmup": 0}, {"window": 10, "warmup": 11}])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        SpikeDetector(**kwargs)


def test_the_level_is_the_median_of_the_window():
    detector = SpikeDetector(factor=2, window=4, warmup=1)
    for i, v in enumerate([9.0, 1.0, 5.0, 3.0, 7.0]):
        detector.update(i, v)
    assert detector.level == 4.0  # median of the last four: 1, 3, 5, 7


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
