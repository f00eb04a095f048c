"""Typed run and sweep configuration: pydantic models, YAML loading, dotted overrides, presets.

Merge order, in one place (`resolve`): field defaults < preset < YAML < `--set` overrides.
Every model forbids unknown keys and is frozen, so a typo fails when the config is created,
never mid-run, and a config can cross a Ray process boundary as a plain dict.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from geocont import kinds
from geocont.fields import ConfigError, Int, ModelSection, Number, PositiveFloat, PositiveInt, Strict
from geocont.kinds.mlp import MLPConfig as MLPConfig
from geocont.kinds.transformer import ROLES as ROLES
from geocont.kinds.transformer import TransformerConfig as TransformerConfig

PRESET_DIR = Path(__file__).parent / "presets"
IMAGE_SETS = ("digits", "mnist")
TEXT_CORPORA = ("stdlib", "text", "wikitext103")


Precision = Literal["32", "16-mixed", "bf16-mixed", "bf16-true"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


class DataConfig(Strict):
    name: Literal["digits", "mnist", "stdlib", "text", "wikitext103"] = "digits"
    path: str | None = None  # mnist: folder of IDX files; text: folder of text files
    seq_len: PositiveInt = 256
    val_fraction: Number = Field(0.15, gt=0.0, lt=1.0)
    tokenizer: Literal["bytes", "bpe"] = "bytes"  # language data only
    vocab_size: PositiveInt = 4096  # bpe only

    @model_validator(mode="after")
    def _text_needs_path(self) -> DataConfig:
        if self.name == "text" and not self.path:
            raise ValueError("data.path is required when data.name is 'text' (a folder of text files)")
        return self


class OptimConfig(Strict):
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: PositiveFloat = 1.0e-3
    beta1: Number = Field(0.9, ge=0.0, lt=1.0)
    beta2: Number = Field(0.999, ge=0.0, lt=1.0)  # 0 is a paper ablation (no second-moment averaging)
    weight_decay: Number = Field(0.0, ge=0.0)
    # Adam's denominator floor, sqrt(v) + eps. PyTorch's 1e-8 is fine with averaged second moments;
    # with beta2 = 0 (v = g^2) a coordinate whose gradient is zero this step moves by lr * m / eps.
    eps: PositiveFloat = 1.0e-8


class TrainConfig(Strict):
    epochs: PositiveInt = 30
    batch_size: PositiveInt = 64
    seed: Int = Field(0, ge=0)
    max_steps: PositiveInt | None = None
    metrics_every_n_steps: PositiveInt | None = None
    precision: Precision = "32"
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = "auto"
    grad_clip: PositiveFloat | None = None  # max global gradient norm per step; None: no clipping

    @model_validator(mode="before")
    @classmethod
    def _precision_as_text(cls, data: Any) -> Any:
        # YAML reads `precision: 32` as an int; Lightning's own spelling is the string "32".
        if (
            isinstance(data, dict)
            and isinstance(data.get("precision"), int)
            and not isinstance(data.get("precision"), bool)
        ):
            data = {**data, "precision": str(data["precision"])}
        return data


class WandbConfig(Strict):
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "geocont"
    entity: str | None = None
    group: str | None = None  # a sweep's trials get the sweep's name


class TrackingConfig(Strict):
    wandb: WandbConfig = WandbConfig()
    tensorboard: bool = True


# (section, field) pairs that the run_id skips at their default value: fields added after stores existed.
LATER_FIELDS = (("optim", "eps"), ("train", "grad_clip"))


class RunConfig(Strict):
    """One training run. Every field has a default; YAML keys are these names."""

    model: SerializeAsAny[ModelSection] = MLPConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    tracking: TrackingConfig = TrackingConfig()
    preset: str | None = None

    @field_validator("model", mode="wrap")
    @classmethod
    def _section_of_its_kind(cls, value: Any, handler: Any) -> ModelSection:
        """The `model:` section as its kind's class (geocont.kinds); a section without `kind` is the MLP."""
        if isinstance(value, ModelSection):
            return value
        if not isinstance(value, dict):
            return handler(value)  # pydantic's own "should be a valid dictionary" error
        name = value.get("kind", kinds.DEFAULT)
        if name not in kinds.names():
            allowed = ", ".join(repr(k) for k in kinds.names())
            raise PydanticCustomError("union_tag_invalid", "unknown kind", {"tag": name, "expected_tags": allowed})
        return kinds.get(name).config.model_validate(value)

    @model_validator(mode="after")
    def _data_fits_model(self) -> RunConfig:
        needs = kinds.get(self.model.kind).data
        if self.data.name not in needs:
            what = "a text corpus" if self.data.name in TEXT_CORPORA else "an image set"
            kind = self.model.kind
            raise ValueError(f"data.name '{self.data.name}' is {what}; model.kind '{kind}' needs {_either(needs)}")
        return self

    def run_id(self) -> str:
        """Content hash of everything that changes the result (tracking and the preset name do not).

        Fields added after stores existed (`LATER_FIELDS`) enter the hash only when set away from their
        default, so every config that leaves them alone keeps its run_id and existing stores resume.
        """
        payload = self.model_dump(mode="json", exclude={"tracking", "preset"})
        for section, key in LATER_FIELDS:
            fields = type(getattr(self, section)).model_fields
            if key in fields and payload[section].get(key) == fields[key].default:
                del payload[section][key]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _either(names: tuple[str, ...]) -> str:
    """('a', 'b', 'c') -> 'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


# ---------------------------------------------------------------------------------------------
# Dict plumbing: dotted paths, deep merge, presets


def parse_value(text: str) -> Any:
    """A `--set` value typed the way YAML would type it: 1e-3 -> float, true -> bool, null -> None."""
    value = yaml.safe_load(text)
    # YAML 1.1 reads "1e-3" as a string; users mean a number.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def set_dotted(tree: dict[str, Any], path: str, value: Any) -> None:
    """tree['a']['b'] = value for path 'a.b', creating levels as needed."""
    *parents, leaf = path.split(".")
    node = tree
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError([f"{path}: '{key}' is a value, not a section"])
        node = child
    node[leaf] = value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A new dict: `override` on top of `base`, recursing into nested sections."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """['model.depth=4', ...] -> nested dict. Malformed pairs are reported together."""
    tree: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            problems.append(f"--set {pair!r}: expected dotted.path=value, e.g. model.activation=gelu")
            continue
        set_dotted(tree, key.strip(), parse_value(text))
    if problems:
        raise ConfigError(problems)
    return tree


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_dict(name: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError([f"preset: unknown preset '{name}'; allowed: {', '.join(preset_names())}"])
    return parse_yaml(path.read_text(), str(path)) or {}


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that notes repeated mapping keys (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                self.duplicates.append(f"duplicate key {key!r} (lines {seen[key]} and {line}); give each key once")
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, source: str, duplicates: list[str] | None = None) -> Any:
    """YAML text -> data, with every repeated key and a syntax error as one-line ConfigError problems.

    Given a `duplicates` list, repeated keys are added to it instead of raised, so a caller can report them
    with the problems validation finds in the same file.
    """
    loader = _UniqueKeyLoader(text)
    loader.duplicates = []
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError([f"{source}: not valid YAML{where}: {getattr(err, 'problem', None) or err}"]) from None
    finally:
        loader.dispose()
    lines = [f"{source}: {line}" for line in loader.duplicates]
    if duplicates is not None:
        duplicates += lines
    elif lines:
        raise ConfigError(lines)
    return data


def read_text(path: Path) -> str:
    """A text file as UTF-8, with a one-line error for bytes that are not."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            [f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); save it as UTF-8"]
        ) from None
    except OSError as err:
        raise ConfigError([f"{path}: cannot be read ({err.strerror})"]) from None


