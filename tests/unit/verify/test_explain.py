"""`reasoner explain`: the extracted answer, what each side was read as, and why."""

import pytest
from tests_helpers import reasoner

from reasoner import shards
from reasoner.errors import InputError
from reasoner.records import Sample
from reasoner.verify.explain import explain


def sample(k: int, response: str, answer: str = "12", pid: str = "p1",
           finish_reason: str = "stop") -> Sample:
    return Sample(id=pid, sample_idx=k, problem="?", answer=answer, prompt="?", response=response,
                  prompt_tokens=1, response_tokens=len(response.split()),
                  finish_reason=finish_reason, seed=k, model="m")


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


def test_explain_reads_the_reference_and_names_a_cut_off_response(tmp_path):
    """Issue 51, finding 11: a sample without an answer still shows what the reference was read
    as, and one cut off at max_tokens says so rather than only 'no final answer'."""
    folder = tmp_path / "samples"
    shards.write_rows(folder, [sample(0, "It is twelve.", answer="\\frac{24}{2}"),
                               sample(1, "<think>First 3 + 4 is", answer="\\frac{24}{2}",
                                      finish_reason="length")])
    shards.finish(folder, {})
    rows = {r["sample_idx"]: r for r in explain(folder, "p1")}
    assert rows[0]["reference_read_as"] == "12" and rows[0]["answer_read_as"] is None
    assert rows[0]["reason"] == "no final answer" and rows[0]["ended"] == "by itself"
    assert rows[1]["reference_read_as"] == "12"
    cut = "cut off at the length limit (sampling.max_tokens) after 5 tokens"
    assert rows[1]["reason"] == f"no final answer: {cut}" and rows[1]["ended"] == cut
    out = reasoner("explain", folder, "p1", "--sample", "1")
    assert out.returncode == 0 and "cut off at the length limit" in out.stdout


def test_explain_names_the_filter_that_removed_an_id(tmp_path, tiny_model_dir):
    """Issue 51, finding 11: an id the zero-variance filter dropped is said to be filtered (and
    where its samples are), not 'no row with id'."""
    from reasoner import verify
    from reasoner.config import VerifyConfig

    samples = tmp_path / "samples"
    shards.write_rows(samples, [sample(0, "\\boxed{7}", pid="wrong"),
                                sample(1, "\\boxed{8}", pid="wrong"),
                                sample(0, "\\boxed{12}", pid="mixed"),
                                sample(1, "\\boxed{9}", pid="mixed")])
    shards.finish(samples, {})
    verified = verify.run(VerifyConfig(input_dir=samples, output_dir=tmp_path / "verified",
                                       workers=1, tokenizer=str(tiny_model_dir), progress=False))
    assert {r["id"] for r in shards.iter_rows(verified)} == {"mixed"}
    with pytest.raises(InputError) as err:
        explain(verified, "wrong")
    said = str(err.value)
    assert "not in this Verified shard" in said and "no row with id" not in said
    assert ("verify removed it by the filter 'zero variance (all correct or all wrong)' "
            "(filters.drop_zero_variance), with 0 of its 2 samples correct") in said
    assert f"reasoner explain {samples} wrong" in said
    with pytest.raises(InputError, match="no row with id 'nope'"):
        explain(verified, "nope")
