"""`geocont analyze`: projection-specific continuity of a pretrained checkpoint, streamed one matrix at a time.

Importing this package is cheap (no torch): the command imports the engine when it runs.
Modules: checkpoint (files, headers, reading), roles (architectures, --map, validation), engine (streaming and
metrics), output (table and parquet); the fast top-k method is geocont.metrics.lowrank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geocont.config import ConfigError

FORMATS = ("md", "csv", "json")


def analyze_command(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="Model folder (config.json + safetensors), a .safetensors or .gguf file (or a folder holding one), "
            "or a hub id."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write per-pair details (role, layer, space, cos, gap, ...) to FILE.parquet."),
    ] = None,
    format: Annotated[str, typer.Option("--format", help="Table on stdout: md, csv or json.")] = "md",
    roles: Annotated[
        str | None, typer.Option("--roles", help="Only these roles, comma-separated, e.g. q,k,gate.")
    ] = None,
    map: Annotated[
        list[str] | None,
        typer.Option(
            "--map", help="ROLE=REGEX for other architectures; the regex's one group is the layer. Repeatable."
        ),
    ] = None,
    fp64: Annotated[bool, typer.Option("--fp64", help="Compute in float64 instead of float32.")] = False,
) -> None:
    """Projection-specific continuity of a pretrained checkpoint: v1/u1 continuity, sigma2 alignment and spectral
    gap per role (q, k, v, o, gate, up, down), streamed one tensor at a time; pairs with s1/s2 < 1.05 are flagged."""
    from geocont.analyze.roles import parse_roles

    problems = []
    if format not in FORMATS:
        problems.append(f"--format: {format!r} is not one of {', '.join(FORMATS)}")
    if out is not None:
        problems += _out_problems(out)
    if problems:
        raise ConfigError(problems)

    from geocont.analyze.engine import analyze
    from geocont.analyze.output import render, write_pairs

    with _Progress() as bar:
        result = analyze(
            checkpoint, roles=parse_roles(roles), role_map=map, fp64=fp64, progress=bar.advance, on_plan=bar.start
        )
    if out is not None:
        write_pairs(result, out)
    typer.echo(render(result, format))


def _out_problems(out: Path) -> list[str]:
    """--out is checked before any work, by the same kind of write the result will need (a new file beside it, then
    a rename): an hour of analysis must not end in 'permission denied'."""
    import tempfile

    if out.suffix != ".parquet":
        return [f"--out: {out} must be a .parquet file"]
    if out.is_dir():
        return [f"--out: {out} is a folder; give a file name ending in .parquet"]
    if not out.parent.is_dir():
        return [f"--out: folder {out.parent} does not exist"]
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".probe"):
            pass
    except OSError as err:
        return [f"--out: cannot write in folder {out.parent} ({err.strerror or type(err).__name__})"]
    return []


class _Progress:
    """A rich progress bar on stderr (stdout stays clean for --format json), shown once the checkpoint is validated
    (a bad input prints its error lines only) and sized in bytes from the plan."""

    bar = None

    def __enter__(self):
        return self

    def start(self, plan) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = (BarColumn(), DownloadColumn(), TimeElapsedColumn(), TimeRemainingColumn())
        self.bar = Progress(TextColumn("{task.description}"), *columns, console=Console(stderr=True))
        self.bar.start()
        self.count, self.done = sum(len(slots) for slots in plan.roles.values()), 0
        total = sum(s.nbytes for slots in plan.roles.values() for s in slots)
        self.task = self.bar.add_task(f"{plan.architecture}: reading", total=total)

    def advance(self, role: str, layer: int, nbytes: int) -> None:
        self.done += 1
        description = f"{role} layer {layer} ({self.done}/{self.count} matrices)"
        self.bar.update(self.task, advance=nbytes, description=description)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
