"""Memory-bounded token log-probabilities.

`token_logprobs` returns log p(target) for N selected positions without ever holding an
N × vocab tensor: the lm-head product runs chunk by chunk in forward and is recomputed chunk by
chunk in backward. With Qwen2.5's 151,936-token vocabulary an 8K-token sequence would need
4.6 GiB of fp32 logits (and as much again for their gradient); here one chunk's worth.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reasoner.data.packing import Layout
from reasoner.models import sequence_parallel
from reasoner.models.lm_head import compute_dtype, lowp_logits, times_weight
from reasoner.models.sequence_parallel import SequenceGroup


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int) -> Tensor:
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 at least, fp64 in tests
        compute = compute_dtype(hidden)
        out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)  # (N,)
        wc = weight.to(compute)
        for s in range(0, hidden.shape[0], chunk_size):
            # (c, V) in the compute dtype (bf16 under bf16 autocast); the log-sum-exp in fp32:
            # in bf16 it would be +-0.03 off at a logit of 10
            logits = lowp_logits(hidden[s:s + chunk_size], wc, acc)
            tgt = targets[s:s + chunk_size, None]
            out[s:s + chunk_size] = (logits.gather(1, tgt) - logits.logsumexp(-1, keepdim=True))[:, 0]
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk_size, ctx.compute = chunk_size, compute
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        hidden, weight, targets = ctx.saved_tensors
        c = ctx.chunk_size
        acc = torch.promote_types(hidden.dtype, torch.float32)
        # a trained head is widened whole beside its fp32 gradient sum; a frozen one (a LoRA
        # base's, a reference's) never is: times_weight widens it a chunk of rows at a time
        wc, w = weight.to(ctx.compute), weight.to(acc) if ctx.needs_input_grad[1] else weight
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(w) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], c):
                h = hidden[s:s + c]  # (c, H)
                g = grad_out[s:s + c, None].to(acc)  # (c, 1)
                # d log p_t / d logits = onehot(t) - softmax(the forward's logits); the
                # products in fp32 with the fp32 weights (rounding passed straight through)
                dlogits = lowp_logits(h, wc, acc).softmax(-1).mul_(-g)  # (c, V)
                dlogits.scatter_add_(1, targets[s:s + c, None], g)
                if grad_h is not None:
                    grad_h[s:s + c] = times_weight(dlogits, w, c).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += dlogits.T @ h.to(acc)
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None


def token_logprobs(hidden: Tensor, lm_head_weight: Tensor, targets: Tensor,
                   chunk_size: int = 4096) -> Tensor:
    """log softmax(hidden @ W.T)[target] per row, (N,) in fp32 (or wider), chunked both ways.

    hidden (N, H), lm_head_weight (V, H), targets (N,) int64. A vocab-parallel weight (this
    process's rows, see `vocab_parallel`) computes over the processes' rows together.
    """
    from reasoner.models import vocab_parallel

    if vocab_parallel.is_vocab_parallel(lm_head_weight):
        return vocab_parallel.token_logprobs(hidden, lm_head_weight, targets, chunk_size)
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32) + 0 * lm_head_weight.sum()
    return _ChunkedLogprobs.apply(hidden, lm_head_weight, targets, chunk_size)


class LogprobHead(nn.Linear):
    """An lm-head (`nn.Linear`, no bias) whose forward, given targets, returns their log-probs.

    `fsdp.shard_modules` makes the lm-head one (a class swap: the same weight, the same
    names) when it is an FSDP2 unit of its own: FSDP2 gathers a unit's parameters around its
    forward and reduce-scatters their gradient after its backward, so the chunked log-prob
    computation must run inside that forward, not read the sharded weight from outside."""

    def forward(self, hidden: Tensor, targets: Tensor | None = None,
                chunk_size: int = 4096) -> Tensor:
        if targets is None:
            return super().forward(hidden)
        return token_logprobs(hidden, self.weight, targets, chunk_size)


class PolicyLogprobs(nn.Module):
    """A causal LM seen as a function from token batches to the log-probs of their labels.

    Wrapping the whole computation in one module lets FSDP2 / DDP treat it as the root: the
    embeddings, final norm and lm-head weight are gathered for this forward like any other.
    """

    vocab_layout = "whole"  # or how `fsdp.shard_modules` split the embedding and lm-head

    def __init__(self, model: nn.Module, chunk_size: int = 4096, temperature: float = 1.0,
                 sp: SequenceGroup | None = None):
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size
        self.temperature = temperature  # logits / T: score like the sampler at temperature T
        self.sp = sp or SequenceGroup()  # sequence parallel: each process computes 1/size

    def forward(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None,
                labels: Tensor, layout: Layout | None = None) -> Tensor:
        """Log-probs (N,) of `labels` (B, T) at positions where labels >= 0, row-major order.
        `layout`: the batch's (packing.Layout), where its targets and sequences lie, known on
        the host; None: found from `labels` and `position_ids` (read back: a host sync).
        Sequence-parallel: every process of the group is given the whole flat micro-batch,
        computes its slice, and returns the whole (N,) (models.sequence_parallel)."""
        if layout is None:
            flat = attention_mask is None and input_ids.shape[0] == 1
            layout = Layout.of(labels, position_ids if flat else None)
        from reasoner.models import vocab_parallel

        with vocab_parallel.known_sizes(layout.peers):  # every process's counts, if known
            return self._forward(input_ids, position_ids, attention_mask, labels, layout)

    def _forward(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None,
                 labels: Tensor, layout: Layout) -> Tensor:
        if not self.sp.on:
            return self._logprobs(input_ids, position_ids, attention_mask, labels,
                                  layout.index(labels.device),
                                  self._boundaries(input_ids, attention_mask, layout))
        part = sequence_parallel.split(input_ids, position_ids, labels, self.sp, layout)
        local = self._logprobs(part.input_ids, part.position_ids, None, part.labels, part.local,
                               part.attn_kwargs)  # (n,)
        return sequence_parallel.gather(local, part, self.sp)  # (N,)

    def _boundaries(self, input_ids: Tensor, attention_mask: Tensor | None, layout: Layout
                    ) -> dict:
        """A flat packed row (1, T) for a varlen kernel: its sequence boundaries, from the
        batch's layout, passed to every layer's kernel (transformers accepts them as forward
        arguments), where transformers would derive them from the position ids again in every
        layer (a host sync per layer; two on Ascend). {} otherwise."""
        kernel = getattr(self.model.config, "_attn_implementation", None) or ""
        if attention_mask is not None or input_ids.shape[0] != 1 or not kernel.startswith("flash"):
            return {}
        cu = layout.cu_seq_lens(input_ids.device)  # (k+1,) int32
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": layout.longest,
                "max_length_k": layout.longest}

    def _logprobs(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None,
                  labels: Tensor, targets: Tensor, attn_kwargs: dict) -> Tensor:
        """Log-probs (n,) of `labels` at the flat positions `targets` (n,) of the (B, T) rows."""
        out = self.model.model(input_ids=input_ids, position_ids=position_ids,
                               attention_mask=attention_mask, use_cache=False, **attn_kwargs)
        hidden = out.last_hidden_state  # (B, T, H)
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, targets)  # (n, H)
        if self.temperature != 1.0:
            h = h / self.temperature
        y = labels.reshape(-1).index_select(0, targets)  # (n,)
        head = self.model.lm_head
        if isinstance(head, LogprobHead):  # an FSDP2 unit of its own: gathered in its forward
            return head(h, y, self.chunk_size)  # (n,)
        return token_logprobs(h, head.weight, y, self.chunk_size)  # (n,)
