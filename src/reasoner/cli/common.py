"""What every command module of the CLI shares: the console, user-error handling, config
loading and the summary table. It imports no command module and not the app (cli/__init__.py
builds the app from the command modules, which import this).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from reasoner.config import load
from reasoner.errors import ConfigError, ReasonerError

console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="stage config (YAML)", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="overrides key.sub=value (values parsed as YAML)", show_default=False),
]

# Errors a user can fix from the message alone: one paragraph, exit 2. Anything else (a bug,
# out of memory, a collective that failed) keeps its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ReasonerError,)


def fail(name: str, message: str) -> NoReturn:
    """End the command with a user-fixable error: its name, the message as plain text, exit 2."""
    console.print(f"[bold red]reasoner {name}: error[/]")
    console.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


def run_stage(name: str, fn: Callable[[], Any]) -> Any:
    """Run one stage, turning user-fixable errors into a one-paragraph message and exit code 2."""
    started = time.perf_counter()
    try:
        result = fn()
    except USER_ERRORS as exc:
        fail(name, str(exc))
    except KeyboardInterrupt:
        console.print(f"[yellow]reasoner {name}: interrupted; rerun the same command to resume[/]")
        raise typer.Exit(130) from None
    console.print(f"[green]reasoner {name}: done in {time.perf_counter() - started:.1f}s[/]")
    return result


def load_config(name: str, model_cls: type, config: Path, overrides: list[str] | None) -> Any:
    """Load and validate a stage config; a bad one ends the command with exit code 2."""
    try:
        return load(model_cls, config, overrides)
    except ConfigError as exc:
        fail(name, str(exc))


def summary(title: str, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in rows:
        table.add_row(key, str(value))
    console.print(table)


def is_main() -> bool:
    """This process prints the summary (rank 0 under torchrun)."""
    from reasoner.device import is_main_process  # imports torch: only after a stage ran

    return is_main_process()
