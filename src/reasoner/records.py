"""Row types of every shard (docs/design.md, "Shard folders"). Every row carries `schema_version`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1


class Row(BaseModel):
    """Base row: unknown fields are kept (users add their own columns), the version is checked."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION

    @classmethod
    def key_of(cls, row: dict) -> Any:
        """The key that identifies a row within a shard folder (resume skips present keys)."""
        return row["id"]


class Problem(Row):
    """A problem with its reference answer (written by the user or `reasoner data synth`)."""

    id: str
    problem: str
    answer: str
    source: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    role: str
    content: str


class SFTExample(Row):
    """One supervised example: `prompt` + `response`, or a chat `messages` list."""

    id: str | None = None
    prompt: str | None = None
    response: str | None = None
    messages: list[ChatMessage] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> SFTExample:
        if self.messages is None and (self.prompt is None or self.response is None):
            raise ValueError("needs 'prompt' and 'response', or 'messages'")
        return self


class Sample(Row):
    """One generated answer; key (`id`, `sample_idx`)."""

    id: str
    sample_idx: int
    problem: str
    answer: str
    prompt: str
    response: str
    prompt_tokens: int
    response_tokens: int
    finish_reason: Literal["stop", "length", "abort", "error"]  # only "stop" ended by itself
    seed: int
    model: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    @classmethod
    def key_of(cls, row: dict) -> Any:
        return (row["id"], row["sample_idx"])


class Verified(Sample):
    """A Sample with its verdict, reward and group statistics."""

    extracted: str | None = None
    extracted_by: Literal["strict", "last_number"] | None = None  # verify.extraction: flexible
    verdict: Literal["correct", "incorrect", "no_answer", "invalid", "timeout"]
    reward: float
    verifier: Literal["rule", "judge"]
    judge_output: str | None = None
    group_size: int
    group_accuracy: float
    reasoning_tokens: int
