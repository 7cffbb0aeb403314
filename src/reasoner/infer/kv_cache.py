"""The hf backend's KV cache: transformers' `DynamicCache` whose full-attention layers keep one
buffer per layer, (rows, heads, capacity, head dim), that grows by doubling, and whose rows can
be refilled with another request's prompt in place (the continuous batch of `infer.decode`).

Every row writes its next token at the same column (`length`): a row's own keys sit right-aligned
before it, and the attention mask hides the columns to their left. `place` writes a freshly
prefilled prompt into chosen rows, `shift` moves every row's columns (to make room for a prompt
wider than the cache, or to drop columns no live row still attends to).
"""

from __future__ import annotations

import functools

import torch


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
            self.reserve(end, key_states, value_states)
            self.keys[..., self.length:end, :] = key_states
            self.values[..., self.length:end, :] = value_states
            self.length = end
            return self.keys[..., :end, :], self.values[..., :end, :]

        def reserve(self, end: int, key_like, value_like) -> None:
            """Room for `end` columns (the buffers take dtype and shape from the examples)."""
            if self.keys.numel() == 0 or end > self.keys.shape[-2]:
                self.keys = self._grown(self.keys, key_like, end)
                self.values = self._grown(self.values, value_like, end)

        def _grown(self, old, new, end: int):
            capacity = max(end, 2 * (old.shape[-2] if old.numel() else 0), 64)
            buf = new.new_zeros(*old.shape[:-2], capacity, new.shape[-1]) if old.numel() else \
                new.new_zeros(*new.shape[:-2], capacity, new.shape[-1])  # (B, H, capacity, D)
            if old.numel():
                buf[..., :self.length, :] = old[..., :self.length, :]
            return buf

        def place(self, rows: torch.Tensor, other: GrowingLayer, copies: torch.Tensor) -> None:
            """Rows `rows` take rows `copies` of `other` (a prefilled prompt group, no wider
            than this layer), right-aligned so that their next token goes to column `length`."""
            width = other.length
            self.keys[rows, :, self.length - width:self.length] = other.keys[copies, :, :width]
            self.values[rows, :, self.length - width:self.length] = other.values[copies, :, :width]

        def shift(self, by: int) -> None:
            """Every row's columns `by` to the right (> 0: room on the left) or left (< 0: the
            first -by columns dropped)."""
            end = self.length + by
            self.reserve(end, self.keys, self.values)
            if by > 0:
                self.keys[..., by:end, :] = self.keys[..., :self.length, :].clone()
                self.values[..., by:end, :] = self.values[..., :self.length, :].clone()
            else:
                self.keys[..., :end, :] = self.keys[..., -by:self.length, :].clone()
                self.values[..., :end, :] = self.values[..., -by:self.length, :].clone()
            self.length = end

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


def refillable(cache) -> bool:
    """Whether every layer of `cache` can take new rows in place (full attention only: a
    sliding-window layer keeps its own window and is not refilled; such a model decodes in
    batches that only shrink)."""
    growing = _growing_layer_class()
    return all(type(layer) is growing for layer in cache.layers)


def place(cache, rows: torch.Tensor, prefilled, copies: torch.Tensor) -> None:
    """`place` on every layer: rows `rows` of `cache` take rows `copies` of `prefilled`."""
    for mine, theirs in zip(cache.layers, prefilled.layers, strict=True):
        mine.place(rows, theirs, copies)


def shift(cache, by: int) -> None:
    for layer in cache.layers:
        layer.shift(by)


def length(cache) -> int:
    """Columns of the cache (what the attention mask spans)."""
    return cache.get_seq_length()
