"""`geocont report`: one self-contained HTML file with the figures of a store's sweeps.

Reads only the store (geocont.store.runs / metrics) and `geocont analyze` parquet files, so it
imports neither torch, Lightning nor Ray. Modules: data (load and aggregate), figures (altair
builders), build (which figures a sweep gets), page (HTML and PNG/SVG export).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from geocont import DEFAULT_STORE
from geocont.config import ConfigError

if TYPE_CHECKING:  # altair and polars load only when a report is built: `geocont --help` stays fast
    from geocont.report.build import Section

__all__ = ["Report", "build_report", "report_command", "write_report"]


@dataclass
class Report:
    title: str
    subtitle: str
    sections: list[Section]

    def html(self) -> str:
        from geocont.report import page

        return page.render(self.title, self.subtitle, self.sections)


def build_report(store: Path, sweep: str | None = None, analysis: list[Path] | None = None) -> Report:
    """Every sweep of the store (or the one named) and every analysis file, as sections of figures and tables."""
    from geocont.report import data, page
    from geocont.report.build import analysis_section, sweep_section

    analysis = analysis or []
    sweeps = data.load_sweeps(store, sweep) if (store.is_dir() or not analysis) else []
    sections = [sweep_section(s) for s in sweeps]
    extra = analysis_section(analysis)
    if extra is not None:
        sections.append(extra)
    return Report("geocont report", page.subtitle(store, sweep), sections)


def write_report(report: Report, output: Path, figures: Path | None = None) -> list[Path]:
    """Write the HTML (atomically) and, when asked, PNG + SVG of every figure; returns the files written."""
    from geocont.report import page
    from geocont.store import atomic_write_text

    atomic_write_text(output, report.html())
    _shareable(output)
    written = [output]
    if figures is not None:
        written += page.export_figures(report.sections, figures)
    return written


def _shareable(path: Path) -> None:
    """The atomic writer's temp file is private (0600); a report is for sharing: the usual umask-based mode."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _check_inputs(store: Path, output: Path, figures: Path | None, analysis: list[Path]) -> None:
    from geocont.store import unwritable_folder

    problems = []
    if not store.is_dir() and not analysis:
        problems.append(f"--store {store}: no such folder (a results store, e.g. {DEFAULT_STORE})")
    if output.suffix.lower() not in (".html", ".htm"):
        problems.append(f"--output {output}: expected an .html file name")
    if output.exists() and output.is_dir():
        problems.append(f"--output {output}: is a folder; expected an .html file name")
    elif (why := unwritable_folder(output.parent)) is not None:
        problems.append(f"--output {output}: its folder {output.parent} {why}")
    if figures is not None and (why := unwritable_folder(figures)) is not None:
        problems.append(f"--figures {figures}: {why}")
    problems += [f"--analysis {p}: no such file" for p in analysis if not p.is_file()]
    if problems:
        raise ConfigError(problems)


def report_command(
    # a str: Path("") would be ".", and `--store ''` must be an error, not the current folder
    store_arg: Annotated[str, typer.Option("--store", help="Results store folder.")] = DEFAULT_STORE,
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only this sweep (default: every sweep).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")] = Path("report.html"),
    figures: Annotated[
        Path | None, typer.Option("--figures", help="Also write PNG + SVG of each figure (and CSV tables) here.")
    ] = None,
    analysis: Annotated[
        list[Path] | None,
        typer.Option("--analysis", help="A `geocont analyze --out` parquet file to include (repeatable)."),
    ] = None,
) -> None:
    """Write one self-contained HTML report (opens with no network) of a store's sweeps.

    Continuity-vs-epoch curves per variant (mean and a band over seeds), gradient coherence and
    Delta_GW, init-scale dynamics, the paper's tables beside the reproduced values, per-projection
    heatmaps for transformer sweeps and `geocont analyze` outputs.
    """
    if store_arg == "":
        raise ConfigError([f"--store: empty; give the results store folder, e.g. --store {DEFAULT_STORE}"])
    store = Path(store_arg)
    analysis = list(analysis or [])
    _check_inputs(store, output, figures, analysis)
    start = time.perf_counter()
    report = build_report(store, sweep, analysis)
    written = write_report(report, output, figures)
    n_figs = sum(len(s.figures) for s in report.sections)
    size = output.stat().st_size / 1e6
    typer.echo(f"wrote {output} ({n_figs} figures, {size:.1f} MB) in {time.perf_counter() - start:.1f} s")
    if figures is not None:
        typer.echo(f"wrote {len(written) - 1} files to {figures}")
