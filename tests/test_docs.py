"""The repository's documentation stays true to the code.

- Every markdown document that the code, README, tests, sweeps, dashboards, benchmarks, docker files and docs cite
  exists in the tree, and every relative link in the markdown resolves.
- docs/contracts.md names every CLI command with each of its options (walked from the typer app), every run-config
  and sweep-file field (walked from the pydantic models), every preset, catalogued metric name and run.json key.
- docs/science.md's reference tables equal geocont/paper/reference.json.
"""

from __future__ import annotations

import ast
import json
import re
import types
import typing
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from geocont import kinds
from geocont.catalog import CATALOG
from geocont.cli import app
from geocont.config import ROLES, RunConfig, preset_names
from geocont.fields import ModelSection
from geocont.metrics.geometry import DIRECTION_KEYS, WEIGHT_KEYS
from geocont.sweep.spec import SpaceParam, SweepConfig

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONTRACTS = DOCS / "contracts.md"
SCIENCE = DOCS / "science.md"

# Where documents are cited from; data and generated folders are not.
CITING = ["geocont", "tests", "sweeps", "dashboards", "benchmarks", "docker", "docs"]
CITING_FILES = ["README.md", "Makefile", "pyproject.toml"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".toml", ".txt", ".cfg", ""}
SKIP_DIRS = {"__pycache__", ".venv", ".git", "geocont-results", ".pytest_cache", ".ruff_cache"}

# A cited document: an optional relative folder path, then an all-caps or all-lowercase name ending in .md
# (README.md, docs/contracts.md, ../README.md). Mixed-case names are code (`Format.md` is an enum member).
MD_REFERENCE = re.compile(r"(?<![\w/.-])((?:\.\.?/)*(?:[\w.-]+/)*(?:[A-Z][A-Z0-9_-]*|[a-z][a-z0-9_-]*)\.md)\b")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def citing_files(root: Path) -> list[Path]:
    files = [root / name for name in CITING_FILES if (root / name).is_file()]
    for folder in CITING:
        for path in sorted((root / folder).rglob("*")) if (root / folder).is_dir() else []:
            if path.is_file() and path.suffix in SUFFIXES and not SKIP_DIRS & set(path.relative_to(root).parts):
                files.append(path)
    return files


def _resolves(root: Path, citing: Path, target: str) -> bool:
    """A reference resolves beside the citing file, from the repository root, or (a bare page name) in docs/."""
    bases = [citing.parent, root] + ([root / "docs"] if "/" not in target else [])
    return any((base / target).exists() for base in bases)


def missing_references(root: Path) -> list[str]:
    """'file: reference' for every cited document or relative markdown link that does not exist under root."""
    missing = []
    for path in citing_files(root):
        text = path.read_text(errors="replace")
        targets = set(MD_REFERENCE.findall(text))
        if path.suffix == ".md":
            for link in MD_LINK.findall(text):
                if not re.match(r"[a-z][a-z0-9+.-]*:", link) and not link.startswith("#"):  # not a URL or an anchor
                    targets.add(link.split("#", 1)[0])
        for target in sorted(t for t in targets if t):
            if not _resolves(root, path, target):
                missing.append(f"{path.relative_to(root)}: {target}")
    return sorted(missing)


def test_every_cited_document_exists():
    assert missing_references(ROOT) == []


def test_a_missing_document_is_caught(tmp_path):
    """The checker itself: a tree whose code cites a removed page fails, and one that cites an existing page passes."""
    md = ".md"  # spelled apart, so that this file cites none of the pages it makes up
    (tmp_path / "docs").mkdir()
    (tmp_path / "geocont").mkdir()
    (tmp_path / "docs" / f"contracts{md}").write_text(f"See [the science](science{md}#reference-values).\n")
    (tmp_path / "docs" / f"science{md}").write_text("# Science\n")
    (tmp_path / "geocont" / "store.py").write_text(f'"""Layout (docs/contracts{md})."""\n')
    assert missing_references(tmp_path) == []
    (tmp_path / "docs" / f"science{md}").unlink()
    (tmp_path / "geocont" / "train.py").write_text(f"# the Lightning import resets its loggers (STACK{md})\n")
    assert missing_references(tmp_path) == [f"docs/contracts{md}: science{md}", f"geocont/train.py: STACK{md}"]


# ---------------------------------------------------------------------------------------------
# The CLI: every command and option, from the typer app