def read_yaml(path: str | Path, duplicates: list[str] | None = None) -> dict[str, Any]:
    """A YAML mapping from disk, with a one-line error for a missing file, bad bytes or bad syntax."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such file"])
    data = parse_yaml(read_text(path), str(path), duplicates)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of config sections, got {type(data).__name__}"])
    return data


# ---------------------------------------------------------------------------------------------
# Validation with errors worded the way the user typed them


def describe_errors(
    err: ValidationError, prefix: str = "", allowed: Callable[[str], list[str]] | None = None
) -> list[str]:
    """One line per pydantic error: 'dotted.path: what is wrong (what is allowed)'.

    `allowed(section)` gives the keys of a section ('' is the top level) for 'unknown key' errors.
    """
    lines = []
    for e in err.errors(include_url=False):
        loc = [str(p) for p in e["loc"]]
        path = ".".join([prefix, *loc] if prefix else loc) if loc else (prefix or "config")
        line = f"{path}: {_explain(e)}"
        keys = allowed(".".join(loc[:-1])) if allowed and e["type"] == "extra_forbidden" else None
        if keys:
            line += f"; allowed under {'.'.join(loc[:-1]) or 'the top level'}: {', '.join(keys)}"
        lines.append(line)
    return lines


def run_config_keys(raw: dict[str, Any]) -> Callable[[str], list[str]]:
    """section -> its keys in a RunConfig like `raw` (the model's keys depend on its kind)."""
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    kind = model.get("kind", kinds.DEFAULT)
    sections: dict[str, type[BaseModel]] = {
        "": RunConfig,
        "model": kinds.get(kind).config if kind in kinds.names() else MLPConfig,
        "data": DataConfig,
        "optim": OptimConfig,
        "train": TrainConfig,
        "tracking": TrackingConfig,
        "tracking.wandb": WandbConfig,
    }
    return lambda section: list(sections[section].model_fields) if section in sections else []


def _explain(e: dict[str, Any]) -> str:
    kind, ctx, got = e["type"], e.get("ctx") or {}, e.get("input")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "literal_error":
        return f"got {got!r}; allowed: {ctx.get('expected', '')}"
    if kind == "union_tag_invalid":
        return f"unknown kind {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
    if kind == "value_error":
        return str(ctx.get("error", e["msg"]))
    return f"{e['msg'].lower()} (got {got!r})" if not isinstance(got, dict) else e["msg"].lower()


def validate_run(raw: dict[str, Any], prefix: str = "") -> RunConfig:
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(describe_errors(err, prefix, run_config_keys(raw))) from None


def resolve(raw: dict[str, Any], overrides: dict[str, Any] | None = None, prefix: str = "") -> RunConfig:
    """The one merge: defaults < preset < raw (YAML) < overrides (--set), then validation."""
    merged = deep_merge(raw, overrides or {})
    name = merged.get("preset")
    if name is not None:
        if not isinstance(name, str):
            raise ConfigError([f"{prefix + '.' if prefix else ''}preset: expected a preset name, got {name!r}"])
        merged = deep_merge(preset_dict(name), merged)
        merged["preset"] = name
    return validate_run(merged, prefix)


def load_run(path: str | Path | None = None, sets: list[str] | None = None) -> RunConfig:
    """A RunConfig from a YAML file (or only presets/overrides when path is None) plus `--set` pairs."""
    duplicates: list[str] = []
    raw = read_yaml(path, duplicates) if path is not None else {}
    return with_problems(duplicates, lambda: resolve(raw, parse_overrides(sets or [])))


def with_problems(problems: list[str], build: Callable[[], Any]) -> Any:
    """build(), raising `problems` together with any that build() raises (every problem of a file at once)."""
    try:
        value = build()
    except ConfigError as err:
        raise ConfigError(problems + err.problems) from None
    if problems:
        raise ConfigError(problems)
    return value
