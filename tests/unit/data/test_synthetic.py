import re

import pytest

from reasoner import shards
from reasoner.config import SynthConfig
from reasoner.data import synthetic
from reasoner.records import Problem, SFTExample


def recompute(problem: str) -> int:
    """Answer of a synthetic problem, parsed from its words alone (independent of the generator)."""
    sentences = re.split(r"(?<=[.?])\s", problem)
    x = int(re.match(r"\w+ has (\d+) ", sentences[0]).group(1))
    for s in sentences[1:-1]:
        if m := re.fullmatch(r"\w+ buys (\d+) more \w+\.", s):
            x += int(m.group(1))
        elif m := re.fullmatch(r"\w+ gives away (\d+) \w+\.", s):
            x -= int(m.group(1))
        elif m := re.fullmatch(r"\w+ gets (\d+) boxes with (\d+) \w+ in each box\.", s):
            x += int(m.group(1)) * int(m.group(2))
        elif m := re.fullmatch(r"Then the number of \w+ becomes (\d+) times as large\.", s):
            x *= int(m.group(1))
        elif m := re.fullmatch(r"\w+ shares the \w+ equally among (\d+) friends and keeps one share\.", s):
            assert x % int(m.group(1)) == 0, problem
            x //= int(m.group(1))
        else:
            raise AssertionError(f"unparsed sentence {s!r}")
        assert x >= 0
    assert sentences[-1].startswith("How many")
    return x


def synth(tmp_path, **kw):
    cfg = SynthConfig(output_dir=tmp_path, **{"num_train": 400, "num_test": 100, **kw})
    synthetic.run(cfg)
    read = lambda name, t: list(shards.iter_rows(tmp_path / name, t))  # noqa: E731
    return read("train_problems", Problem), read("test_problems", Problem), read("sft", SFTExample)


def test_gold_answers_are_correct(tmp_path):
    train, test, sft = synth(tmp_path)
    for row in train + test:
        assert int(row["answer"]) == recompute(row["problem"])
    for row in sft:  # clean demonstrations: every line is true arithmetic, the box holds the answer
        body = re.search(r"<think>\n(.*)\n</think>", row["response"], re.S).group(1)
        for line in body.splitlines():
            a, op, b, _, c = line.split()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                    "/": int(a) / int(b)}[op] == int(c), line
        boxed = re.search(r"<answer>\\boxed\{(\d+)\}</answer>$", row["response"]).group(1)
        assert int(boxed) == recompute(row["prompt"])


def test_deterministic_under_seed(tmp_path):
    a = synth(tmp_path / "a", seed=5)
    b = synth(tmp_path / "b", seed=5)
    c = synth(tmp_path / "c", seed=6)
    assert a == b
    assert [r["id"] for r in a[0]] != [r["id"] for r in c[0]]
    assert (tmp_path / "a/sft/part-00000.jsonl").read_bytes() == (tmp_path / "b/sft/part-00000.jsonl").read_bytes()


def test_train_and_test_disjoint_in_arithmetic(tmp_path):
    cfg = SynthConfig(output_dir=tmp_path, num_train=2000, num_test=300)
    train, test = synthetic.generate(cfg)
    assert len(train) == 2000 and len(test) == 300
    assert not {p.signature() for p in train} & {p.signature() for p in test}
    assert not {synthetic.problem_text(p) for p in train} & {synthetic.problem_text(p) for p in test}
    assert len({synthetic.puzzle_id(p) for p in train + test}) == 2300


def test_levels_set_number_of_operations(tmp_path):
    train, _, _ = synth(tmp_path, levels=[3], num_train=50, num_test=5)
    assert all(r["meta"]["steps"] == 4 and r["meta"]["level"] == 3 for r in train)


def test_flawed_demonstrations_are_wrong_exactly_where_marked(tmp_path):
    _, _, sft = synth(tmp_path, flawed_fraction=0.3)
    flawed = [r for r in sft if r["flawed"]]
    assert len(flawed) == 120
    for row in sft:
        boxed = int(re.search(r"\\boxed\{(-?\d+)\}", row["response"]).group(1))
        assert (boxed != recompute(row["prompt"])) == row["flawed"]
        assert boxed >= 0


def test_rerun_same_config_is_a_no_op_and_other_config_refused(tmp_path):
    synth(tmp_path)
    mtime = (tmp_path / "sft/part-00000.jsonl").stat().st_mtime_ns
    synth(tmp_path)
    assert (tmp_path / "sft/part-00000.jsonl").stat().st_mtime_ns == mtime
    with pytest.raises(shards.ShardError, match="another config"):
        synth(tmp_path, seed=9)
    synth(tmp_path, seed=9, overwrite=True)


def test_impossible_request_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="distinct problems"):
        synthetic.generate(SynthConfig(output_dir=tmp_path, num_train=5000, num_test=10,
                                       levels=[0], max_start=3, max_operand=2))


@pytest.mark.parametrize("style", ["recheck", "detour"])
def test_verbose_demonstrations_add_a_line_per_step_with_the_same_answer(tmp_path, style):
    _, _, plain = synth(tmp_path / "plain")
    _, _, mixed = synth(tmp_path / "mixed", verbose_fraction=0.5, verbose_style=style)
    assert len(plain) == len(mixed) == 400
    verbose = 0
    for a, b in zip(plain, mixed, strict=True):
        assert a["id"] == b["id"] and a["prompt"] == b["prompt"]
        if a["response"] == b["response"]:
            continue
        verbose += 1
        lines = b["response"].split("\n")
        if style == "recheck":  # each repeats the line above it
            extra = [k for k in range(len(lines)) if lines[k].startswith("check: ")]
            assert all(lines[k].removeprefix("check: ") == lines[k - 1] for k in extra)
        else:  # after the last step: a line of two asides per step, in turn, no digits
            extra = [k for k in range(len(lines)) if lines[k].startswith(synthetic.DETOURS)]
            assert [lines[k] for k in extra] == [
                f"{synthetic.DETOURS[j % 3]} {synthetic.DETOURS[(j + 1) % 3]}" for j in range(len(extra))]
            assert extra == list(range(extra[0], extra[0] + len(extra)))
            assert lines[extra[-1] + 1].startswith("</think>")
        # one per operation; drop them and the concise demonstration (and its answer) is left
        operations = len(re.split(r"(?<=[.?])\s", a["prompt"])) - 2
        assert len(extra) == operations
        assert "\n".join(x for k, x in enumerate(lines) if k not in extra) == a["response"]
    assert verbose == 200
