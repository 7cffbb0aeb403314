"""`reasoner config show STAGE`: every key a stage config takes, with type, default and what it
does, read from the pydantic models themselves (so it cannot drift from what loading accepts)."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from rich.table import Table

from reasoner.cli.common import CONFIG_MODELS, fail, results

config_app = typer.Typer(help="Show what a stage config takes.", no_args_is_help=True)


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(ann))
    if origin is Annotated:
        return _type_name(typing.get_args(ann)[0])
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(ann))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if ann is type(None):
        return "null"
    return getattr(ann, "__name__", str(ann))


def _models_in(ann: Any) -> list[type[BaseModel]]:
    """The config sections a field holds (one, or each member of a tagged union)."""
    if typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    found = [ann, *typing.get_args(ann)]
    return [m for m in found if isinstance(m, type) and issubclass(m, BaseModel)]


def _default(field: Any) -> str:
    if field.is_required():
        return "(required)"
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()
    if isinstance(value, BaseModel):
        return ""
    return repr(value) if isinstance(value, str) else str(value)


def config_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every key, sections expanded with dotted keys; each
    member of a tagged union (the objectives) under its own `name`."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _models_in(field.annotation)
        if len(nested) > 1:  # a tagged union: each member's keys, labelled by its name
            for member in nested:
                tag = member.model_fields["name"].default
                rows.append((f"{key}  (name: {tag})", "section", "", member.__doc__ or ""))
                rows += [r for r in config_rows(member, f"{key}.") if r[0] != f"{key}.name"]
            continue
        if nested and typing.get_origin(field.annotation) is None:
            rows.append((key, "section", "", field.description or ""))
            rows += config_rows(nested[0], f"{key}.")
            continue
        rows.append((key, _type_name(field.annotation), _default(field), field.description or ""))
    return rows


def config_show(
    stage: Annotated[str, typer.Argument(help="a command: sft, infer, verify, train-offline, "
                                              "eval, 'data synth', 'model tiny', run, ...")],
) -> None:
    """Every key of a stage's config: type, default and description (dotted keys override)."""
    names = {**CONFIG_MODELS, "eval": CONFIG_MODELS["eval bench"]}
    if stage not in names:
        fail("config show", f"unknown stage {stage!r}; one of: {', '.join(sorted(names))}")
    table = Table(title=f"{stage}: {names[stage].__doc__ or ''}".strip(), title_justify="left")
    for col in ("key", "type", "default", "description"):
        table.add_column(col, overflow="fold")
    for row in config_rows(names[stage]):
        table.add_row(*row)
    results().print(table)
