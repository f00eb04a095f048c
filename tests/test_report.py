"""`geocont report`: the data behind each figure, the figures' specs, the CLI, PNG/SVG export, and the page
itself opened offline in headless Chromium (console clean, no network, every figure drawn)."""

from __future__ import annotations

import io
import os
import re
import shutil
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest
from analyze_fixtures import write_planted
from chromium import Browser, find_or_install
from PIL import Image
from synthetic_store import write_mlp_sweep, write_run, write_transformer_sweep
from typer.testing import CliRunner

from geocont import store
from geocont.cli import app
from geocont.config import ROLES, ConfigError
from geocont.report import build_report, write_report
from geocont.report.build import DELTA, GRAD_INIT, GRADIENT, INIT_SCALE, MLP_CONTINUITY, TRAINING
from geocont.report.data import curves, load_sweeps, status_counts, variant_label

MLP_BASE = {"model": {"kind": "mlp", "depth": 4, "width": 16}, "data": {"name": "digits"}, "train": {"epochs": 5}}


def analysis_file(folder: Path) -> Path:
    """A real `geocont analyze --out` parquet, of a checkpoint with planted continuity."""
    from geocont.analyze.engine import analyze
    from geocont.analyze.output import write_pairs

    result = analyze(write_planted(folder / "planted", layers=4, hidden=48, inter=80))
    write_pairs(result, folder / "planted.parquet")
    return folder / "planted.parquet"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """Three sweeps written with the store's writers (one failed and one diverged run included)."""
    root = tmp_path_factory.mktemp("synthetic") / "store"
    grid = {"model.residual": [True, False], "model.activation": ["relu", "none"]}
    write_mlp_sweep(root, "mlp", grid=grid, seeds=(0, 1, 2), epochs=5)
    write_run(root, "mlp", {**MLP_BASE, "model": {**MLP_BASE["model"], "activation": "gelu"}}, status="failed")
    write_run(root, "mlp", {**MLP_BASE, "model": {**MLP_BASE["model"], "activation": "silu"}}, status="diverged")
    write_mlp_sweep(root, "init", grid={"model.init_std": [1e-4, None]}, seeds=(0, 1), epochs=8,
                    base={**MLP_BASE, "model": {**MLP_BASE["model"], "activation": "none"}})  # fmt: skip
    write_transformer_sweep(root, "lm", activations=("silu", "none"))
    return root


def test_variant_labels_read_like_the_paper():
    keys = ["model.residual", "model.activation", "model.norm", "model.init_std", "optim.beta2"]
    run = {"model.kind": "mlp", "model.residual": True, "model.activation": "none", "model.norm": "layernorm",
           "model.init_std": 1e-4, "optim.beta2": 0.0}  # fmt: skip
    assert variant_label(run, keys) == "Res + None + LN, init 0.0001, beta2=0.0"
    lm = {"model.kind": "transformer", "model.residual": False, "model.activation": "silu", "model.norm": "rmsnorm"}
    assert variant_label(lm, ["model.residual"]) == "NoRes + SiLU + Norm"
    assert variant_label({**lm, "model.norm": "none"}, []) == "NoRes + SiLU + NoNorm"


