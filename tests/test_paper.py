"""The paper's reference tables (geocont/paper/reference.json) and paper_table() over store runs."""

from __future__ import annotations

import math
import re
import statistics

import polars as pl
import pytest
from synthetic_store import write_mlp_sweep, write_run, write_transformer_sweep

from geocont import store
from geocont.config import ConfigError, resolve
from geocont.paper import TABLES, format_paper_table, paper_table, pretrained_reference, reference, table_spec

DESIGN_METRIC = re.compile(
    r"^(weight|grad_init|grad_cum)/(?:(q|k|v|o|gate|up|down)/)?(v1|u1|sigma2|sigma2_u)_continuity$"
    r"|^delta_gw/(?:(q|k|v|o|gate|up|down)/)?(v1|u1)$|^(train/loss|val/loss|val/acc|val/ppl|update_ratio)$"
)


@pytest.mark.parametrize("which", TABLES)
def test_reference_columns_name_design_metrics(which):
    spec = table_spec(which)
    labels = [c["label"] for c in spec["columns"]]
    assert len(set(labels)) == len(labels)
    for col in spec["columns"]:
        assert DESIGN_METRIC.match(col["metric"]), col["metric"]
        assert col["scale"] in (1, 100)
    for row in spec["rows"]:
        assert set(row["values"]) <= set(labels), row["config"]
        assert set(row["match"]) == set(spec["match_keys"])


def test_reference_values_are_the_papers():
    """Spot checks against docs/science.md, including the unit of accuracy."""
    mlp = {r["config"]: r for r in table_spec("mlp")["rows"]}
    assert mlp["Res + ReLU"]["values"] == {
        "acc": 97.7, "grad v1": 0.792, "weight v1": 0.959, "weight u1": 0.940, "weight sigma2-WA": 0.249,
    }  # fmt: skip
    assert mlp["NoRes + ReLU"]["match"] == {"model.residual": False, "model.activation": "relu", "model.norm": "none"}
    assert mlp["Res + None + LN"]["match"]["model.norm"] == "layernorm"
    acc = next(c for c in table_spec("mlp")["columns"] if c["label"] == "acc")
    unit = (acc["metric"], acc["scale"], acc["store_unit"], acc["paper_unit"])
    assert unit == ("val/acc", 100, "fraction", "percent")
    lm = {r["config"]: r for r in table_spec("transformer")["rows"]}
    assert lm["NoRes + SiLU + Norm"]["values"]["PPL"] == 1700
    assert lm["NoNorm"]["diverged"] and lm["NoNorm"]["values"] == {}
    llama = {(v["role"], v["space"]): v["value"] for v in pretrained_reference("Llama-3.1-8B")}
    assert llama == {("q", "v1"): 0.82, ("gate", "v1"): 0.80, ("o", "u1"): 0.89, ("down", "u1"): 0.74,
                     ("v", "v1"): 0.14, ("v", "u1"): 0.14}  # fmt: skip
    assert len(reference()["tables"]["mlp"]["rows"]) == 7 and len(lm) == 6


@pytest.mark.parametrize("which", TABLES)
def test_every_row_is_a_valid_config(which):
    """The match keys use values RunConfig accepts, so a real sweep can produce every row."""
    spec = table_spec(which)
    data = {"name": "digits"} if spec["model_kind"] == "mlp" else {"name": "stdlib"}
    for row in spec["rows"]:
        model = {"kind": spec["model_kind"], **{k.split(".")[1]: v for k, v in row["match"].items()}}
        resolve({"model": model, "data": data})


def test_unknown_table_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown table 'cnn'; allowed: mlp, transformer"):
        paper_table(pl.DataFrame(), "cnn")


def _runs(rows: list[dict]) -> pl.DataFrame:
    base = {"model.kind": "mlp", "model.depth": 16, "model.norm": "none", "status": "completed"}
    return pl.DataFrame([{**base, **r} for r in rows])


