"""The generator protocol every backend implements, and the sampling transform they share.

Behaviour log-probs are log-probabilities of the sampled token under the distribution that was
actually sampled from: logits / temperature, then top-k, then top-p, renormalised. A
teacher-forced pass over prompt + response through `processed_logprobs` gives the same numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from reasoner.config import SamplingConfig


@dataclass(frozen=True)
class Request:
    """One sample to generate: key (id, sample_idx), the prompt as token ids, its own seed."""

    id: str
    sample_idx: int
    prompt_ids: list[int]
    seed: int
    max_tokens: int


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, the stop token included when there was one
    text: str  # decoded response without special tokens
    finish_reason: str  # "stop" | "length" | "abort" | "error" (vLLM)
    logprobs: list[float] | None = None  # behaviour log-prob of each token in token_ids


class Generator(Protocol):
    """What infer, eval and the judge need of a generation backend (hf, vllm)."""

    name: str
    tokenizer: Any  # the model's tokenizer (prompts are rendered and tokenized with it)
    context_window: int  # longest prompt + response the model takes
    preferred_batch: int  # requests the backend decodes together (hf: its batch size)

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """(index into `requests`, completion) for every request, as each one finishes: a
        caller writes results as they come, so no request waits for a slower neighbour."""
        ...

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[Completion]:
        """One completion per request, in request order (all of `stream`, reordered)."""
        ...

    def engine_info(self) -> dict[str, str]:
        """What generated: backend, engine and version, dtype, device; infer writes it into its
        manifest and an eval report names it (`Streaming` gives a default)."""
        ...

    def close(self) -> None:
        """Release the model (and its memory)."""
        ...


def in_order(stream: Iterator[tuple[int, Completion]], n: int) -> list[Completion]:
    """The n completions of a `stream`, in request order."""
    out: list[Completion | None] = [None] * n
    for i, c in stream:
        out[i] = c
    missing = [i for i, c in enumerate(out) if c is None]
    if missing:
        raise RuntimeError(f"the backend returned no completion for requests {missing[:5]}")
    return out  # type: ignore[return-value]


class Streaming:
    """A backend's `generate`, once: all of its `stream`, in request order."""

    def engine_info(self) -> dict[str, str]:
        """What generated: backend, engine and version, dtype, device (a report's numbers
        depend on them). Backends say more than this default."""
        return {"backend": getattr(self, "name", type(self).__name__)}

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[Completion]:
        return in_order(self.stream(requests, sampling), len(requests))  # type: ignore[attr-defined]


def sample_seed(run_seed: int, problem_id: str, sample_idx: int) -> int:
    """A 31-bit seed from (run seed, id, sample_idx): reruns repeat, shards never collide."""
    digest = hashlib.sha256(f"{run_seed}\x00{problem_id}\x00{sample_idx}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def transform_logits(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Temperature, then top-k, then top-p on (..., V) logits; removed tokens get -inf."""
    logits = logits.float()
    if temperature == 0:  # greedy: all mass on the argmax
        keep = logits == logits.max(-1, keepdim=True).values
        first = keep.cumsum(-1) == 1
        return torch.where(keep & first, 0.0, float("-inf"))
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # stable: of equal logits the lower token id counts as more likely, so a tie cut by
        # top-p is settled the same way by the candidate sampler (infer/sampling.py)
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # (..., V) mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p  # never drops the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def processed_logprobs(logits: Tensor, token_ids: Tensor, sampling: SamplingConfig) -> Tensor:
    """(T,) log-probs of `token_ids` under the transformed distribution of (T, V) `logits`."""
    t = transform_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return t.log_softmax(-1).gather(-1, token_ids[:, None])[:, 0]
