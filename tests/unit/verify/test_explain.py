"""`reasoner explain`: the extracted answer, what each side was read as, and why."""

import pytest
from tests_helpers import reasoner

from reasoner import shards
from reasoner.errors import InputError
from reasoner.records import Sample
from reasoner.verify.explain import explain


def sample(k: int, response: str, answer: str = "12") -> Sample:
    return Sample(id="p1", sample_idx=k, problem="?", answer=answer, prompt="?", response=response,
                  prompt_tokens=1, response_tokens=1, finish_reason="stop", seed=k, model="m")


@pytest.fixture()
def shard(tmp_path):
    folder = tmp_path / "samples"
    shards.write_rows(folder, [sample(0, "<answer>\\boxed{12 meters}</answer>"),
                               sample(1, "<answer>\\boxed{12x}</answer>"),
                               sample(2, "I think it is twelve")])
    shards.finish(folder, {})
    return folder


def test_explain_says_what_was_read_and_why(shard):
    rows = {r["sample_idx"]: r for r in explain(shard, "p1")}
    assert rows[0]["extracted"] == "12 meters" and rows[0]["rule"] == "correct"
    assert rows[0]["reason"] == "plain numbers equal" and rows[0]["answer_read_as"] == "12"
    assert rows[1]["rule"] == "incorrect" and rows[1]["answer_read_as"] == "12*x"
    assert rows[2]["extracted"] is None and rows[2]["reason"] == "no final answer"
    assert [r["sample_idx"] for r in explain(shard, "p1", 1)] == [1]
    with pytest.raises(InputError, match="no row with id 'nope'"):
        explain(shard, "nope")


def test_explain_cli(shard):
    out = reasoner("explain", shard, "p1", "--sample", "1")
    assert out.returncode == 0, out.stderr
    assert "12x" in out.stdout and "incorrect" in out.stdout