def cli_commands() -> dict[str, list[str]]:
    """'geocont sweep launch' -> its long options (without --help), for every leaf command of the app."""
    commands: dict[str, list[str]] = {}

    def walk(command, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, f"{path} {name}")
            return
        flags = [opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")]
        commands[path] = [f for f in flags if f != "--help"]

    walk(typer.main.get_command(app), "geocont")
    return commands


def contracts_row(command: str) -> str:
    """The row of the command table in contracts.md that documents `command`."""
    pattern = re.compile(rf"\| `{re.escape(command)}( [^`]*)?`")
    rows = [line for line in CONTRACTS.read_text().splitlines() if pattern.match(line)]
    assert len(rows) == 1, f"docs/contracts.md: expected one command-table row for `{command}`, found {len(rows)}"
    return rows[0]


def test_cli_walk_finds_the_commands():
    commands = cli_commands()
    assert {"geocont train", "geocont sweep launch", "geocont results table", "geocont analyze"} <= set(commands)
    assert "--max-concurrent" in commands["geocont sweep launch"]


@pytest.mark.parametrize("command", sorted(cli_commands()))
def test_contracts_document_every_command_and_option(command):
    row = contracts_row(command)
    undocumented = [flag for flag in cli_commands()[command] if flag not in row]
    assert not undocumented, f"docs/contracts.md: `{command}` does not mention {undocumented}"


# ---------------------------------------------------------------------------------------------
# Config fields, from the pydantic models


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation is made of (through Optional, unions and Annotated), not inside containers."""
    if annotation is ModelSection:  # the `model:` section: every registered kind's own class
        return [kind.config for kind in kinds.registered()]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted path of a model: 'model.depth', 'tracking.wandb.mode', ... (sections themselves left out)."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        inner = _models_in(field.annotation)
        if inner:
            paths += [p for m in inner for p in field_paths(m, f"{path}.") if p not in paths]
        else:
            paths.append(path)
    return list(dict.fromkeys(paths))


def test_field_walk_finds_both_model_kinds():
    paths = field_paths(RunConfig)
    assert {"model.bias", "model.kv_heads", "data.tokenizer", "tracking.wandb.mode", "preset"} <= set(paths)


@pytest.mark.parametrize("path", field_paths(RunConfig))
def test_contracts_document_every_run_config_field(path):
    documented = f"`{path}`" in CONTRACTS.read_text()
    assert documented, f"docs/contracts.md does not document the run-config field {path}"


@pytest.mark.parametrize("path", field_paths(SweepConfig))
def test_contracts_document_every_sweep_field(path):
    documented = f"`{path}`" in CONTRACTS.read_text()
    assert documented, f"docs/contracts.md does not document the sweep field {path}"


@pytest.mark.parametrize("key", list(SpaceParam.model_fields))
def test_contracts_document_every_search_parameter_key(key):
    documented = f"`{key}`" in CONTRACTS.read_text()
    assert documented, f"docs/contracts.md does not document search.space's key {key}"


# ---------------------------------------------------------------------------------------------
# Names the code defines: presets, metrics, run.json keys


def test_contracts_document_presets_and_metrics():
    text = CONTRACTS.read_text()
    names = [f"`{p}`" for p in preset_names()]
    names += [f"`{m.name}`" for m in CATALOG]
    names += [f"`weight/<role>/{key}`" for key in WEIGHT_KEYS]
    names += [f"`{kind}/<role>/{key}`" for kind in ("grad_init", "grad_cum") for key in DIRECTION_KEYS]
    names += [f"`{role}`" for role in ROLES]
    assert [n for n in names if n not in text] == []


def _dict_keys(source: Path, function: str, variable: str | None) -> list[str]:
    """The constant keys of the dict literal assigned to `variable` inside `function` (None: the one it returns)."""
    tree = ast.parse(source.read_text())
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function):
        for node in ast.walk(fn):
            named = isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable for t in node.targets)
            returned = variable is None and isinstance(node, ast.Return)
            if (named or returned) and isinstance(node.value, ast.Dict):
                return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError(f"{source.name}: no dict literal {variable or 'returned'} in {function}()")


def test_contracts_document_every_run_json_key():
    keys = _dict_keys(ROOT / "geocont" / "attempts.py", "record", None)  # train()'s and every pack member's
    keys += _dict_keys(ROOT / "geocont" / "sweep" / "trainable.py", "trainable", "info")
    keys += _dict_keys(ROOT / "geocont" / "sweep" / "trainable.py", "record_failure", "record")
    table = CONTRACTS.read_text().split("## run.json", 1)[1].split("\n## ", 1)[0]
    assert {"run_id", "worker_pid"} <= set(keys)
    assert [k for k in dict.fromkeys(keys) if f"`{k}`" not in table] == []


# ---------------------------------------------------------------------------------------------
# science.md's tables are the reference file's


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every markdown table as rows of cells (header first, the --- line dropped)."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def _table(header_start: list[str]) -> list[list[str]]:
    found = [t for t in markdown_tables(SCIENCE.read_text()) if t[0][: len(header_start)] == header_start]
    assert len(found) == 1, f"docs/science.md: expected one table starting {header_start}"
    return found[0]


@pytest.mark.parametrize("which", ["mlp", "transformer"])
def test_science_tables_equal_reference_json(which):
    spec = json.loads((ROOT / "geocont" / "paper" / "reference.json").read_text())["tables"][which]
    labels = [c["label"] for c in spec["columns"]]
    header, *rows = _table(["config", labels[0]])
    assert header == ["config", *labels]
    assert [r[0] for r in rows] == [r["config"] for r in spec["rows"]]
    for cells, row in zip(rows, spec["rows"]):
        if row.get("diverged"):
            assert cells[1] == "NaN" and set(cells[2:]) == {"-"} and row["values"] == {}
        else:
            assert {label: float(c) for label, c in zip(labels, cells[1:])} == row["values"], row["config"]


def test_science_pretrained_values_equal_reference_json():
    reference = json.loads((ROOT / "geocont" / "paper" / "reference.json").read_text())
    values = reference["pretrained"]["Llama-3.1-8B"]["values"]
    header, cells = _table([values[0]["label"]])
    assert dict(zip(header, map(float, cells))) == {v["label"]: v["value"] for v in values}
