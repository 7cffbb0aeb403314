"""Read rows from a shard folder, a JSONL / JSON / parquet file, or an HF dataset id.

Field mapping renames the data's columns to ours (`fields: {problem: question}`), also from
inside nested objects (`fields: {answer: reward_model.ground_truth}`), so public datasets with
other column names need no conversion step. Chat data is read natively in both shapes: OpenAI
(`messages` of `role` / `content`) and ShareGPT (`conversations` of `from` / `value`, roles
human / gpt / assistant / system, an optional top-level `system` column). Problem rows without
a `problem` or `answer` column take the first of the usual names (question / prompt / query;
ground_truth / expected_answer / final_answer / gt_answer / gold / target / label), and say so
once on stderr; one with neither is an error naming the mapping that fixes it. A bad row is
reported as `path:line: what is wrong` (`hf://id[split]:row N` for hub datasets).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from reasoner import hub, shards
from reasoner.config import DataConfig
from reasoner.errors import DataError
from reasoner.records import Problem, Row, SFTExample

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "model": "assistant", "bot": "assistant", "system": "system"}
PROBLEM_NAMES = ("question", "prompt", "query")
ANSWER_NAMES = ("ground_truth", "expected_answer", "final_answer", "gt_answer", "gold", "target",
                "label")
NAMES = {"problem": PROBLEM_NAMES, "answer": ANSWER_NAMES}


def _located(cfg: DataConfig) -> Iterator[tuple[str, dict]]:
    path = Path(cfg.path)
    if path.is_dir() and (shards.part_files(path) or (path / shards.MANIFEST).exists()):
        allow_torn = not shards.is_complete(path)
        for part in shards.part_files(path):
            for lineno, row in shards.raw_rows(part, allow_torn):
                yield f"{part}:{lineno}", row
    elif path.is_file() and path.suffix == ".jsonl":
        for lineno, row in shards.raw_rows(path):
            yield f"{path}:{lineno}", row
    elif path.is_file() and path.suffix == ".json":
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise shards.ShardError(f"{path}: a .json data file must hold a list of objects")
        for i, row in enumerate(data):
            yield f"{path}[{i}]", row
    elif path.is_file() and path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}:row {i + 1}", row
    elif path.exists():
        raise shards.ShardError(
            f"{path}: not a shard folder or a .jsonl/.json/.parquet file"
        )
    else:
        why = hub.missing(cfg.path, "data.path", "file or folder", _in_datasets_cache(cfg.path))
        if why:
            raise DataError(why)
        yield from _hub(cfg)


def _in_datasets_cache(name: str) -> bool:
    """A hub dataset `datasets` has cached here (offline it can still be read)."""
    if not (hub.offline() and hub.is_hub_id(name)):
        return False
    import datasets

    return (Path(datasets.config.HF_DATASETS_CACHE) / name.replace("/", "___")).exists()


BUILDERS = ("json", "parquet", "csv", "text", "arrow")  # datasets' own loaders of local files


def _hub(cfg: DataConfig) -> Iterator[tuple[str, dict]]:
    """An HF dataset id (downloaded and cached by `datasets`), or a builder over data_files.

    With `streaming` or a `limit`, rows are streamed: a smoke test of a 666K-row set reads
    its first rows, not the whole download.
    """
    if "/" not in cfg.path and not (cfg.path in BUILDERS and cfg.data_files):
        raise DataError(f"{cfg.path}: no such file or folder (nor an HF dataset id; "
                        f"{'/'.join(BUILDERS)} need data.data_files)")
    import datasets

    stream = cfg.streaming or cfg.limit is not None
    try:
        ds = datasets.load_dataset(cfg.path, cfg.subset, split=cfg.split,
                                   data_files=cfg.data_files, streaming=stream)
        if stream and cfg.shuffle_buffer:
            ds = ds.shuffle(seed=cfg.seed, buffer_size=cfg.shuffle_buffer)
    except Exception as exc:  # noqa: BLE001  (hub errors have many types; all mean the same here)
        raise DataError(
            f"{cfg.path}: neither a local path nor a loadable HF dataset ({type(exc).__name__}: {exc})"
        ) from exc
    for i, row in enumerate(ds):
        yield f"hf://{cfg.path}[{cfg.split}]:row {i}", dict(row)


def lookup(row: dict, dotted: str) -> tuple[bool, object]:
    """(found, value) of `a.b.0.c` inside nested dicts and lists."""
    node: object = row
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def as_messages(turns: list, system: object, where: str) -> list[dict]:
    """OpenAI or ShareGPT turns -> [{role, content}], the `system` column first when set."""
    out = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: turn {k} is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role not in ROLES or not isinstance(content, str):
            raise DataError(f"{where}: turn {k} needs role/content (OpenAI) or from/value "
                            f"(ShareGPT) with a role among {', '.join(ROLES)}; got {sorted(turn)}")
        out.append({"role": ROLES[role], "content": content})
    return out


def normalize(row: dict, cfg: DataConfig, row_type: type[Row] | None, where: str,
              guessed: set[tuple[str, str]] | None = None) -> dict:
    """Our field names, from the mapping, the chat shape and the usual column names (each name
    taken that way goes into `guessed` as (ours, theirs))."""
    for ours, theirs in cfg.fields.items():
        found, value = lookup(row, theirs)
        if found:
            if theirs in row and theirs != ours:
                row.pop(theirs)
            row[ours] = value
    if row_type is SFTExample:
        turns = row.get("messages", row.get("conversations"))
        if isinstance(turns, list) and "prompt" not in row:
            row["messages"] = as_messages(turns, row.pop("system", None), where)
            row.pop("conversations", None)
    if row_type is Problem:
        for ours, names in (("problem", PROBLEM_NAMES), ("answer", ANSWER_NAMES)):
            if ours not in row:
                theirs = next((n for n in names if n in row), None)
                if theirs is not None:
                    row[ours] = row.pop(theirs)
                    if guessed is not None:
                        guessed.add((ours, theirs))
        final_answer(row, cfg.answer_from)
        check_problem_fields(row, cfg, where)
    return row


def check_problem_fields(row: dict, cfg: DataConfig, where: str) -> None:
    """A problem row without `problem` or `answer` after mapping: one error that names the
    mapping key and spells it with one of the row's own columns."""
    lacking = next((f for f in ("problem", "answer") if f not in row), None)
    if lacking is None:
        return
    theirs = cfg.fields.get(lacking)
    said = (f'the mapping fields.{lacking}: {theirs} names no field of this row' if theirs
            else f'none of the usual names ({", ".join(NAMES[lacking])}) is there either')
    columns = [c for c in row if c not in ("id", "problem", "answer", "schema_version")]
    example = columns[-1] if columns else "COLUMN"
    raise shards.ShardError(
        f'{where}: missing field "{lacking}": {said}; the row has '
        f'{", ".join(columns) or "no other field"}. Map the column that holds it, e.g. '
        f"--field {lacking}={example} (eval bench), data.fields.{lacking}={example} (infer), or "
        f"fields: {{{lacking}: {example}}} under the data source in a config")


