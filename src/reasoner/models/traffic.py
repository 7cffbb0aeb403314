"""Bytes one training process sends through each collective per micro-batch, as the trainer
issues them: what `reasoner plan` turns into the collectives' share of a step's time, and what a
rehearsal counts on its fake process group (pipeline/rehearsal_tracking.py `Collectives`, the
same tensors: an all-gather's output, a reduce-scatter's input).

- FSDP2: each unit's parameters gathered in the compute dtype in forward and again in backward
  (the units reshard after forward), their fp32 gradient reduce-scattered once (LoRA: the
  frozen base gathered alike, only the adapters' gradient reduced).
- Sequence parallelism (Ulysses): q, k, v and the attention's output all-to-all'd in every
  layer, in forward, in the checkpointed forward's recompute and in backward.
- A vocabulary-parallel embedding and lm-head: every process's activations broadcast to the
  others and reduced back (`vocab_layout.vocab_traffic_bytes`); FSDP2 does not gather them.
- Models beside the policy: a moving reference's forward, OREAL's token RM's forward and
  backward (the vocabulary-parallel ones of those not counted: a few percent of them).
"""

from __future__ import annotations

from reasoner.models.shapes import Shape
from reasoner.models.vocab_layout import vocab_traffic_bytes


def micro_batch_traffic(s: Shape, devices: int, sequence_parallel: int, tokens: int,
                        dtype_bytes: int, vocab_layout: str, checkpointing: bool,
                        adapters: int = 0, reference: bool = False, token_rm: bool = False
                        ) -> dict[str, float]:
    """Bytes per micro-batch by kind of collective; `tokens`: this process's (1/SP of the
    micro-batch's). One process: nothing. `reference`: a moving reference scored beside the
    policy (its forward: one gather, no gradient); `token_rm`: OREAL's token RM trained beside
    it (its trunk gathered twice and reduced, its untied lm-head never used)."""
    if devices <= 1:
        return {}
    vocab_rows = s.vocab * s.hidden * (1 if s.tied else 2)
    sharded = s.params - (vocab_rows if vocab_layout == "vocab-parallel" else 0)
    trunk = sharded - (0 if s.tied or vocab_layout == "vocab-parallel" else s.vocab * s.hidden)
    out = {"all-gather": dtype_bytes * (2.0 * sharded + reference * sharded
                                        + 2 * token_rm * trunk),
           "reduce-scatter": 4.0 * ((adapters or sharded) + token_rm * trunk)}
    if sequence_parallel > 1:
        passes = (3 if checkpointing else 2) * (1 + token_rm) + reference
        width = 2 * s.hidden + 2 * s.kv_heads * s.head_dim
        out["all-to-all"] = float(passes * s.layers * tokens * width * dtype_bytes)
    if vocab_layout == "vocab-parallel":
        out["broadcast + reduce"] = vocab_traffic_bytes(
            "vocab-parallel", devices, tokens, s.hidden, s.vocab, not s.tied, dtype_bytes,
            dtype_bytes)
    return out
