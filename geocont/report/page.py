"""One self-contained HTML page: Vega, Vega-Lite and vega-embed inlined, every spec inlined.

The page loads nothing from the network (no CDN, no fonts), so it opens from a laptop, an
e-mail attachment or an air-gapped cluster. Figures render as SVG; each figure's container gets
`data-rendered="1"` when drawn and <body> gets `data-ready="done"` (or "error") once all are,
which is what the headless-browser test waits for.
"""

from __future__ import annotations

import functools
import html
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert

from geocont.report.build import Section, Table
from geocont.report.figures import Figure, slug

VL_VERSION = alt.SCHEMA_VERSION.lstrip("v").rsplit(".", 1)[0]  # "6.4": the bundle must match altair's schema

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #222; }
header { background: #22313f; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; } header p { margin: 0; opacity: .8; font-size: 13px; }
nav { padding: 10px 32px; border-bottom: 1px solid #ddd; font-size: 14px; }
nav a { margin-right: 14px; }
main { padding: 8px 32px 40px 32px; }
section { margin-top: 18px; } h2 { border-bottom: 2px solid #22313f; padding-bottom: 4px; }
figure { margin: 18px 0; } figcaption { font-size: 13px; color: #555; max-width: 980px; margin-top: 4px; }
.vis { min-height: 60px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; } th { background: #f2f4f6; }
td:first-child, th:first-child { text-align: left; }
.summary { color: #444; } summary h3 { display: inline; cursor: pointer; }
"""

BOOT = """
(async () => {
  const specs = JSON.parse(document.getElementById("geocont-specs").textContent);
  const options = {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}};
  const jobs = Object.entries(specs).map(([id, spec]) =>
    vegaEmbed(document.getElementById(id), spec, options).then(() => {
      document.getElementById(id).dataset.rendered = "1";
    }));
  const results = await Promise.allSettled(jobs);
  const failed = results.filter((r) => r.status === "rejected");
  failed.forEach((r) => console.error("geocont report: a figure failed to render:", r.reason));
  document.body.dataset.ready = failed.length ? "error" : "done";
})();
"""


@functools.cache
def javascript_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one classic script (about 0.9 MB), from vl-convert's offline copy.

    Bundling takes seconds, so the result is cached on disk per vl-convert and Vega-Lite version.
    """
    cache = _cache_dir() / f"vega-bundle-vlc{vl_convert.__version__}-vl{VL_VERSION}.js"
    try:
        return cache.read_text()
    except OSError:
        pass
    # An inline script ends at the first "</script": escape it (no-op for today's bundle, cheap insurance).
    bundle = vl_convert.javascript_bundle(vl_version=VL_VERSION).replace("</script", "<\\/script")
    try:
        from geocont.store import atomic_write_text

        atomic_write_text(cache, bundle)
    except OSError:
        pass  # a read-only home: bundle again next time
    return bundle


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "geocont"


def render(title: str, subtitle: str, sections: list[Section]) -> str:
    specs = {fig.id: fig.spec() for section in sections for fig in section.figures}
    nav = "".join(f'<a href="#{html.escape(s.id)}">{html.escape(s.title)}</a>' for s in sections)
    body = "\n".join(_section(s) for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{STYLE}</style>
<script>{javascript_bundle()}</script>
</head><body>
<header><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p></header>
<nav>{nav}</nav>
<main>
{body}
</main>
<script type="application/json" id="geocont-specs">{_json_for_html(specs)}</script>
<script>{BOOT}</script>
</body></html>
"""


def _json_for_html(value: Any) -> str:
    # <, > and & only occur inside JSON strings, where \\u escapes mean the same characters.
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _section(section: Section) -> str:
    parts = [
        f'<section id="{html.escape(section.id)}"><h2>{html.escape(section.title)}</h2>',
        f'<p class="summary">{html.escape(section.summary)}</p>',
    ]
    for block in section.blocks:
        parts.append(_figure(block) if isinstance(block, Figure) else _table(block))
    parts.append("</section>")
    return "\n".join(parts)


def _figure(fig: Figure) -> str:
    return (
        f'<figure><div class="vis" id="{html.escape(fig.id)}" data-figure="{html.escape(fig.id)}"></div>'
        f"<figcaption><b>{html.escape(fig.title)}.</b> {html.escape(fig.caption)}</figcaption></figure>"
    )


def _table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in table.frame.iter_rows()
    )
    caption = f"<figcaption>{html.escape(table.caption)}</figcaption>" if table.caption else ""
    body = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{caption}"
    title = html.escape(table.title)
    if table.collapsed:
        summary = f"{title} ({table.frame.height} rows)"
        return f'<figure class="table"><details><summary><h3>{summary}</h3></summary>{body}</details></figure>'
    return f'<figure class="table"><h3>{title}</h3>{body}</figure>'


def subtitle(store: Path, sweep: str | None) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"store {store} · {'sweep ' + sweep if sweep else 'all sweeps'} · generated {when}"


def export_figures(sections: list[Section], folder: Path) -> list[Path]:
    """Each figure as SVG (vector, for papers) and PNG (2x) rendered without a browser; tables as CSV."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for section in sections:
        for block in section.blocks:
            if isinstance(block, Figure):
                spec = block.spec()
                svg, png = folder / f"{block.id}.svg", folder / f"{block.id}.png"
                svg.write_text(vl_convert.vegalite_to_svg(spec, vl_version=VL_VERSION))
                png.write_bytes(vl_convert.vegalite_to_png(spec, vl_version=VL_VERSION, scale=2))
                written += [svg, png]
            elif isinstance(block, Table):
                path = folder / f"{section.id}-{slug(block.title.lower())}.csv"
                block.frame.write_csv(path)
                written.append(path)
    return written
