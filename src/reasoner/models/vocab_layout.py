"""How the input embedding and the lm-head split over the processes (`run.vocab_layout`), chosen
in one place for the trainers and for `reasoner plan`.

- vocab-parallel (`models/vocab_parallel.py`): each process keeps its rows of the vocabulary and
  never gathers them; activations travel instead, every process's to every other (bytes that
  grow with the number of processes).
- fsdp: each is an FSDP2 unit of its own, gathered only while it computes (bytes that do not
  grow with the number of processes, but the whole matrix and vocabulary-wide logits chunks in
  memory). Untied models only.

`auto` takes the one moving fewer bytes among those that fit the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasoner import device as dev
from reasoner.config import TrainerConfig
from reasoner.errors import ConfigError
from reasoner.models.footprint import GIB, training_bytes
from reasoner.models.shapes import Shape, shape_of

LAYOUTS = ("auto", "vocab-parallel", "fsdp")


@dataclass(frozen=True)
class VocabSplit:
    """How a run asks for its embedding and lm-head to be split (run.vocab_layout), and the
    tokens one process scores per micro-batch, which `vocab_layout` weighs."""

    layout: str = "auto"  # auto | vocab-parallel | fsdp
    tokens: int = 4096
    chosen: bool = False  # `layout` is what auto chose for the policy, not what the user asked


def vocab_traffic_bytes(layout: str, processes: int, tokens: int, hidden: int, vocab: int,
                        untied: bool, param_bytes: int = 2, act_bytes: int = 2) -> float:
    """Bytes one process receives per micro-batch (forward + backward) for the embedding and
    lm-head, by the bus model (broadcast / reduce: the payload; all-gather / reduce-scatter:
    (W-1)/W of the whole). `tokens`: one process's per micro-batch.

    vocab-parallel: one phase per process moves that process's activations to every other:
    ids and embeddings (fp32) forward, the embeddings' gradient backward; hidden states and
    targets forward, again backward with the hidden-state gradient (fp32). Grows with W.
    fsdp: each matrix is all-gathered in forward, again in backward, its gradient
    reduce-scattered in fp32. Does not grow with W."""
    w = processes
    if layout == "vocab-parallel":
        return w * tokens * (8 + 4 * hidden + 4 * hidden + 8 + 2 * act_bytes * hidden
                             + 4 + 4 * hidden)
    matrices = 2 if untied else 1
    return matrices * (w - 1) / w * vocab * hidden * (2 * param_bytes + 4)


def vocab_layout(split: VocabSplit | None, processes: int, hidden: int, vocab: int, tied: bool,
                 param_bytes: int = 2) -> str:
    """The layout a run uses: the one asked for, or (auto) the one moving fewer bytes. Tied
    weights stay vocab-parallel: as FSDP2 units the embedding and lm-head would be one unit
    (the root's), gathered from the start of forward to the end of backward."""
    split = split or VocabSplit()
    if tied:  # also where auto chose fsdp for an untied policy: a tied reference stays
        if split.layout == "fsdp" and not split.chosen:
            raise ConfigError("run.vocab_layout=fsdp needs untied embeddings (this model ties "
                              "its lm-head to its input embedding): use auto or vocab-parallel")
        return "vocab-parallel"
    if split.layout != "auto":
        return split.layout
    cost = {layout: vocab_traffic_bytes(layout, processes, split.tokens, hidden, vocab, True,
                                        param_bytes, param_bytes)
            for layout in ("vocab-parallel", "fsdp")}
    return min(cost, key=cost.get)


def choose_vocab_layout(cfg: TrainerConfig, shape: Shape, devices: int, mem_gib: float | None,
                        dtype_bytes: int, extra: float = 0) -> str:
    """run.vocab_layout, or for `auto` the layout that moves fewer bytes among those that fit
    `mem_gib` (all when it is unknown): what `reasoner plan` reports and the trainers use.
    FSDP2 units for the embedding and lm-head move a constant number of bytes whatever the
    number of processes, vocab-parallel ones a number that grows with it, but they hold the
    whole vocabulary while they compute (the gathered lm-head, its logits chunks)."""
    tokens = cfg.micro_batch_tokens
    split = VocabSplit(cfg.run.vocab_layout, tokens)
    if cfg.run.vocab_layout != "auto" or shape.tied or devices == 1:
        return vocab_layout(split, devices, shape.hidden, shape.vocab, shape.tied, dtype_bytes)
    moved = {lay: vocab_traffic_bytes(lay, devices, tokens, shape.hidden, shape.vocab, True,
                                      dtype_bytes, dtype_bytes)
             for lay in ("vocab-parallel", "fsdp")}
    need = {lay: 1.1 * sum(training_bytes(shape, devices, tokens, dtype_bytes,
                                          cfg.run.gradient_checkpointing, cfg.run.logprob_chunk,
                                          extra, lay).values()) / GIB for lay in moved}
    fitting = [lay for lay in moved if mem_gib is None or need[lay] <= mem_gib]
    if not fitting:  # neither fits: the one closer to fitting (the plan says what to change)
        return min(need, key=need.get)
    return min(fitting, key=moved.get)


def vocab_note(s: Shape, devices: int, tokens: int, dtype_bytes: int, layout: str) -> str:
    """The layout run.vocab_layout gives, and the bytes per micro-batch each device receives
    for the embedding and lm-head in it and in the other (scripts/bench_comm.py counts them)."""
    moved = {lay: vocab_traffic_bytes(lay, devices, tokens, s.hidden, s.vocab, not s.tied,
                                      dtype_bytes, dtype_bytes) / 1e9
             for lay in ("vocab-parallel", "fsdp")}
    other = "fsdp" if layout == "vocab-parallel" else "vocab-parallel"
    alt = f"{other} {moved[other]:.1f} GB" if not s.tied else "fsdp: needs untied weights"
    return f"vocab {layout}: {moved[layout]:.1f} GB / micro-batch ({alt})"


def vocab_split(cfg: TrainerConfig, env: dev.Env, extra: float = 0) -> VocabSplit:
    """How a trainer's embedding and lm-head split over its processes: run.vocab_layout, or for
    `auto` what `reasoner plan` picks for this model on these devices (`choose_vocab_layout`;
    `extra`: bytes per parameter of models beside the policy). Rank 0 chooses for every rank:
    devices may report their memory differently."""
    layout = cfg.run.vocab_layout
    if layout == "auto" and env.dist.world_size > 1 and env.dist.is_main:
        try:  # without a config.json to read here, the traffic alone decides (`auto`)
            shape = shape_of(str(cfg.model.name_or_path))
            found = dev.local_devices() if env.device.type != "cpu" else None
            layout = choose_vocab_layout(cfg, shape, env.dist.world_size,
                                         found[2] if found else None,
                                         torch.tensor([], dtype=env.dtype).element_size(), extra)
        except Exception:  # noqa: BLE001  (rank 0 must reach the vote below, whatever failed)
            layout = "auto"
    if env.dist.world_size > 1:
        mine = [float(LAYOUTS.index(layout)) if env.dist.is_main else 0.0]
        layout = LAYOUTS[int(dev.all_reduce(mine, env.dist, env.device)[0])]
    return VocabSplit(layout, cfg.micro_batch_tokens, chosen=cfg.run.vocab_layout == "auto")