def test_sweeps_variants_and_seed_aggregates(synthetic):
    sweeps = {s.name: s for s in load_sweeps(synthetic)}
    mlp = sweeps["mlp"]
    assert (mlp.kind, mlp.x, mlp.variant_keys) == ("mlp", "epoch", ["model.residual", "model.activation"])
    assert mlp.variants == ["Res + ReLU", "Res + None", "NoRes + ReLU", "NoRes + None"]  # the paper's order
    assert mlp.all_variants == ["Res + ReLU", "Res + GELU", "Res + SiLU", "Res + None", "NoRes + ReLU", "NoRes + None"]
    assert sweeps["lm"].x == "step" and sweeps["lm"].kind == "transformer"
    assert sweeps["init"].variant_keys == ["model.init_std"]

    # Mean and band over seeds at one epoch, recomputed from the store's own long table.
    band = curves(mlp, ["weight/v1_continuity"]).filter((pl.col("variant") == "Res + ReLU") & (pl.col("x") == 3))
    long = store.metrics(synthetic, "mlp").collect()
    values = long.filter(
        pl.col("model.residual") & (pl.col("model.activation") == "relu") & (pl.col("epoch") == 3)
        & (pl.col("name") == "weight/v1_continuity")
    )["value"].to_list()  # fmt: skip
    assert len(values) == 3 and band["n"].item() == 3
    assert band["mean"].item() == pytest.approx(statistics.mean(values), abs=1e-5)
    assert band["hi"].item() - band["mean"].item() == pytest.approx(statistics.stdev(values), abs=1e-5)
    # Failed and diverged runs are counted but never drawn.
    assert set(mlp.metrics["variant"]) == {"Res + ReLU", "Res + None", "NoRes + ReLU", "NoRes + None"}
    counts = {r["variant"]: r for r in status_counts(mlp).to_dicts()}
    assert counts["Res + GELU"]["failed"] == 1 and counts["Res + SiLU"]["diverged"] == 1


def test_report_figures_and_valid_vega_lite(synthetic, tmp_path):
    report = build_report(synthetic, analysis=[analysis_file(tmp_path)])
    ids = {s.id: [f.id for f in s.figures] for s in report.sections}
    assert ids["mlp"] == ["mlp-continuity", "mlp-gradient", "mlp-delta-gw", "mlp-training", "mlp-paper"]
    assert "init-init-scale" in ids["init"]
    assert ids["lm"] == ["lm-projections", "lm-projection-heatmap", "lm-delta-gw-heatmap", "lm-training", "lm-paper"]
    assert ids["pretrained"] == ["analysis-0-planted"]
    for section in report.sections:
        for fig in section.figures:
            spec = fig.spec(validate=True)  # raises on any schema violation
            assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/v6")
    tables = {t.title: t.frame for s in report.sections for t in s.tables}
    paper = tables["The paper's table, reproduced (mlp)"]
    assert paper["config"].to_list() == ["Res + ReLU", "Res + SiLU", "Res + None", "NoRes + ReLU"]  # GELU only failed
    assert paper.row(1, named=True)["weight v1"] == "diverged" and paper.row(1, named=True)["runs"] == "0"
    role_means = tables["Mean continuity per role"]
    q_v1 = role_means.filter((pl.col("role") == "q") & (pl.col("space") == "v1")).row(0, named=True)
    assert float(q_v1["planted.parquet"]) > 0.9 and q_v1["Llama-3.1-8B (paper)"] == "0.82"  # planted, then the paper


