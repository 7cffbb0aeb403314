"""Loading stage configs: YAML file + `key.sub=value` overrides -> a validated pydantic model.

Every bad key, wrong type or missing value is reported at once, before any work, with the file
and line (or the override), the key and the closest valid key.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from reasoner.errors import ConfigError
from reasoner.shipped import find_file

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")




def parse_overrides(overrides: list[str]) -> dict[tuple[str, ...], Any]:
    """`a.b=1` -> {("a", "b"): 1}; values are YAML scalars (so `x=1e-5` is a float, `x=null` None).

    Note: YAML 1.1 reads `1e-5` as a string; such exponent floats are converted explicitly.
    """
    parsed: dict[tuple[str, ...], Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
            if isinstance(value, str) and _FLOAT.fullmatch(value):
                value = float(value)
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"override {item!r}: value is not valid YAML ({exc}); to pass it as text, quote it "
                f"inside the shell's quotes: '{key}=\"{raw}\"'") from exc
        parsed[tuple(key.split("."))] = value
    return parsed


def _set_path(data: dict, path: tuple[str, ...], value: Any, origin: str) -> None:
    """Set `a.b.c` in nested dicts; a number indexes a list (`data.0.fields.answer`: the first
    data source's)."""
    node: dict | list = data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"override {origin!r}: {'.'.join(path[:depth])} is a list of {len(node)}; "
                    f"index it with 0 to {len(node) - 1} (got {part!r})")
            part = int(part)
        elif not last and node.get(part) is None:
            if path[depth + 1].isdigit():
                raise ConfigError(f"override {origin!r}: {'.'.join(path[: depth + 1])} holds no "
                                  "list to index here; set the list first "
                                  f"({'.'.join(path[: depth + 1])}=[...])")
            node[part] = {}
        if last:
            node[part] = value
            return
        if not isinstance(node[part], dict | list):
            raise ConfigError(
                f"override {origin!r}: {'.'.join(path[: depth + 1])} is a value, not a section"
            )
        node = node[part]


def _members(ann: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (itself, or the members of a union)."""
    found = [ann, *getattr(ann, "__args__", ())]
    return [c for c in found if isinstance(c, type) and issubclass(c, BaseModel)]


def _walk(model_cls: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, tuple, str | None]:
    """Follow `loc` (field names, and the tags pydantic puts in it for tagged unions).

    Returns the model that owns the fields at the end of `loc` (or None), `loc` without the
    union tags (the path as the user writes it), and the last tag passed (the objective name).
    """
    options: list[type[BaseModel]] = [model_cls]
    path: list[str] = []
    tag = None
    for part in loc:
        if part.isdigit():  # an item of a list: the list's own model holds its fields
            path.append(part)
            continue
        if len(options) > 1:  # a tagged union: this part names the member
            chosen = [m for m in options if m.model_fields.get("name") is not None
                      and m.model_fields["name"].default == part]
            if chosen:
                options, tag = chosen, part
                continue
        path.append(part)
        owner = options[0] if len(options) == 1 else None
        if owner is None or part not in owner.model_fields:
            options = []
            continue
        options = _members(owner.model_fields[part].annotation)
    return (options[0] if len(options) == 1 else None), tuple(path), tag


def _yaml_line(path: Path, loc: tuple) -> int | None:
    """1-based line of the key `loc` in the YAML file, if it is written there."""
    try:
        node = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            return line
        for key_node, value_node in node.value:
            if key_node.value == str(part):
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return line
    return line


def _describe(err: dict, model_cls: type[BaseModel], source: str, path: Path | None,
              overrides: dict[tuple[str, ...], str]) -> str:
    _, loc, _ = _walk(model_cls, tuple(str(p) for p in err["loc"]))
    if not loc:  # a check across fields: it names the fields itself
        return f"{path or source}: {err['msg'].removeprefix('Value error, ')}"
    dotted = ".".join(loc)
    where = source
    n = len(loc)
    matching = [(len(key), text) for key, text in overrides.items()
                if loc[: len(key)] == key or key[:n] == loc]
    origin = max(matching)[1] if matching else None  # the most specific: `data.0.x`, not `data`
    if origin is not None:
        where = f"override '{origin}'"
    elif path is not None:
        line = _yaml_line(path, loc)
        where = f"{path}:{line}" if line else str(path)
    if err["type"] == "extra_forbidden":
        owner, _, tag = _walk(model_cls, tuple(str(p) for p in err["loc"][:-1]))
        valid = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
        hint = f" (did you mean '{'.'.join((*loc[:-1], close[0]))}'?)" if close else ""
        here = f"for {'.'.join(loc[:-1])} '{tag}'" if tag else "here"
        return f"{where}: unknown key '{dotted}'{hint}; valid keys {here}: {', '.join(valid)}"
    if err["type"] == "missing":
        return f"{where}: missing required value '{dotted}'"
    if err["type"] == "union_tag_invalid":
        expected = err.get("ctx", {}).get("expected_tags", "")
        return f"{where}: '{dotted}.name' must be one of {expected} (got {err['input'].get('name')!r})"
    return f"{where}: '{dotted}' {err['msg'].lower()} (got {err.get('input')!r})"


def load(model_cls: type[M], path: str | Path | None, overrides: list[str] | None = None,
         values: dict[str, Any] | None = None) -> M:
    """Read `path` (YAML) into `model_cls`, apply `values` (dotted key -> value, e.g. a recipe's
    `set:`) and then `key.sub=value` overrides, and validate everything.

    Raises ConfigError naming every bad key before any work starts.
    """
    path = find_file(Path(path)) if path is not None else None  # configs/...: the package's too
    data: dict = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(loaded).__name__}")
        data = loaded or {}
    raw: dict[tuple[str, ...], str] = {}
    for key, value in (values or {}).items():
        path_key = tuple(str(key).split("."))
        raw[path_key] = f"{key}: {value!r}"
        _set_path(data, path_key, value, raw[path_key])
    parsed = parse_overrides(overrides or [])
    raw.update({tuple(o.partition("=")[0].split(".")): o for o in overrides or []})
    for key, value in parsed.items():
        _set_path(data, key, value, raw[key])
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        source = str(path) if path else "config"
        lines = [_describe(e, model_cls, source, path, raw) for e in exc.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def dump(cfg: BaseModel) -> dict:
    """The resolved config as plain JSON-able data (what goes into a manifest)."""
    return cfg.model_dump(mode="json")
