"""The hf backend's decode loop: a continuous batch, sampled row by row from each request's own
stream of uniforms, its results released in a canonical order.

The batch stays full: a row that stops (eos, end of turn, a stop string, its max_tokens) is
dead until enough rows are dead (`refill`), and then the next waiting requests take their
places, their distinct prompts prefilled together in one forward (the n samples of a problem
share one prompt: prefilled once, its cache copied) and written into the dead rows of the KV
cache in place (`kv_cache.place`). Columns that no live row attends to any more are dropped
from the front of the cache once they are half of it; when nothing waits, dead rows leave the
batch once they are half of it. The stop test runs on tensors (one host read per step, not one
per row), except for stop strings, which need the text.

Row b's token at step s is drawn with uniform s of request b's stream (`sampling.uniform_stream`,
from its seed), so which requests share a batch changes no sample (beyond float rounding of
batch shapes). Results are released in the order the earlier static batches wrote them
(`InOrder`), whatever order they finish in, because verify keeps a shard's order and the
trainer draws its batches from it by index: a shard, and a model trained on it, do not change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import torch

from reasoner.config import SamplingConfig
from reasoner.infer import kv_cache
from reasoner.infer.base import Request
from reasoner.infer.sampling import sample_rows, uniform_stream

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]


class InOrder:
    """Finished requests released in the canonical order: chunks of `chunk` requests in request
    order; within a chunk, by tokens sampled until the row stopped, then request index. A result
    waits only for requests of its chunk that could still come before it."""

    def __init__(self, n: int, chunk: int):
        self.n, self.chunk, self.start = n, chunk, 0
        self.done: dict[int, tuple[int, object]] = {}  # request -> (tokens sampled, result)
        self.released: set[int] = set()  # of the current chunk

    def finish(self, i: int, sampled: int, result: object) -> None:
        self.done[i] = (sampled, result)

    def ready(self, least: Callable[[int], int]) -> Iterator[tuple[int, object]]:
        """(request, result) pairs that can go now; `least(j)` is the fewest tokens unfinished
        request j can end with."""
        while self.done and self.start < self.n:
            chunk = range(self.start, min(self.start + self.chunk, self.n))
            waiting = [(least(j), j) for j in chunk if j not in self.done
                       and j not in self.released]
            first = min(waiting, default=(float("inf"), self.n))
            ours = sorted((self.done[j][0], j) for j in chunk if j in self.done)
            for key in ours:
                if key >= first:
                    return
                self.released.add(key[1])
                yield key[1], self.done.pop(key[1])[1]
            if waiting:
                return
            self.start, self.released = chunk.stop, set()


class Rows:
    """The running batch's per-row state as tensors (R rows), plus which request each row holds
    (-1: dead) and the KV cache's column of each row's first token."""

    def __init__(self, device: torch.device):
        self.device = device
        self.request: list[int] = []
        self.first_column: list[int] = []
        self.started: list[int] = []  # the step at which each row sampled its first token
        t = dict(device=device)
        self.start = torch.zeros(0, dtype=torch.long, **t)  # (R,) same as started
        self.limit = torch.zeros(0, dtype=torch.long, **t)  # (R,) max_tokens
        self.live = torch.zeros(0, dtype=torch.bool, **t)  # (R,)
        self.position = torch.zeros(0, dtype=torch.long, **t)  # (R,) of the token fed next
        self.uniforms = torch.zeros(0, 0, dtype=torch.float64, **t)  # (R, width)
        self.tokens = torch.zeros(0, 0, dtype=torch.long, **t)  # (R, width)
        self.logprobs = torch.zeros(0, 0, **t)  # (R, width) float32
        self.mask = torch.zeros(0, 0, dtype=torch.long, **t)  # (R, capacity) of the KV cache

    def grow(self, rows: int, width: int) -> None:
        """`rows` more (dead) rows."""
        def more(x, fill=0):
            return torch.cat([x, x.new_full((rows, *x.shape[1:]), fill)])
        self.request += [-1] * rows
        self.first_column += [0] * rows
        self.started += [0] * rows
        self.start, self.limit, self.live = more(self.start), more(self.limit), more(self.live)
        self.position, self.mask = more(self.position), more(self.mask)
        if self.uniforms.shape[1] != width:
            self.uniforms = self.uniforms.new_zeros(0, width)
            self.tokens = self.tokens.new_zeros(0, width)
            self.logprobs = self.logprobs.new_zeros(0, width)
        self.uniforms, self.tokens = more(self.uniforms), more(self.tokens)
        self.logprobs = more(self.logprobs)

    def keep(self, rows: list[int]) -> None:
        """Only `rows`, in that order."""
        index = torch.tensor(rows, device=self.device)
        for name in ("start", "limit", "live", "position", "uniforms", "tokens", "logprobs",
                     "mask"):
            setattr(self, name, getattr(self, name)[index])
        self.request = [self.request[r] for r in rows]
        self.first_column = [self.first_column[r] for r in rows]
        self.started = [self.started[r] for r in rows]

    def dead(self) -> list[int]:
        return [r for r, i in enumerate(self.request) if i < 0]

    def mask_columns(self, columns: int) -> None:
        """Room in the mask for `columns` columns (it doubles)."""
        if columns > self.mask.shape[1]:
            wider = self.mask.new_zeros(len(self.request), max(columns, 2 * self.mask.shape[1]))
            wider[:, :self.mask.shape[1]] = self.mask
            self.mask = wider


def decode(forward: Forward, new_cache: Callable[[], object], requests: list[Request],
           sampling: SamplingConfig, batch: int, pad: int, eos_ids: set[int],
           device: torch.device, stopped_on_text: Callable[[list[int]], bool] | None = None
           ) -> Iterator[tuple[int, list[int], list[float]]]:
    """(request index, sampled tokens, their log-probs) of every request, up to and including
    what stopped it, in the canonical order (`InOrder` with chunks of `batch`).

    `forward(ids, mask, positions, cache)` gives (B, V) float logits of the last position;
    `stopped_on_text(tokens)` says whether a row's tokens end in a stop string."""
    loop = Decoder(forward, new_cache, requests, sampling, batch, pad, device)
    eos = torch.tensor(sorted(eos_ids), device=device)
    while loop.waiting or loop.rows is not None and bool(loop.rows.live.any()):
        loop.top_up()
        rows = loop.rows
        assert rows is not None and loop.logits is not None
        made = (loop.step - rows.start).clamp_(0, loop.width - 1)  # (R,) sampled before
        u = rows.uniforms.gather(1, made[:, None])[:, 0]  # (R,)
        chosen, lp = sample_rows(loop.logits, u, sampling)  # (R,), (R,)
        rows.tokens.scatter_(1, made[:, None], chosen[:, None])
        rows.logprobs.scatter_(1, made[:, None], lp[:, None])
        stop = rows.live & (torch.isin(chosen, eos) | (made + 1 >= rows.limit))  # (R,)
        if stopped_on_text is not None:  # the text is needed: one host check per live row
            for row, live in enumerate(rows.live.tolist()):
                if live and stopped_on_text(rows.tokens[row, :loop.sampled(row)].tolist()):
                    stop[row] = True
        if bool(stop.any()):  # the one host read of a step
            loop.finish(stop)
        yield from loop.ready()
        loop.step += 1
        if bool(rows.live.any()):
            loop.advance(chosen)