def test_html_is_self_contained(synthetic, tmp_path):
    out = tmp_path / "report.html"
    write_report(build_report(synthetic, "mlp"), out)
    text = out.read_text()
    assert text.count("window.vegaEmbed=") == 1  # one inlined copy of vega + vega-lite + vega-embed
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\(\s*['\"]?https?:", text)
    assert text.count('data-figure="') == 5
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # shareable, not the temp file's private mode


def test_report_cli_and_figure_export(tmp_path):
    root = tmp_path / "store"
    write_mlp_sweep(root, "small", grid={"model.activation": ["relu", "none"]}, seeds=(0, 1), epochs=3)
    out, figs = tmp_path / "r.html", tmp_path / "figs"
    args = ["report", "--store", str(root), "--sweep", "small", "-o", str(out), "--figures", str(figs)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"wrote .*r\.html \(5 figures, [\d.]+ MB\)", result.output)
    for stem in ("small-continuity", "small-gradient", "small-delta-gw", "small-training", "small-paper"):
        with Image.open(figs / f"{stem}.png") as png:
            assert png.width > 300 and png.height > 150
        svg = ET.parse(figs / f"{stem}.svg").getroot()
        assert svg.tag.endswith("svg") and len(svg.findall(".//{http://www.w3.org/2000/svg}path")) > 5
    assert (figs / "small-the-paper-s-table-reproduced-mlp.csv").read_text().startswith("config,runs")


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--store", "{tmp}/nowhere"], "--store {tmp}/nowhere: no such folder"),
        (["--store", "{tmp}/store", "-o", "{tmp}/report.txt"], "--output {tmp}/report.txt: expected an .html file"),
        (["--store", "{tmp}/store", "--sweep", "nope"], "no finished runs for sweep 'nope'"),
        (["--store", "{tmp}/store", "--analysis", "{tmp}/x.parquet"], "--analysis {tmp}/x.parquet: no such file"),
    ],
)
def test_bad_input_is_reported_and_nothing_written(tmp_path, args, problem):
    write_mlp_sweep(tmp_path / "store", "small", grid={"model.activation": ["relu"]}, seeds=(0,), epochs=2)
    args = [a.format(tmp=tmp_path) for a in args]
    out = [] if "-o" in args else ["-o", str(tmp_path / "r.html")]
    result = CliRunner().invoke(app, ["report", *args, *out])
    assert isinstance(result.exception, ConfigError)
    assert any(problem.format(tmp=tmp_path) in line for line in result.exception.problems)
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "report.txt").exists()


# ---------------------------------------------------------------------------------------------
# The page in a real browser, from a real sweep


