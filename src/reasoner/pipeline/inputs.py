"""What a recipe needs from outside itself, checked before its first stage runs.

Each stage reads inputs: a model, problems, an SFT set, a verified shard, a judge, a corpus.
Those another stage of the recipe writes (inside RUN_DIR/<stage>/) are the recipe's own; every
other one must exist now (a local path) or be a well-formed hub id, else `reasoner run` (and
`--dry-run`) stops before any work with the name of what is missing and how to make it.

A form is not a presence: `--dry-run` also asks the hub for each hub id a stage still to run
reads (one look-up each, at once, 5 s at most), and stops on one the hub does not hold, or one it
cannot be asked for and this machine has not cached (a stage would fail on it after its retries,
perhaps hours into the recipe). With HF_HUB_OFFLINE set it looks in the local caches only.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reasoner import hub
from reasoner.errors import ConfigError


def _made_here(value: str, outputs: list[Path]) -> bool:
    path = Path(value)
    return any(path == out or out in path.parents for out in outputs)


def _outside(stages: list, run_dir: Path) -> list[tuple]:
    """(stage, key, value, kind) of every input no stage makes, once per key and value."""
    outputs = [s.out for s in stages] + [Path(run_dir) / "configs"]
    found, seen = [], set()
    for stage in stages:
        if stage.command == "compare":  # its reports are its own stages'
            continue
        for i in stage.config.inputs():
            if _made_here(i.value, outputs) or (i.key, i.value) in seen:
                continue  # made by a stage, or already seen for an earlier one
            seen.add((i.key, i.value))
            found.append((stage, i.key, i.value, i.kind))
    return found


def missing_inputs(stages: list, run_dir: Path) -> list[str]:
    """One line per input that no stage makes and that cannot be had: `stage.key=value: why`.
    Each stage's config names its inputs (`inputs()`)."""
    lines = []
    for stage, key, value, kind in _outside(stages, run_dir):
        cached = hub.offline() and hub.is_hub_id(value) and hub.in_cache(value, kind)
        why = hub.missing(value, f"{stage.name}: {key}", kind, cached)
        if why is None and kind == "file" and not Path(value).exists():
            why = f"{stage.name}: {key}={value}: no such file"
        if why:
            lines.append(why)
    return lines


def on_hub(stages: list, run_dir: Path, echo=print) -> list[str]:
    """Ask the hub for every hub id the stages still to run read; one line per id it does not
    hold or cannot be asked for (and is not cached here), and a line said of what was asked."""
    from reasoner.data.sources import BUILDERS  # `json` + data_files: datasets' own loader

    wanted = {}
    for stage, key, value, kind in _outside([s for s in stages if s.works], run_dir):
        if kind in ("model folder", "file or folder") and hub.is_hub_id(value) and \
                not Path(value).exists() and not (kind != "model folder" and value in BUILDERS):
            wanted.setdefault((value, kind), f"{stage.name}: {key}={value}")
    if not wanted:
        return []
    if hub.offline():
        echo(f"[inputs] {len(wanted)} hub id(s) looked up in this machine's caches only "
             "(HF_HUB_OFFLINE is set)")
        return []
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda item: hub.lookup(*item), wanted))
    lines, cached = [], []
    for (value, kind), answer in zip(wanted, answers, strict=True):
        if answer is None:
            continue
        verdict, why = answer
        if verdict == "unreachable" and hub.in_cache(value, kind):
            cached.append(value)
            continue
        if verdict == "unreachable":
            why += ", and it is not in this machine's hub cache"
        lines.append(f"{wanted[value, kind]}: {why}")
    asked = len(wanted) - len(lines) - len(cached)
    echo(f"[inputs] asked the hub for {len(wanted)} id(s): {asked} found"
         + (f", {len(cached)} not reachable but cached here ({', '.join(cached)})" if cached
            else "") + (f", {len(lines)} not to be had" if lines else ""))
    return lines


def check(stages: list, run_dir: Path, ask_hub: bool = False, echo=print) -> None:
    """Stop before the first stage when an outside input is missing (see the module doc);
    `ask_hub`: ask the hub too (`on_hub`)."""
    lines = missing_inputs(stages, run_dir)
    if ask_hub:
        lines += on_hub(stages, run_dir, echo)
    if lines:
        raise ConfigError(
            "the recipe needs inputs that no stage of it makes and that cannot be had here:\n  "
            + "\n  ".join(lines) + "\nmake them first (a model: `reasoner model import` or a "
            "hub id; problems: a .jsonl of id / problem / answer, or a hub dataset with "
            "data.fields and data.answer_from), or point the key at them: "
            "reasoner run RECIPE STAGE.key=value. A hub id the hub could not be asked for: "
            "download it where the hub is reachable and set HF_HUB_OFFLINE=1 here")
