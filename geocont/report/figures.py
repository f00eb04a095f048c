"""Vega-Lite figures (altair) built from the aggregated frames of geocont.report.data.

Each builder returns a `Figure`: an id (the HTML element id and the export file stem), a title,
a caption that says how to read it, and the chart. Builders take small frames only; the x column is
called `x` so the same builders serve epoch-based (MLP) and step-based (language model) sweeps.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import altair as alt
import polars as pl

from geocont.kinds.transformer import ROLES

CELL = {"width": 210, "height": 150}
SOURCES = ["reproduced", "paper"]


@dataclass
class Figure:
    id: str
    title: str
    caption: str
    chart: alt.TopLevelMixin

    def spec(self, validate: bool = False) -> dict[str, Any]:
        """The Vega-Lite spec; validation against the schema is for tests (slow with inline data)."""
        return self.chart.to_dict(validate=validate)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _records(frame: pl.DataFrame) -> alt.Data:
    # Inline rows; polars -> plain dicts keeps altair from needing pandas.
    return alt.Data(values=frame.to_dicts())


def _color(variants: list[str], legend: bool = True, **legend_style: Any) -> alt.Color:
    scheme = "tableau10" if len(variants) <= 10 else "tableau20"
    columns = min(4 if len(variants) <= 24 else 6, max(1, len(variants)))
    # symbolLimit 0: list every variant (Vega otherwise truncates long legends with a console warning).
    style = {"title": "variant", "orient": "bottom", "columns": columns, "labelLimit": 260, "symbolLimit": 0}
    return alt.Color(
        "variant:N",
        scale=alt.Scale(domain=variants, scheme=scheme),
        legend=alt.Legend(**{**style, **legend_style}) if legend else None,
    )


def curves_figure(
    fig_id: str,
    title: str,
    caption: str,
    frame: pl.DataFrame,
    names: list[str],
    variants: list[str],
    x_title: str,
    columns: int = 4,
    peaks: bool = False,
) -> Figure:
    """Mean over seeds (line) and mean ± std (band) against epoch or step, one panel per metric.

    A boolean `spike` column in `frame` marks points with a red triangle: a loss spike of that variant
    distorts the value from there on (geocont.report.data.mark_spikes).
    """
    # Both layers carry the same legend (a null legend on one drops the merged legend); draw it as strokes.
    color = _color(variants, symbolType="stroke", symbolStrokeWidth=3, symbolOpacity=1)
    x = alt.X("x:Q", title=x_title, axis=alt.Axis(tickMinStep=1, format="d"))  # epochs and steps are whole
    base = alt.Chart().encode(x=x, color=color)
    band = base.mark_area(opacity=0.18).encode(y=alt.Y("lo:Q", title=None), y2="hi:Q")
    tooltip = [
        "variant:N",
        "metric:N",
        alt.Tooltip("x:Q", title=x_title),
        alt.Tooltip("mean:Q", format=".3f"),
        alt.Tooltip("lo:Q", format=".3f"),
        alt.Tooltip("hi:Q", format=".3f"),
        "n:Q",
    ]
    line = base.mark_line(strokeWidth=1.8).encode(
        y=alt.Y("mean:Q", title=None),
        tooltip=tooltip,
    )
    layers = [band, line]
    single = frame.group_by("variant", "metric").len()["len"].min() == 1 if frame.height else False
    if single:  # a series with one x value draws no line (e.g. a one-epoch run): show it as a point
        layers.append(
            base.mark_point(filled=True, size=40).encode(
                y="mean:Q", opacity=alt.condition("datum.single", alt.value(1), alt.value(0)), tooltip=tooltip
            )
        )
    if peaks:  # mark where each variant's curve peaks: the end of formation
        layers.append(
            base.mark_point(filled=True, size=50).encode(y="mean:Q", tooltip=tooltip).transform_filter("datum.peak")
        )
    if "spike" in frame.columns and frame["spike"].any():
        marker = base.mark_point(shape="triangle-down", filled=True, size=90, opacity=1)
        marker = marker.encode(y="mean:Q", color=alt.value("#d62728"), tooltip=tooltip)
        layers.append(marker.transform_filter("datum.spike"))
    columns = (
        min(columns, len(names)) if len(names) <= columns else math.ceil(len(names) / math.ceil(len(names) / columns))
    )
    chart = (
        alt.layer(*layers)
        .properties(**CELL)
        .facet(
            facet=alt.Facet("metric:N", sort=names, title=None, header=alt.Header(labelFontSize=12)),
            columns=columns,
            data=_compact_curves(frame, names, variants),
        )
        .transform_calculate(
            variant=f"{json.dumps(variants)}[datum.v]",
            metric=f"{json.dumps(names)}[datum.m]",
            lo="datum.mean - datum.sd",
            hi="datum.mean + datum.sd",
        )
        .resolve_scale(y="independent")
        .properties(title=title)
    )
    return Figure(fig_id, title, caption, chart)


def _compact_curves(frame: pl.DataFrame, names: list[str], variants: list[str]) -> alt.InlineData:
    """Curves as CSV with variants and metrics as indexes: a 360-run grid is tens of thousands of rows, which
    as JSON objects (keys and long variant names repeated on every row) would be most of the page's size."""
    codes = frame.select(
        v=pl.col("variant").replace_strict(variants, list(range(len(variants))), return_dtype=pl.Int32),
        m=pl.col("metric").replace_strict(names, list(range(len(names))), return_dtype=pl.Int32),
        x=pl.col("x"),
        mean=pl.col("mean").round(4),
        sd=(pl.col("hi") - pl.col("mean")).round(4),
        n=pl.col("n"),
        **({"peak": pl.col("peak").cast(pl.Int8)} if "peak" in frame.columns else {}),
        **({"spike": pl.col("spike").cast(pl.Int8)} if "spike" in frame.columns else {}),
        single=(pl.len().over("variant", "metric") == 1).cast(pl.Int8),
    )
    parse = {name: "number" for name in codes.columns}
    return alt.InlineData(values=codes.write_csv(), format=alt.DataFormat(type="csv", parse=parse))