@pytest.fixture(scope="module")
def real_report(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A real 8-run sweep (train() on tiny MLPs) + a transformer sweep from the writers + a real analyze file."""
    from geocont.config import resolve
    from geocont.train import train

    folder = tmp_path_factory.mktemp("real")
    root = folder / "store"
    for activation in ("relu", "none"):
        for init_std in (None, 1e-4):
            for seed in (0, 1):
                cfg = resolve({
                    "model": {"kind": "mlp", "depth": 3, "width": 16, "activation": activation, "init_std": init_std},
                    "data": {"name": "digits"}, "train": {"epochs": 4, "batch_size": 64, "seed": seed},
                    "tracking": {"wandb": {"mode": "disabled"}, "tensorboard": False},
                })  # fmt: skip
                assert train(cfg, root, "mysweep", progress=False).status == "completed"
    write_transformer_sweep(root, "lm", activations=("silu", "relu"))
    analysis = analysis_file(folder)
    out = folder / "report.html"
    write_report(build_report(root, analysis=[analysis]), out)
    return root, analysis, out


def expected_marks(root: Path, analysis: Path) -> dict[str, dict[str, int]]:
    """Plot elements each figure must draw, counted from the store itself: one line (and band) per variant and
    metric panel, one bar per variant and Delta_GW metric, one heatmap cell per variant x role x space."""
    long = store.metrics(root).collect()

    def per_panel(sweep: str, names) -> int:
        rows = long.filter((pl.col("sweep") == sweep) & pl.col("name").is_in(list(names)))
        return rows.select("name", "model.activation", "model.init_std", "model.residual").unique().height

    def present(sweep: str, pattern) -> list[str]:
        names = set(long.filter(pl.col("sweep") == sweep)["name"])
        if isinstance(pattern, re.Pattern):
            return [n for n in names if pattern.match(n)]
        return [n for n in pattern if n in names]

    n_lm = long.filter(pl.col("sweep") == "lm")["model.activation"].n_unique()
    grid = len(ROLES) * 2 * n_lm
    lines = lambda sweep, names: {"line": per_panel(sweep, names), "area": per_panel(sweep, names)}  # noqa: E731
    return {
        "mysweep-continuity": lines("mysweep", present("mysweep", MLP_CONTINUITY)),
        "mysweep-gradient": lines("mysweep", present("mysweep", GRADIENT)),
        "mysweep-delta-gw": {"rect": per_panel("mysweep", present("mysweep", DELTA) + present("mysweep", GRAD_INIT))},
        "mysweep-training": lines("mysweep", present("mysweep", TRAINING)),
        "mysweep-init-scale": lines("mysweep", present("mysweep", INIT_SCALE)),
        # Res + ReLU and Res + None match the paper (init scale ignored): 5 reproduced + 5 paper points each.
        "mysweep-paper": {"symbol": 2 * 10, "rule": 2 * 5},
        "lm-projections": lines("lm", [f"weight/{r}/{s}_continuity" for r in ROLES for s in ("v1", "u1")]),
        "lm-projection-heatmap": {"rect": grid, "text": grid},
        "lm-delta-gw-heatmap": {"rect": grid},
        "lm-training": lines("lm", present("lm", TRAINING)),
        "analysis-0-planted": {"rect": pl.read_parquet(analysis).height},
    }


COUNT_MARKS = """JSON.stringify(Array.from(document.querySelectorAll('[data-figure]')).map((el) => {
  const n = (sel) => el.querySelectorAll(sel).length;
  const box = el.getBoundingClientRect();
  return {id: el.id, rendered: el.dataset.rendered === '1', svg: n('svg.marks'),
    line: Array.from(el.querySelectorAll('g.mark-line.role-mark > path'))
      .filter((p) => (p.getAttribute('d') || '').includes('L')).length,  // drawn: two points or more
    area: n('g.mark-area.role-mark > path'),
    rect: n('g.mark-rect.role-mark > path'), symbol: n('g.mark-symbol.role-mark > path'),
    rule: n('g.mark-rule.role-mark > line'), text: n('g.mark-text.role-mark > text'),
    x: box.left + window.scrollX, y: box.top + window.scrollY, w: box.width, h: box.height};
}))"""


@pytest.mark.slow
def test_report_renders_in_headless_chromium(real_report):
    import json

    binary, reason = find_or_install()
    if binary is None:
        pytest.skip(f"headless Chromium unavailable: {reason}")
    root, analysis, html = real_report
    with Browser(binary) as browser:
        state = browser.open(html.as_uri(), "document.body && document.body.dataset.ready", timeout=90)
        figures = {f["id"]: f for f in json.loads(browser.evaluate(COUNT_MARKS))}
        shot = browser.screenshot()
        problems, urls = browser.console_problems(), browser.requested_urls()
    if os.environ.get("GEOCONT_REPORT_SCREENSHOT"):  # keep the picture for a person to look at
        Path(os.environ["GEOCONT_REPORT_SCREENSHOT"]).write_bytes(shot)
        shutil.copy(html, Path(os.environ["GEOCONT_REPORT_SCREENSHOT"]).with_suffix(".html"))

    assert state == "done" and problems == []
    assert urls == [html.as_uri()]  # the page loaded nothing else: no CDN, no fonts, no network
    expected = expected_marks(root, analysis)
    assert set(figures) >= set(expected) and all(f["rendered"] and f["svg"] == 1 for f in figures.values())
    for fig_id, marks in expected.items():
        got = {kind: figures[fig_id][kind] for kind in marks}
        assert got == marks, fig_id
    assert all(count > 0 for count in expected["mysweep-gradient"].values())
    assert figures["mysweep-init-scale"]["symbol"] >= 4 * 3  # each curve's peak (on weight/v1: end of formation)

    page = Image.open(io.BytesIO(shot)).convert("RGB")
    for fig_id, fig in figures.items():
        crop = page.crop((int(fig["x"]), int(fig["y"]), int(fig["x"] + fig["w"]), int(fig["y"] + fig["h"])))
        pixels = list(crop.getdata())
        drawn = sum(1 for p in pixels if p != (255, 255, 255)) / len(pixels)
        assert fig["w"] > 200 and fig["h"] > 100, fig_id
        assert drawn > 0.02 and len(set(pixels)) > 20, f"{fig_id}: blank ({drawn:.1%} drawn)"
