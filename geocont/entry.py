"""Running a typer app as a console script: user errors become one-line messages and exit code 2."""

from __future__ import annotations

import sys

import typer

from geocont.config import ConfigError


def run(app: typer.Typer) -> None:
    """Run `app` with geocont's error contract: ConfigError -> 'error: ...' lines, exit 2, no traceback."""
    try:
        code = app(standalone_mode=False)  # in this mode click returns a typer.Exit's code instead of exiting
    except ConfigError as err:
        for line in err.problems:
            typer.echo(f"error: {line}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as err:
        # Usage errors: typer vendors its own click, so `click.ClickException` would not match them.
        if hasattr(err, "format_message") and isinstance(getattr(err, "exit_code", None), int):
            typer.echo(f"error: {_one_line(err)}", err=True)
            sys.exit(err.exit_code)
        raise
    sys.exit(code if isinstance(code, int) else 0)


def _one_line(err: Exception) -> str:
    """A usage error as one line, with the command whose --help explains it (click prints a usage block)."""
    message = " ".join(err.format_message().split())
    ctx = getattr(err, "ctx", None)
    return f"{message} (see {ctx.command_path} --help)" if ctx is not None else message