def bars_figure(
    fig_id: str, title: str, caption: str, frame: pl.DataFrame, names: list[str], variants: list[str]
) -> Figure:
    """Final value per variant: bar = mean over seeds, rule = mean ± std; one panel per metric.

    Horizontal, one row per variant: labels stay readable and a 120-variant grid grows down, not sideways.
    """
    y = alt.Y("variant:N", sort=variants, title=None, axis=alt.Axis(labelLimit=260))
    tooltip = [
        "variant:N",
        "metric:N",
        alt.Tooltip("mean:Q", format=".3f"),
        alt.Tooltip("lo:Q", format=".3f"),
        alt.Tooltip("hi:Q", format=".3f"),
        "n:Q",
    ]
    color = _color(variants, legend=False)  # the axis names each bar
    bars = alt.Chart().mark_bar().encode(y=y, x=alt.X("mean:Q", title=None), color=color, tooltip=tooltip)
    err = alt.Chart().mark_rule(color="#333").encode(y=y, x="lo:Q", x2="hi:Q")
    chart = (
        alt.layer(bars, err, data=_records(frame))
        .properties(width=260, height=max(60, 16 * len(variants)))
        .facet(column=alt.Column("metric:N", sort=names, title=None))
        .properties(title=title)
    )
    return Figure(fig_id, title, caption, chart)


