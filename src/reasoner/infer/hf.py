"""`hf` backend: transformers `generate`, batched with left padding, on CPU or GPU.

`generate` keeps the KV cache, padding and stopping; the sampling itself happens in a logits
processor with one torch.Generator per sequence, seeded from (run seed, id, sample_idx). A
sample therefore does not depend on which other samples share its batch, and the processor
records the behaviour log-prob of every token it picks.
"""

from __future__ import annotations

from typing import Any

import torch

from reasoner.config import ModelConfig, SamplingConfig
from reasoner.data.template import stop_token_ids
from reasoner.infer.base import Completion, Request, transform_logits


class _Sampler:
    """A LogitsProcessor that samples each row with its own generator and records log-probs."""

    def __init__(self, seeds: list[int], sampling: SamplingConfig, device: torch.device):
        self.generators = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
        self.sampling = sampling
        self.logprobs: list[list[float]] = [[] for _ in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        logp = transform_logits(scores, s.temperature, s.top_k, s.top_p).log_softmax(-1)  # (B, V)
        probs = logp.exp().cpu()
        chosen = torch.empty(len(self.generators), dtype=torch.long)
        for i, g in enumerate(self.generators):
            chosen[i] = torch.multinomial(probs[i], 1, generator=g)[0]
            self.logprobs[i].append(float(logp[i, chosen[i]]))
        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(len(chosen)), chosen.to(scores.device)] = 0.0
        return forced  # greedy decoding over this picks exactly `chosen`


class HFGenerator:
    name = "hf"

    def __init__(self, cfg: ModelConfig, batch_size: int = 64, device: torch.device | None = None):
        from reasoner import models

        self.model, self.tokenizer = models.load_model(cfg, device)
        self.model.eval()
        self.context_window = int(self.model.config.max_position_embeddings)
        self.preferred_batch = batch_size  # padded batches: more rows waste compute on padding
        self.device = next(self.model.parameters()).device
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        # the chat template's end of turn too: a base model's generation config knows only eos
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | set(
            stop_token_ids(self.tokenizer))

    @torch.no_grad()
    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list[Completion]:
        from transformers import LogitsProcessorList

        if not requests:
            return []
        pad = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(requests):  # left padding
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        sampler = _Sampler([r.seed for r in requests], sampling, self.device)
        max_new = max(r.max_tokens for r in requests)
        kwargs: dict[str, Any] = {}
        if sampling.stop:
            kwargs.update(stop_strings=sampling.stop, tokenizer=self.tokenizer)
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            max_new_tokens=max_new, do_sample=False, logits_processor=LogitsProcessorList([sampler]),
            pad_token_id=pad, eos_token_id=sorted(self.eos_ids), num_beams=1,
            temperature=None, top_p=None, top_k=None, **kwargs,
        )[:, width:].cpu()
        return [self._completion(out[i].tolist(), sampler.logprobs[i], r, sampling)
                for i, r in enumerate(requests)]

    def _completion(self, tokens: list[int], logprobs: list[float], r: Request,
                    sampling: SamplingConfig) -> Completion:
        """The row's tokens up to and including what ended it: the first eos / end-of-turn
        token, or the token completing a stop string (generate pads a row it stopped on a
        string, and the pad may itself be an eos id: the stop string is looked for first)."""
        end = next((k + 1 for k, t in enumerate(tokens) if t in self.eos_ids), None)
        if sampling.stop:  # text keeps the stop string, like token_ids
            upto = end if end is not None else min(len(tokens), r.max_tokens)
            for k in range(1, upto + 1):
                if any(s in self.tokenizer.decode(tokens[:k]) for s in sampling.stop):
                    end = k
                    break
        finish = "stop" if end is not None else "length"
        tokens = tokens[:end] if end is not None else tokens[:r.max_tokens]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(tokens, text, finish, logprobs[:len(tokens)])

    def close(self) -> None:
        del self.model
