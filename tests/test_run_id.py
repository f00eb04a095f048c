"""run_id stability: fields added to the config later must not re-key existing stores."""

import pytest

from geocont.config import LATER_FIELDS, RunConfig, resolve

# Computed on main before `optim.eps` and `train.grad_clip` existed (commit 3237be6).
PINNED = [
    ({}, "e1b0d4bd4d52"),
    (
        {
            "model": {"activation": "none"},
            "data": {"name": "mnist", "path": "/work/shared/mnist"},
            "optim": {"beta2": 0.0},
            "train": {"epochs": 20, "seed": 1},
        },
        "d3697bd5b448",
    ),
]


@pytest.mark.parametrize("raw, run_id", PINNED, ids=["defaults", "mnist-none-beta2-0"])
def test_run_id_is_the_one_stores_already_hold(raw, run_id):
    assert resolve(raw).run_id() == run_id


@pytest.mark.parametrize("raw", PINNED[1:2])
def test_new_fields_at_their_defaults_keep_the_run_id(raw):
    tree, run_id = raw
    spelled = {**tree, "optim": {**tree["optim"], "eps": 1.0e-8}, "train": {**tree["train"], "grad_clip": None}}
    assert resolve(spelled).run_id() == run_id


@pytest.mark.parametrize("raw", [{"optim": {"eps": 1.0e-3}}, {"train": {"grad_clip": 1.0}}], ids=["eps", "grad_clip"])
def test_new_fields_away_from_their_defaults_change_the_run_id(raw):
    assert resolve(raw).run_id() != RunConfig().run_id()


def test_later_fields_exist():
    cfg = RunConfig()
    for section, key in LATER_FIELDS:
        assert key in type(getattr(cfg, section)).model_fields, f"{section}.{key}"


def test_runs_from_before_a_later_field_read_as_its_default():
    import polars as pl

    from geocont.tables import varying_config_columns

    old_and_new = pl.DataFrame({"optim.eps": [None, 1e-8], "model.activation": ["relu", "none"]})
    assert varying_config_columns(old_and_new) == ["model.activation"]
    assert "optim.eps" in varying_config_columns(pl.DataFrame({"optim.eps": [0.1, 1e-8]}))