def final_answer(row: dict, answer_from: str | None = None) -> None:
    """Reduce a worked answer to the final one: GSM8K's `... #### 18` to `18`, a MATH-style
    `solution` (no `answer`), or the field `answer_from` names, to its last \\boxed{}."""
    from reasoner.data.answers import extract_answer

    if answer_from is not None and "answer" not in row:
        found, text = lookup(row, answer_from)
        row["answer"] = extract_answer(text) if found and isinstance(text, str) else None
    if "answer" not in row and isinstance(row.get("solution"), str):
        row["answer"] = extract_answer(row["solution"])
    if isinstance(row.get("answer"), str) and "####" in row["answer"]:
        row["answer"] = row["answer"].split("####")[-1].strip().replace(",", "")


def iter_rows(cfg: DataConfig, row_type: type[Row] | None = None) -> Iterator[dict]:
    """Rows one at a time (hub sets stream when `streaming` or `limit` is set), renamed
    through `cfg.fields` and validated against `row_type`."""
    stem = Path(cfg.path).stem if Path(cfg.path).exists() else cfg.path.replace("/", "_")
    stem += f"-{cfg.subset}" if cfg.subset else ""
    count = skipped = 0
    guessed: set[tuple[str, str]] = set()
    for where, row in _located(cfg):
        if "id" not in row and "id" not in cfg.fields and row_type is not None \
                and "id" in row_type.model_fields:
            row["id"] = f"{stem}-{count}"  # files without ids (the AIME jsonl files)
        said = set(guessed)
        row = normalize(row, cfg, row_type, where, guessed)
        for ours, theirs in sorted(guessed - said):  # once per source: which column became ours
            print(f'[data] {cfg.path}: "{ours}" read from the column "{theirs}" (a usual name; '
                  f"map another with fields: {{{ours}: COLUMN}})", file=sys.stderr)
        if cfg.answer_from is not None and row.get("answer") is None:
            skipped += 1  # no \boxed{} in the solution: no reference to verify against
            continue
        for key in ("id", "answer"):  # ids and reference answers are strings everywhere
            if key in row and isinstance(row[key], int | float) and not isinstance(row[key], bool):
                row[key] = str(row[key])
        yield shards.validate_row(row, row_type, where)
        count += 1
        if cfg.limit and count >= cfg.limit:
            break
    if skipped:
        print(f"[data] {cfg.path}: skipped {skipped} rows whose {cfg.answer_from} has no "
              f"\\boxed{{}} answer; kept {count}", file=sys.stderr)


def read_rows(cfg: DataConfig, row_type: type[Row] | None = None) -> list[dict]:
    """All rows, renamed through `cfg.fields` and validated against `row_type`."""
    return list(iter_rows(cfg, row_type))


def fingerprint(cfg: DataConfig) -> str:
    """A content hash of the data source (files' bytes; the id + split for hub datasets)."""
    h = hashlib.sha256(json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode())
    path = Path(cfg.path)
    files = shards.part_files(path) if path.is_dir() else [path] if path.is_file() else []
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023
                h.update(block)
    return h.hexdigest()[:16]