def test_mean_std_over_seeds_in_paper_units():
    accs, v1s = [0.97, 0.98, 0.96], [0.95, 0.96, 0.94]
    rows = [
        {"model.residual": True, "model.activation": "relu", "train.seed": s, "val/acc": a, "weight/v1_continuity": v}
        for s, (a, v) in enumerate(zip(accs, v1s))
    ]
    rows.append({"model.residual": True, "model.activation": "relu", "model.depth": 4, "train.seed": 9,
                 "val/acc": 0.5, "weight/v1_continuity": 0.1, "status": "failed"})  # fmt: skip
    table = paper_table(_runs(rows), "mlp")
    assert table.height == 7 and table["config"][0] == "Res + ReLU"
    row = table.row(0, named=True)
    assert row["runs"] == 3 and row["diverged"] == 0  # the failed run is left out
    assert row["acc mean"] == pytest.approx(100 * statistics.mean(accs))
    assert row["acc std"] == pytest.approx(100 * statistics.stdev(accs))
    assert row["weight v1 mean"] == pytest.approx(statistics.mean(v1s))
    assert row["weight v1 std"] == pytest.approx(statistics.stdev(v1s))
    assert row["acc paper"] == 97.7 and row["weight v1 paper"] == 0.959
    assert row["grad v1 mean"] is None  # a metric the runs did not log
    others = table.filter(pl.col("config") != "Res + ReLU")
    assert others["runs"].to_list() == [0] * 6 and others["acc mean"].null_count() == 6


def test_matching_ignores_other_fields_but_not_kind_or_norm():
    rows = [
        {"model.residual": True, "model.activation": "none", "model.depth": 4, "val/acc": 0.9},
        {"model.residual": True, "model.activation": "none", "val/acc": 0.92, "model.init_std": 1e-4},
        {"model.residual": True, "model.activation": "none", "model.norm": "layernorm", "val/acc": 0.5},
        {"model.residual": True, "model.activation": "none", "model.kind": "transformer", "val/acc": 0.1},
    ]
    table = paper_table(_runs(rows), "mlp").filter(pl.col("config").str.starts_with("Res + None"))
    by = {r["config"]: r for r in table.iter_rows(named=True)}
    assert by["Res + None"]["runs"] == 2 and by["Res + None"]["acc mean"] == pytest.approx(91.0)
    assert by["Res + None + LN"]["runs"] == 1 and by["Res + None + LN"]["acc std"] is None


def test_missing_config_columns_match_nothing():
    table = paper_table(pl.DataFrame({"run_id": ["a"], "status": ["completed"], "val/acc": [0.9]}), "mlp")
    assert table["runs"].sum() == 0


def test_store_runs_and_format(tmp_path):
    """Through the real store: runs written with geocont.store's writers, read with store.runs()."""
    root = tmp_path / "store"
    write_mlp_sweep(root, "mlp", grid={"model.residual": [True, False], "model.activation": ["relu"]}, seeds=(0, 1, 2))
    write_transformer_sweep(root, "lm", activations=("silu",), seeds=(0, 1))
    model = {"kind": "transformer", "depth": 2, "width": 32, "heads": 2, "kv_heads": 2, "mlp_width": 64, "norm": "none"}
    lm_nonorm = {"model": model, "data": {"name": "stdlib"}, "train": {"epochs": 1, "max_steps": 100}}
    write_run(root, "lm", lm_nonorm, status="diverged")
    runs = store.runs(root).collect()

    mlp = paper_table(runs.filter(pl.col("sweep") == "mlp"), "mlp")
    frame = store.runs(root, "mlp").collect()
    relu = frame.filter(pl.col("model.residual"))
    expected = relu["weight/v1_continuity"].to_list()
    row = mlp.filter(pl.col("config") == "Res + ReLU").row(0, named=True)
    assert row["runs"] == 3 and row["weight v1 mean"] == pytest.approx(statistics.mean(expected))
    assert mlp.filter(pl.col("config") == "NoRes + ReLU")["runs"].item() == 3

    lm = paper_table(store.runs(root, "lm"), "transformer")  # a LazyFrame works too
    assert lm.filter(pl.col("config") == "Res + SiLU + Norm")["runs"].item() == 2
    nonorm = lm.filter(pl.col("config") == "NoNorm").row(0, named=True)
    assert (nonorm["runs"], nonorm["diverged"], nonorm["PPL paper"]) == (0, 1, None)

    text = format_paper_table(lm, "transformer")
    cells = {r["config"]: r for r in text.iter_rows(named=True)}
    assert cells["NoNorm"]["PPL"] == "diverged" and cells["NoNorm"]["PPL (paper)"] == "NaN (diverged)"
    assert re.fullmatch(r"\d+\.\d ± \d+\.\d", cells["Res + SiLU + Norm"]["PPL"])
    assert cells["Res + SiLU + Norm"]["Q v1 (paper)"] == "0.405"
    assert cells["Res + ReLU + Norm"]["Q v1"] == "–"
    assert all(math.isfinite(v) for v in lm["Q v1 mean"].drop_nulls())
