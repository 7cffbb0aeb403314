"""Row types: required fields, the keys resume relies on, user columns kept."""

import pytest
from pydantic import ValidationError

from reasoner.records import SCHEMA_VERSION, Problem, Sample, SFTExample, Verified

SAMPLE = {"id": "p1", "sample_idx": 3, "problem": "1+1?", "answer": "2", "prompt": "q",
          "response": "a", "prompt_tokens": 1, "response_tokens": 1, "finish_reason": "stop",
          "seed": 7, "model": "m"}


def test_a_problem_needs_its_answer_and_keeps_user_columns():
    p = Problem.model_validate({"id": "a", "problem": "x", "answer": "1", "difficulty": "hard"})
    assert p.schema_version == SCHEMA_VERSION and p.model_dump()["difficulty"] == "hard"
    with pytest.raises(ValidationError, match="answer"):
        Problem.model_validate({"id": "a", "problem": "x"})
    assert Problem.key_of({"id": "a"}) == "a"


def test_an_sft_example_is_a_prompt_and_response_or_messages():
    SFTExample.model_validate({"prompt": "q", "response": "a"})
    SFTExample.model_validate({"messages": [{"role": "user", "content": "q"}]})
    with pytest.raises(ValidationError, match="needs 'prompt' and 'response', or 'messages'"):
        SFTExample.model_validate({"prompt": "q"})


def test_samples_are_keyed_by_problem_and_index_and_verified_rows_need_a_verdict():
    assert Sample.key_of(SAMPLE) == Verified.key_of(SAMPLE) == ("p1", 3)
    with pytest.raises(ValidationError, match="finish_reason"):
        Sample.model_validate({**SAMPLE, "finish_reason": "eos"})
    verified = {**SAMPLE, "verdict": "correct", "reward": 1.0, "verifier": "rule",
                "group_size": 8, "group_accuracy": 0.5, "reasoning_tokens": 0}
    assert Verified.model_validate(verified).extracted is None
    with pytest.raises(ValidationError, match="verdict"):
        Verified.model_validate({**verified, "verdict": "maybe"})
