"""Synthetic multi-step arithmetic word problems with exact gold answers.

The task a tiny model learns to reason on in minutes on a CPU. A problem starts a person with a
quantity and applies L+1 operations (level L) worded as events: buying more, giving some away,
getting boxes of several each, doubling, sharing equally. The worked solution writes one
equation per line inside the think tags and the answer boxed inside the answer tags, so a
model that slips once gets the final answer wrong: ideal material for outcome-reward RL.

Problems are deduplicated on their arithmetic (start value and operations), so the train and
test splits never share a computation, whatever names and items the wording uses.
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from reasoner import outputs, shards
from reasoner.config import SynthConfig, dump
from reasoner.data.template import render_response
from reasoner.errors import ConfigError
from reasoner.records import Problem, SFTExample

NAMES = [
    ("Mia", "she"), ("Leo", "he"), ("Ana", "she"), ("Sam", "he"), ("Zoe", "she"), ("Max", "he"),
    ("Ivy", "she"), ("Ben", "he"), ("Eva", "she"), ("Tom", "he"), ("Lia", "she"), ("Jon", "he"),
]
ITEMS = ["apples", "marbles", "stickers", "coins", "books", "pencils", "cookies", "shells",
         "stamps", "cards", "beads", "plums"]


@dataclass(frozen=True)
class Op:
    kind: str  # add | sub | groups | mul | div
    a: int
    b: int = 0  # second number (groups: items per box)


@dataclass
class Puzzle:
    start: int
    ops: list[Op]
    name: str
    pronoun: str
    item: str
    level: int
    values: list[int] = field(default_factory=list)  # quantity after each op

    @property
    def answer(self) -> int:
        return self.values[-1]

    def signature(self) -> str:
        return f"{self.start}|" + ";".join(f"{o.kind}:{o.a}:{o.b}" for o in self.ops)


def apply(op: Op, x: int, cap: int) -> int | None:
    """The quantity after `op`, or None when it would leave the whole numbers 0..cap."""
    if op.kind == "add":
        y = x + op.a
    elif op.kind == "sub":
        y = x - op.a
    elif op.kind == "groups":
        y = x + op.a * op.b
    elif op.kind == "mul":
        y = x * op.a
    elif op.kind == "div":
        if x % op.a:
            return None
        y = x // op.a
    else:
        raise ValueError(op.kind)
    return y if 0 <= y <= cap else None


def _random_op(rng: random.Random, x: int, max_operand: int, cap: int) -> Op:
    while True:
        kind = rng.choice(["add", "sub", "groups", "mul", "div"])
        if kind == "groups":
            op = Op(kind, rng.randint(2, max_operand), rng.randint(2, max_operand))
        elif kind in ("mul", "div"):
            op = Op(kind, rng.randint(2, 3))
        else:
            op = Op(kind, rng.randint(2, max(2, max_operand * 2)))
        if apply(op, x, cap) is not None and not (kind == "div" and x == 0):
            return op


def make_puzzle(rng: random.Random, level: int, max_start: int, max_operand: int,
                max_value: int) -> Puzzle:
    name, pronoun = rng.choice(NAMES)
    x = start = rng.randint(2, max_start)
    ops, values = [], []
    for _ in range(level + 1):
        op = _random_op(rng, x, max_operand, max_value)
        x = apply(op, x, max_value)
        ops.append(op)
        values.append(x)
    return Puzzle(start, ops, name, pronoun, rng.choice(ITEMS), level, values)


def problem_text(p: Puzzle) -> str:
    """The word problem. Each operation has exactly one wording (tests parse it back)."""
    he = p.pronoun.capitalize()
    lines = [f"{p.name} has {p.start} {p.item}."]
    for op in p.ops:
        lines.append({
            "add": f"{he} buys {op.a} more {p.item}.",
            "sub": f"{he} gives away {op.a} {p.item}.",
            "groups": f"{he} gets {op.a} boxes with {op.b} {p.item} in each box.",
            "mul": f"Then the number of {p.item} becomes {op.a} times as large.",
            "div": f"{he} shares the {p.item} equally among {op.a} friends and keeps one share.",
        }[op.kind])
    lines.append(f"How many {p.item} does {p.name} have now?")
    return " ".join(lines)


# Content-free asides of a "detour" demonstration: a line of two per step, all after the last
# step (about 20 tokens per step). Placed between the steps they would not be free: a tiny
# model uses the extra positions to compute (measured: asides between steps made the verbose
# answers 71% right against 57.5% for the concise ones). After the last step nothing is left
# to compute, only the answer to copy. The "re-check" style repeats each step instead, which
# is a second try at it.
DETOURS = ("wait, let me make sure I read that right.", "hmm, that seems fine.", "ok, moving on.")


def detour(step: int) -> str:
    return f"{DETOURS[step % len(DETOURS)]} {DETOURS[(step + 1) % len(DETOURS)]}"


def solution_lines(p: Puzzle, slip_at: int | None = None, slip: int = 0,
                   verbose: str | None = None) -> tuple[list[str], int]:
    """One equation per line; `slip_at` adds `slip` to that step's result (a flawed
    demonstration); `verbose` adds a line after each step: "recheck" repeats the step as
    `check: ...`, "detour" ends with a line of two DETOURS per step (redundant reasoning
    either way)."""
    x, lines = p.start, []
    for i, op in enumerate(p.ops):
        if op.kind == "groups":
            lines.append(f"{op.a} * {op.b} = {op.a * op.b}")
            y, expr = x + op.a * op.b, f"{x} + {op.a * op.b}"
        elif op.kind == "add":
            y, expr = x + op.a, f"{x} + {op.a}"
        elif op.kind == "sub":
            y, expr = x - op.a, f"{x} - {op.a}"
        elif op.kind == "mul":
            y, expr = x * op.a, f"{x} * {op.a}"
        else:
            y, expr = x // op.a, f"{x} / {op.a}"
        if i == slip_at:
            y += slip
        lines.append(f"{expr} = {y}")
        if verbose == "recheck":
            lines.append(f"check: {expr} = {y}")
        elif verbose not in (None, "detour"):
            raise ValueError(f"unknown verbose style {verbose!r}")
        x = y
    if verbose == "detour":
        lines += [detour(i) for i in range(len(p.ops))]
    return lines, x


def _slip(rng: random.Random, p: Puzzle) -> tuple[int, int]:
    """A step and a small nonzero error for a flawed demonstration.

    The step is at or after the last division, so no later division meets a wrong value that
    does not divide; the error never makes the quantity negative.
    """
    divs = [i for i, op in enumerate(p.ops) if op.kind == "div"]
    step = rng.randrange(divs[-1] if divs else 0, len(p.ops))
    slip = rng.choice([-3, -2, -1, 1, 2, 3])
    return step, abs(slip) if p.values[step] + slip < 0 else slip


def generate(cfg: SynthConfig) -> tuple[list[Puzzle], list[Puzzle]]:
    """(train, test) puzzles, deterministic in `cfg.seed`, unique on their arithmetic."""
    rng = random.Random(cfg.seed)
    wanted = cfg.num_train + cfg.num_test
    seen: set[str] = set()
    puzzles: list[Puzzle] = []
    attempts = 0
    while len(puzzles) < wanted:
        attempts += 1
        if attempts > 50 * wanted + 1000:
            raise ConfigError(
                f"only {len(puzzles)} distinct problems found for {wanted} requested; "
                "raise max_start / max_operand, add levels, or ask for fewer problems"
            )
        p = make_puzzle(rng, rng.choice(cfg.levels), cfg.max_start, cfg.max_operand,
                        cfg.max_value)
        if p.signature() not in seen:
            seen.add(p.signature())
            puzzles.append(p)
    return puzzles[cfg.num_test:], puzzles[: cfg.num_test]


def puzzle_id(p: Puzzle) -> str:
    return "syn-" + hashlib.sha1(p.signature().encode()).hexdigest()[:12]


def to_problem(p: Puzzle, split: str) -> Problem:
    return Problem(
        id=puzzle_id(p), problem=problem_text(p), answer=str(p.answer), source=f"synthetic/{split}",
        meta={"level": p.level, "steps": len(p.ops)},
    )


def run(cfg: SynthConfig) -> dict[str, Path]:
    """Write `train_problems/`, `test_problems/` (Problem shards) and `sft/` (SFT shard).

    Rerunning with the same config finds the finished folders and returns them untouched
    (overwrite=true writes them again); a folder holding anything else is refused.
    """
    if not cfg.levels or min(cfg.levels) < 0:
        raise ConfigError("levels must be a non-empty list of integers >= 0")
    out = Path(cfg.output_dir)
    outputs.check_is_folder(out)
    folders = {"train_problems": out / "train_problems", "test_problems": out / "test_problems",
               "sft": out / "sft"}
    own = (*outputs.EVERY_STAGE, *outputs.WRITES["data synth"])
    if not any(shards.read_manifest(f) for f in folders.values() if f.is_dir()):
        outputs.refuse_users_entries(out, "data synth", own)  # not a folder synth made
    elif cfg.overwrite and (kept := outputs.users_entries(out, own)):
        print(outputs.said_kept("data synth", out, kept), file=sys.stderr)
    config = dump(cfg)
    if not cfg.overwrite and all(shards.finished(f, config) for f in folders.values()):
        return folders
    manifests = {name: shards.read_manifest(f) for name, f in folders.items()}
    stale = [str(folders[n]) for n, m in manifests.items() if m and m.get("config") != config]
    if stale and not cfg.overwrite:
        raise shards.ShardError(
            f"{', '.join(stale)} hold data written with another config; "
            "pass overwrite=true or choose another output_dir"
        )
    started = time.perf_counter()
    train, test = generate(cfg)
    for split, puzzles in (("train", train), ("test", test)):
        folder = folders[f"{split}_problems"]
        shards.reset(folder, "data synth", config)
        shards.write_rows(folder, (to_problem(p, split) for p in puzzles))
        shards.finish(folder, {"problems": len(puzzles)})
    rng = random.Random(cfg.seed + 1)
    flawed = set(rng.sample(range(len(train)), round(cfg.flawed_fraction * len(train))))
    # drawn from its own generator: verbose_fraction 0 leaves every other shard byte-identical
    verbose = set(random.Random(cfg.seed + 2).sample(range(len(train)),
                                                     round(cfg.verbose_fraction * len(train))))
    rows = []
    for i, p in enumerate(train):
        slip_at, slip = _slip(rng, p) if i in flawed else (None, 0)
        lines, final = solution_lines(p, slip_at, slip,
                                      verbose=cfg.verbose_style if i in verbose else None)
        rows.append(SFTExample(id=puzzle_id(p), prompt=problem_text(p),
                               response=render_response("\n".join(lines), str(final), cfg.template),
                               flawed=i in flawed))
    shards.reset(folders["sft"], "data synth", config)
    shards.write_rows(folders["sft"], rows)
    shards.finish(folders["sft"], {"examples": len(rows), "flawed": len(flawed),
                                   "verbose": len(verbose)},
                  seconds=round(time.perf_counter() - started, 3))
    return folders
