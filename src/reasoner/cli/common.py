"""What every command module of the CLI shares: the two streams (results on stdout; progress,
logs and errors on stderr), user-error handling, config loading and the summary table. It
imports no command module and not the app (cli/__init__.py builds the app from the command
modules, which import this).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from reasoner.config import SFTConfig, load
from reasoner.errors import ConfigError, ReasonerError, Stopped
from reasoner.pipeline.recipe import RecipeConfig
from reasoner.pipeline.registry import command_configs


def _console(stderr: bool) -> Console:
    """A console on the stream as it is now; in a log (not a terminal) nothing is wrapped at 80
    columns: one table row stays one line."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=1000)


def results() -> Console:
    """Results (summary tables, reports, comparisons) go to stdout."""
    return _console(stderr=False)


def logs() -> Console:
    """Progress, logs, warnings and errors go to stderr."""
    return _console(stderr=True)


_started: dict[str, float] = {}

# Which config model each command reads (`config show`; tests load every shipped YAML with it).
CONFIG_MODELS: dict[str, type] = {**command_configs(), "run": RecipeConfig,
                                   "export mindspeed": SFTConfig}

ConfigArg = Annotated[Path, typer.Argument(
    help="stage config (YAML); every key it takes: reasoner config show COMMAND",
    show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="overrides key.sub=value (values parsed as YAML)", show_default=False),
]

# Errors a user can fix from the message alone: one paragraph, exit 2. Anything else (a bug,
# out of memory, a collective that failed) keeps its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ReasonerError,)


def fail(name: str, message: str) -> NoReturn:
    """End the command with a user-fixable error: its name, the message as plain text, exit 2."""
    logs().print(f"[bold red]reasoner {name}: error[/]")
    logs().print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


# Operating-system errors on a path the user chose: what to do about each.
PATH_ERRORS = {
    errno.EACCES: "check the permissions of that path (or choose another output_dir)",
    errno.EPERM: "check the permissions of that path (or choose another output_dir)",
    errno.EROFS: "the file system is read-only: choose another output_dir",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.EISDIR: "that path is a folder where a file was expected",
    errno.ENOENT: "no such file or folder: check the path",
    errno.ENOSPC: "the disk is full: free some space, then rerun the same command to resume",
    errno.EDQUOT: "the disk quota is used up: free some space, then rerun to resume",
}


def describe_os_error(exc: OSError) -> str | None:
    """An OSError on a user's path as one paragraph, or None when it is not one (a bug keeps
    its traceback)."""
    if exc.errno not in PATH_ERRORS:
        return None
    where = exc.filename or "a path"
    return f"{where}: {exc.strerror or os.strerror(exc.errno)}; {PATH_ERRORS[exc.errno]}"


def run_stage(name: str, fn: Callable[[], Any]) -> Any:
    """Run one stage, turning user-fixable errors into a one-paragraph message and exit code 2:
    the project's own, and an operating-system error on a path (permissions, a file where a
    folder should be, a full disk, a missing file)."""
    _started.setdefault(name, time.perf_counter())
    try:
        return fn()
    except USER_ERRORS as exc:
        fail(name, str(exc))
    except OSError as exc:
        said = describe_os_error(exc)
        if said is None:
            raise
        fail(name, said)
    except KeyboardInterrupt:
        logs().print(f"[yellow]reasoner {name}: interrupted; rerun the same command to resume[/]")
        raise typer.Exit(130) from None
    except Stopped as exc:
        logs().print(f"reasoner {name}: {exc}; rerun the same command to resume",
                     markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(128 + exc.signal_number) from None


def done(name: str) -> None:
    """The last line of a command, after its results: how long it took (stderr)."""
    seconds = time.perf_counter() - _started.pop(name, time.perf_counter())
    logs().print(f"[green]reasoner {name}: done in {seconds:.1f}s[/]")


def load_config(name: str, model_cls: type, config: Path, overrides: list[str] | None) -> Any:
    """Load and validate a stage config; a bad one ends the command with exit code 2."""
    try:
        return load(model_cls, config, overrides)
    except ConfigError as exc:
        fail(name, str(exc))


def shown(value: Any) -> str:
    """A value as a summary shows it: floats to 4 significant digits (-0.5884, not
    -0.5883578583598137), large ones with thousands separators."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"
    return str(value)


def summary(title: str, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in rows:
        table.add_row(key, shown(value))
    results().print(table)


def is_main() -> bool:
    """This process prints the summary (rank 0 under torchrun)."""
    from reasoner.device import is_main_process  # imports torch: only after a stage ran

    return is_main_process()
