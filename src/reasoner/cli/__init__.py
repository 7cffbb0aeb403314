"""The `reasoner` command line: the app, built here from the command modules.

Each command loads its config + overrides and calls a stage's `run(cfg)`. The command modules
(stage_commands.py, eval_commands.py, recipe_commands.py, export_commands.py) import their
shared helpers from common.py and never this module, which imports them: the app sits at the
top, as torchtune's `_cli` does.
"""

from __future__ import annotations

from typing import Annotated

import typer

from reasoner import __version__
from reasoner.cli import (
    config_commands,
    eval_commands,
    export_commands,
    recipe_commands,
    stage_commands,
)
from reasoner.cli.common import CONFIG_MODELS  # noqa: F401  (re-exported)

app = typer.Typer(
    name="reasoner",
    help="Train LLMs to reason about math with offline RL: "
    "sft -> infer -> verify -> train-offline -> eval.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"reasoner {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """reasoner: offline-RL pipeline for math reasoning LLMs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars and summaries speak instead


app.add_typer(stage_commands.data_app, name="data")
app.add_typer(stage_commands.model_app, name="model")
for _name, _command in [("sft", stage_commands.sft), ("infer", stage_commands.infer),
                        ("verify", stage_commands.verify), ("explain", stage_commands.explain),
                        ("train-offline", stage_commands.train_offline)]:
    app.command(_name)(_command)
app.add_typer(export_commands.export_app, name="export")
app.add_typer(eval_commands.eval_app, name="eval")
app.command("run")(recipe_commands.run_recipe)
app.command("plan")(recipe_commands.plan_recipe)
app.command("ls")(recipe_commands.list_recipes)
app.command("cp")(recipe_commands.copy_recipe)
app.command("check-folder")(recipe_commands.check_folder)
config_commands.config_app.command("show")(config_commands.config_show)
app.add_typer(config_commands.config_app, name="config")

if __name__ == "__main__":
    app()


def run() -> None:
    """The `reasoner` entry point: the app, then the process group torn down after success.

    Under torchrun a process that exits without `destroy_process_group` may abort while the
    interpreter shuts down (gloo's worker threads still hold tensors; SIGABRT, "terminate
    called without an active exception") and NCCL warns that pending work may be lost. After a
    failure the group is left alone: tearing it down while another rank is still inside a
    collective would hang instead of exiting (torchtitan does the same)."""
    try:
        app(prog_name="reasoner")
    except SystemExit as exc:
        if exc.code in (0, None):
            _leave_process_group()
        raise


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
