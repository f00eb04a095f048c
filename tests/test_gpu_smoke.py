"""benchmarks/gpu_smoke.py: its CPU dry run end to end (tiny), its comparison rule, its refusal to run on the CPU
unasked, and (marked gpu, skipped without CUDA) a real part on the GPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


smoke = load_smoke()


def test_compare_is_relative_above_one_absolute_below_and_never_matches_nan():
    ok, n, worst = smoke.compare({"a": 2.001, "b": 0.5008}, {"a": 2.0, "b": 0.5}, tol=1e-3)
    assert (ok, n) == (True, 2) and worst.startswith("b:")  # 8e-4 of 1e-3 is worse than 1e-3 of 2e-3
    assert smoke.compare({"a": 2.01}, {"a": 2.0}, tol=1e-3)[0] is False
    assert smoke.compare({"a": float("nan")}, {"a": float("nan")}, tol=1.0)[0] is False
    assert smoke.compare({"a": 1.0}, {"b": 1.0}, tol=1.0) == (False, 0, "")  # nothing in common: no match


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_refuses_the_cpu_unless_asked(monkeypatch, capsys):
    monkeypatch.delenv("GPU_SMOKE_ALLOW_CPU", raising=False)
    assert smoke.main(["--parts", "mlp-fp32"]) == 2
    assert "GPU_SMOKE_ALLOW_CPU=1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is what a machine without a GPU runs")
def test_cpu_dry_run_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPU_SMOKE_ALLOW_CPU", "1")
    monkeypatch.setenv("GEOCONT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # wandb offline and TensorBoard files stay in the temp store
    out = tmp_path / "smoke.json"
    assert smoke.main(["--parts", "mlp-fp32", "--dry-steps", "4", "--json", str(out)]) == 0
    (part,) = json.loads(out.read_text())
    assert part["part"] == "mlp-fp32" and part["device"] == "cpu" and part["steps"] == 4
    assert part["steps_per_s"] > 0 and part["metrics_share"] is not None
    assert part["match"] is True and part["compared"] > 5  # the same config on the same CPU: equal values
    assert "CPU dry run" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is what a machine without a GPU runs")
def test_cpu_dry_run_of_the_pack_and_fp16_parts(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_SMOKE_ALLOW_CPU", "1")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "smoke.json"
    assert smoke.main(["--parts", "pack,mlp-fp16", "--dry-steps", "4", "--json", str(out)]) == 0
    pack, fp16 = json.loads(out.read_text())
    assert pack["part"] == "pack" and pack["match"] is True and pack["compared"] > 10  # both members, vs solo
    assert any("trial-steps/s" in n for n in pack["notes"]) and any("mlp_full_grid" in n for n in pack["notes"])
    assert fp16["part"] == "mlp-fp16" and fp16["match"] is True  # on a CPU both runs are fp32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_transformer_smoke_on_the_gpu_matches_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOCONT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "smoke.json"
    assert smoke.main(["--parts", "transformer-smoke", "--json", str(out)]) == 0
    (part,) = json.loads(out.read_text())
    assert part["device"].startswith("cuda") and part["gpu_peak_mib"] > 0
    assert part["match"] is True, part["worst"]