class Decoder:
    """The state of `decode`'s loop: the rows, their KV cache, the logits of the next step."""

    def __init__(self, forward: Forward, new_cache: Callable[[], object],
                 requests: list[Request], sampling: SamplingConfig, batch: int, pad: int,
                 device: torch.device):
        self.forward, self.new_cache, self.requests = forward, new_cache, requests
        self.batch, self.pad, self.device = batch, pad, device
        self.order = InOrder(len(requests), batch)
        self.waiting = deque(range(len(requests)))
        self.width = max((r.max_tokens for r in requests), default=1)
        self.refill = max(1, batch // 8)  # dead rows that call for a prefill of new requests
        self.rows: Rows | None = None
        self.cache = None
        self.logits: torch.Tensor | None = None  # (R, V)
        self.step = 0

    def sampled(self, row: int) -> int:
        """Tokens row `row` has sampled, this step's included."""
        assert self.rows is not None
        return self.step - self.rows.started[row] + 1

    def top_up(self) -> None:
        """Waiting requests into dead rows, when enough are dead (or all: a fresh batch)."""
        if self.rows is not None and not bool(self.rows.live.any()):
            self.rows = self.cache = self.logits = None
        dead = self.rows.dead() if self.rows is not None else []
        if not self.waiting or self.rows is not None and not (
                kv_cache.refillable(self.cache) and len(dead) >= min(self.refill, len(self.waiting))):
            return
        group = [self.waiting.popleft()
                 for _ in range(min(len(dead) if self.rows is not None else self.batch,
                              len(self.waiting)))]
        prefilled, logits, columns = _prefill(self.forward, self.new_cache, self.requests, group,
                                              self.pad, self.device)
        if self.rows is None:
            self.rows, self.cache, self.logits = Rows(self.device), prefilled, logits
            self.rows.grow(len(group), self.width)
            copies = torch.tensor(columns["copies"], device=self.device)
            self.cache.batch_select_indices(copies)
            self.rows.mask_columns(columns["width"])
            self.rows.mask[:, :columns["width"]] = columns["mask"][copies]
            targets = list(range(len(group)))
        else:
            assert self.logits is not None
            targets = dead[:len(group)]
            _admit(self.rows, self.cache, prefilled, columns, targets)
            self.logits[targets] = logits
        self._start(targets, group)

    def _start(self, targets: list[int], group: list[int]) -> None:
        rows, requests = self.rows, [self.requests[i] for i in group]
        assert rows is not None
        end = kv_cache.length(self.cache)
        for row, i, r in zip(targets, group, requests, strict=True):
            rows.request[row], rows.started[row] = i, self.step
            rows.first_column[row] = end - len(r.prompt_ids)
            rows.uniforms[row, :r.max_tokens] = uniform_stream(r.seed, r.max_tokens)
        t = torch.tensor(targets, device=self.device)
        rows.start[t], rows.live[t] = self.step, True
        rows.limit[t] = torch.tensor([r.max_tokens for r in requests], device=self.device)
        rows.position[t] = torch.tensor([len(r.prompt_ids) for r in requests], device=self.device)

    def finish(self, stop: torch.Tensor) -> None:
        """Rows `stop` (R,) bool have stopped: their results to the order, the rows dead."""
        rows = self.rows
        assert rows is not None
        for row in stop.nonzero()[:, 0].tolist():
            n = self.sampled(row)
            self.order.finish(rows.request[row], n, (rows.tokens[row, :n].tolist(),
                                                     rows.logprobs[row, :n].tolist()))
            rows.request[row] = -1
        rows.live &= ~stop

    def ready(self) -> Iterator[tuple[int, list[int], list[float]]]:
        rows = self.rows
        assert rows is not None
        where = {i: row for row, i in enumerate(rows.request) if i >= 0}
        for i, (tokens, logprobs) in self.order.ready(  # type: ignore[misc]
                lambda j: self.sampled(where[j]) + 1 if j in where else 1):
            yield i, tokens, logprobs

    def advance(self, chosen: torch.Tensor) -> None:
        """One forward of every row's newest token (dead rows too, until they are refilled or
        are half the batch with nothing to refill them)."""
        rows = self.rows
        assert rows is not None
        if (not self.waiting or not kv_cache.refillable(self.cache)) \
                and 2 * len(rows.dead()) >= len(rows.request):
            keep = [r for r, i in enumerate(rows.request) if i >= 0]
            rows.keep(keep)
            index = torch.tensor(keep, device=self.device)
            self.cache.batch_select_indices(index)
            chosen = chosen[index]
        _drop_unused_columns(rows, self.cache)
        column = kv_cache.length(self.cache)
        rows.mask_columns(column + 1)
        rows.mask[:, column] = 1
        position = torch.where(rows.live, rows.position, 0)[:, None]  # (R, 1)
        self.logits = self.forward(chosen[:, None], rows.mask[:, :column + 1], position,
                                   self.cache)  # (R, V)
        rows.position += 1


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both (P, W): the prompts right-aligned, pad on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, p in enumerate(prompts):
        ids[k, width - len(p):] = torch.tensor(p)
        mask[k, width - len(p):] = 1
    return ids, mask


def _prefill(forward: Forward, new_cache: Callable[[], object], requests: list[Request],
             group: list[int], pad: int, device: torch.device) -> tuple[object, torch.Tensor, dict]:
    """One forward over the distinct prompts of `group`: (its cache, (G, V) logits of each
    request's last prompt position, {copies: the prompt row of each request, width, mask})."""
    prompts = list(dict.fromkeys(tuple(requests[i].prompt_ids) for i in group))
    which = {p: k for k, p in enumerate(prompts)}
    copies = [which[tuple(requests[i].prompt_ids)] for i in group]
    ids, mask = left_padded([list(p) for p in prompts], pad)  # (P, W)
    cache = new_cache()
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_(min=0)  # (P, W)
    logits = forward(ids, mask, positions, cache)  # (P, V)
    index = torch.tensor(copies, device=device)
    return cache, logits[index], {"copies": copies, "width": ids.shape[1], "mask": mask}


def _admit(rows: Rows, cache, prefilled, columns: dict, targets: list[int]) -> None:
    """Dead rows `targets` take the prefilled prompts, right-aligned at the cache's end."""
    width = columns["width"]
    if width > kv_cache.length(cache):  # a prompt wider than the cache: room on the left
        by = width - kv_cache.length(cache)
        kv_cache.shift(cache, by)
        rows.mask_columns(kv_cache.length(cache))
        rows.mask[:, by:kv_cache.length(cache)] = rows.mask[:, :kv_cache.length(cache) - by].clone()
        rows.mask[:, :by] = 0
        rows.first_column = [c + by for c in rows.first_column]
    end = kv_cache.length(cache)
    t = torch.tensor(targets, device=rows.mask.device)
    copies = torch.tensor(columns["copies"], device=rows.mask.device)
    kv_cache.place(cache, t, prefilled, copies)
    rows.mask[t] = 0
    rows.mask[t, end - width:end] = columns["mask"][copies]


def _drop_unused_columns(rows: Rows, cache) -> None:
    """Drop the cache's first columns once no live row attends to them and they are at least
    half of it (each column is moved at most about once per doubling: amortised)."""
    if not kv_cache.refillable(cache):  # a sliding window keeps its own columns
        return
    live = [c for c, i in zip(rows.first_column, rows.request, strict=True) if i >= 0]
    unused = min(live, default=0)
    if unused < 64 or 2 * unused < kv_cache.length(cache):
        return
    end = kv_cache.length(cache)
    kv_cache.shift(cache, -unused)
    rows.mask[:, :end - unused] = rows.mask[:, unused:end].clone()
    rows.mask[:, end - unused:] = 0
    rows.first_column = [c - unused for c in rows.first_column]
