from pathlib import Path

import pytest
import yaml

from geocont.config import ConfigError, RunConfig, load_run, parse_overrides, preset_names, resolve

ROOT = Path(__file__).resolve().parents[1]


def problems(raw: dict, sets: list[str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        resolve(raw, parse_overrides(sets or []))
    return info.value.problems


def test_defaults_are_the_paper_mlp():
    cfg = RunConfig()
    assert (cfg.model.kind, cfg.model.depth, cfg.model.width, cfg.model.activation) == ("mlp", 16, 256, "relu")
    assert cfg.tracking.wandb.mode == "offline"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"model": {"depht": 3}}, "model.depht: unknown key"),
        ({"modle": {}}, "modle: unknown key"),
        ({"model": {"activation": "swish"}}, "model.activation: got 'swish'; allowed: 'relu', 'gelu'"),
        ({"model": {"depth": -1}}, "model.depth: input should be greater than or equal to 2"),
        ({"model": {"depth": "deep"}}, "model.depth: input should be a valid integer"),
        ({"model": {"kind": "cnn"}}, "model: unknown kind 'cnn'"),
        ({"optim": {"beta2": 1.5}}, "optim.beta2: input should be less than 1"),
        ({"train": {"precision": 8}}, "train.precision: got '8'"),
        ({"data": {"name": "imagenet"}}, "data.name: got 'imagenet'"),
        ({"data": {"name": "text"}, "model": {"kind": "transformer"}}, "data.path is required"),
        ({"data": {"name": "stdlib"}}, "model.kind 'mlp' needs digits or mnist"),
        ({"model": {"kind": "transformer", "width": 100, "heads": 8}}, "must be divisible by model.heads"),
        ({"preset": "nope"}, "preset: unknown preset 'nope'; allowed:"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_configs_name_the_path_and_the_allowed_values(raw, expected):
    lines = problems(raw)
    assert any(expected in line for line in lines), lines
    assert all("\n" not in line for line in lines)


def test_every_problem_is_reported_at_once():
    lines = problems({"model": {"depth": 0, "activation": "x"}, "optim": {"lr": -1}})
    assert len(lines) == 3


def test_overrides_beat_yaml_which_beats_the_preset(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"preset": "smoke", "model": {"width": 48}, "train": {"epochs": 5}}))
    cfg = load_run(path, ["train.epochs=3", "optim.lr=1e-2", "model.residual=false"])
    assert cfg.model.depth == 4  # from the preset
    assert cfg.model.width == 48  # YAML beats the preset
    assert cfg.train.epochs == 3 and cfg.optim.lr == 0.01 and cfg.model.residual is False  # --set wins
    assert cfg.preset == "smoke"


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected dotted.path=value"):
        parse_overrides(["model.depth"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_run(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {depth: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run(bad)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_run(tmp_path / "list.yaml")


def test_run_id_is_a_content_hash_of_what_changes_results():
    a = resolve({"model": {"depth": 3}})
    assert a.run_id() == resolve({"model": {"depth": 3}}).run_id()
    assert a.run_id() != resolve({"model": {"depth": 3}, "train": {"seed": 1}}).run_id()
    # tracking and the preset's name do not change the result
    assert a.run_id() == resolve({"model": {"depth": 3}, "tracking": {"tensorboard": False}}).run_id()


def test_configs_are_frozen_and_round_trip():
    cfg = resolve({"preset": "paper-mlp"})
    with pytest.raises(Exception):
        cfg.model.depth = 3
    assert RunConfig.model_validate(cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_resolves(name):
    assert resolve({"preset": name}).preset == name


def test_precision_from_yaml_int():
    assert resolve({"train": {"precision": 32}}).train.precision == "32"