def paper_figure(
    fig_id: str, title: str, caption: str, frame: pl.DataFrame, configs: list[str], columns: list[str]
) -> Figure:
    """Reproduced (mean ± std over seeds) beside the paper's value, one panel per table column.

    `frame`: config, column, source ("reproduced" | "paper"), value, lo, hi.
    """
    y = alt.Y("config:N", sort=configs, title=None)
    # One legend: shape and colour encode the same field with the same title, so Vega-Lite merges them.
    legend = alt.Legend(title="source", orient="bottom")
    shape = alt.Shape("source:N", scale=alt.Scale(domain=SOURCES, range=["circle", "diamond"]), legend=legend)
    color = alt.Color("source:N", scale=alt.Scale(domain=SOURCES, range=["#1f77b4", "#d62728"]), legend=legend)
    tooltip = [
        "config:N",
        "column:N",
        "source:N",
        alt.Tooltip("value:Q", format=".3f"),
        alt.Tooltip("lo:Q", format=".3f"),
        alt.Tooltip("hi:Q", format=".3f"),
    ]
    rule = (
        alt.Chart()
        .mark_rule(color="#1f77b4")
        .encode(y=y, x=alt.X("lo:Q", title=None, scale=alt.Scale(zero=False, padding=10)), x2="hi:Q")
        .transform_filter("datum.source == 'reproduced'")
    )
    points = (
        alt.Chart().mark_point(filled=True, size=70).encode(y=y, x="value:Q", shape=shape, color=color, tooltip=tooltip)
    )
    chart = (
        alt.layer(rule, points, data=_records(frame))
        .properties(width=150, height=max(60, 22 * len(configs)))
        .facet(column=alt.Column("column:N", sort=columns, title=None))
        .resolve_scale(x="independent")
        .properties(title=title)
    )
    return Figure(fig_id, title, caption, chart)


def heatmap_figure(
    fig_id: str,
    title: str,
    caption: str,
    frame: pl.DataFrame,
    x: str,
    y: str,
    value: str,
    facet: str,
    x_sort: list[Any] | None = None,
    y_sort: list[Any] | None = None,
    facet_sort: list[Any] | None = None,
    tooltip_extra: tuple[str, ...] = (),
    domain: tuple[float, float] = (0.0, 1.0),
    scheme: str = "viridis",
    legend_title: str = "|cos|",
) -> Figure:
    """Cells coloured by continuity in [0, 1] with the value printed; one panel per `facet` value."""
    x_enc = alt.X(f"{x}:O", sort=x_sort, title=x)
    y_enc = alt.Y(f"{y}:N", sort=y_sort, title=None)
    tooltip = [f"{x}:O", f"{y}:N", f"{facet}:N", alt.Tooltip(f"{value}:Q", format=".3f"), *tooltip_extra]
    color = alt.Color(
        f"{value}:Q", scale=alt.Scale(domain=domain, scheme=scheme), legend=alt.Legend(title=legend_title)
    )
    rect = alt.Chart().mark_rect().encode(x=x_enc, y=y_enc, color=color, tooltip=tooltip)
    # Dark text on the light end of the scale: the top of viridis, the middle of a diverging scheme.
    text_dark = f"datum['{value}'] > 0.6" if scheme == "viridis" else f"abs(datum['{value}']) < 0.5"
    text = (
        alt.Chart()
        .mark_text(fontSize=9)
        .encode(
            x=x_enc,
            y=y_enc,
            text=alt.Text(f"{value}:Q", format=".2f"),
            color=alt.condition(text_dark, alt.value("black"), alt.value("white")),
        )
    )
    n_x = len(x_sort) if x_sort else frame[x].n_unique()
    n_y = len(y_sort) if y_sort else frame[y].n_unique()
    chart = (
        alt.layer(rect, text, data=_records(frame))
        .properties(width=max(120, 30 * n_x), height=max(60, 20 * n_y))
        .facet(column=alt.Column(f"{facet}:N", title=None, sort=facet_sort))
        .properties(title=title)
    )
    return Figure(fig_id, title, caption, chart)


def role_sort(roles: list[str], order: tuple[str, ...] = ROLES) -> list[str]:
    """q, k, v, o, gate, up, down first (the transformer's data flow), any other role after."""
    return [r for r in order if r in roles] + sorted(r for r in roles if r not in order)
