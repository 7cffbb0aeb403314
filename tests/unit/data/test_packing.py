import random

import numpy as np
import pytest
import torch

from reasoner.data.packing import IGNORE, collate_packed, collate_padded, efficiency, pack


def test_pack_small_exact():
    assert pack([5, 3, 4, 2, 6], capacity=8) == [[4, 3], [0, 1], [2]]
    # best fit: 2 goes to the bin with the least room that still fits it (6 left 2 free)
    assert pack([], 4) == []
    with pytest.raises(ValueError, match="more than the bin capacity"):
        pack([3, 9], capacity=8)


def test_pack_heavy_tail_every_sample_once_no_overflow_high_efficiency():
    rng = random.Random(0)
    lengths = [min(4096, max(16, int(rng.lognormvariate(6.0, 1.0)))) for _ in range(3000)]
    bins = pack(lengths, capacity=4096)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(3000))
    assert all(sum(lengths[i] for i in b) <= 4096 for b in bins)
    assert efficiency(lengths, bins, 4096) >= 0.99


def test_collate_packed_positions_labels_and_no_mask():
    """No (B, 1, T, T) mask is built on the host (1 GiB at 32K tokens): the restarting position
    ids carry the samples' boundaries, and the padding is a sequence of its own."""
    from transformers.masking_utils import find_packed_sequence_indices

    a = ([10, 11, 12, 13], [False, False, True, True])
    b = ([20, 21, 22], [False, True, True])
    batch = collate_packed([[a, b]], seq_len=9, pad_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 20, 21, 22, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1]]
    # labels are next tokens inside the loss span of the same sample only
    assert batch.labels.tolist() == [[IGNORE, 12, 13, IGNORE, 21, 22, IGNORE, IGNORE, IGNORE]]
    assert batch.sample_index.tolist() == [[0, 0, 0, 0, 1, 1, 1, -1, -1]]
    assert batch.attention_mask is None
    # the segments transformers derives for sdpa / eager: a, b, and the padding apart
    assert find_packed_sequence_indices(batch.position_ids).tolist() == [[0, 0, 0, 0, 1, 1, 1, 2, 2]]
    assert batch.real_tokens == 7 and batch.num_samples == 2


def test_flat_collation_is_one_row_for_a_varlen_kernel():
    a = ([10, 11, 12], [False, True, True])
    b = ([20, 21], [False, True])
    batch = collate_packed([[a], [b]], seq_len=4, pad_id=0, flat=True)
    assert batch.input_ids.tolist() == [[10, 11, 12, 0, 20, 21, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 0, 1, 0, 1]]
    assert batch.sample_index.tolist() == [[0, 0, 0, -1, 1, 1, -1, -1]]
    assert batch.attention_mask is None and batch.num_samples == 2 and batch.real_tokens == 5


def test_collate_padded():
    batch = collate_padded([([1, 2, 3], [False, True, True]), ([4, 5], [False, True])], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert batch.labels.tolist() == [[2, 3, IGNORE], [5, IGNORE, IGNORE]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_unpacked_logits(tiny_model_dir, attn):
    """Isolation on the installed transformers, as the trainers call the model (no mask,
    use_cache=False): each sample in a packed row sees exactly what it sees alone (a bool block
    mask passed to eager would be added to the scores as 0 / 1: no mask is passed)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn).eval()
    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (7, 12, 5)]
    batch = collate_packed([[(s, [True] * len(s)) for s in samples], [(samples[1], [True] * 12)]],
                           seq_len=30, pad_id=0)
    with torch.no_grad():
        packed = model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                       attention_mask=batch.attention_mask, use_cache=False).logits
        start = 0
        for s in samples:
            alone = model(input_ids=torch.tensor([s]), use_cache=False).logits[0]
            assert torch.allclose(packed[0, start:start + len(s)], alone, atol=1e-5, rtol=0)
            start += len(s)
        assert torch.allclose(packed[1, :12], model(input_ids=torch.tensor([samples[1]]),
                                                    use_cache=False).logits[0], atol=1e-5, rtol=0)


def test_a_global_batch_is_split_by_tokens_not_by_stride():
    """8 samples for 2 data-parallel groups. The strided split (every other sample) gave one
    group 21,000 tokens and the other 4,000: every collective waited for the first. Longest
    first into the lighter share gives 13,000 / 12,000, each share in the batch's order, the
    same on every process; one group is the whole batch."""
    from reasoner.data.packing import balanced_shares

    lengths = {10: 10_000, 11: 1_000, 12: 9_000, 13: 1_000, 14: 1_000, 15: 1_000, 16: 1_000,
               17: 1_000}
    items = list(lengths)
    strided = [sum(lengths[i] for i in items[g::2]) for g in range(2)]
    assert strided == [21_000, 4_000]
    shares = balanced_shares(items, lengths, 2)
    assert [sum(lengths[i] for i in s) for s in shares] == [13_000, 12_000]
    assert shares == [[10, 13, 15, 17], [11, 12, 14, 16]]
    assert sorted(shares[0] + shares[1]) == items
    assert balanced_shares(items, lengths, 1) == [items]
    assert balanced_shares(items, lengths, 3)[2] != []  # every group gets work when it can


def test_the_dummy_pass_of_a_process_with_fewer_micro_batches_is_one_token():
    """A process with fewer micro-batches than the busiest runs a dummy pass so the collectives
    match: one pad token with no target (it used to be a whole real sample, up to 51,200
    tokens, computed and thrown away)."""
    from reasoner.data.packing import dummy_batch

    b = dummy_batch(pad_id=0)
    assert b.input_ids.shape == (1, 1) and (b.labels == IGNORE).all()
    assert (b.num_samples, b.real_tokens) == (0, 0)


def test_the_collator_knows_where_targets_and_sequences_lie():
    """Issue 52: a step selects its targets and bounds its sequences by host data the collator
    made (`Layout`), never by reading the tensors back: the targets' flat positions (row-major
    over (B, T)), and the rows' sequences back to back, each row's padding one of them. They
    are what the tensors say (`Layout.of` reads them back), and the real tokens are counted on
    the host too."""
    from reasoner.data.packing import Layout, dummy_batch

    a = ([10, 11, 12, 13], [False, False, True, True])
    b = ([20, 21, 22], [False, True, True])
    rows = collate_packed([[a, b]], seq_len=9, pad_id=0)
    assert rows.layout.targets.tolist() == [1, 2, 4, 5] and rows.layout.seq_lens == (4, 3, 2)
    flat = collate_packed([[a], [b]], seq_len=5, pad_id=0, flat=True)
    assert flat.layout.targets.tolist() == [1, 2, 5, 6] and flat.layout.seq_lens == (4, 1, 3, 2)
    cu = flat.layout.cu_seq_lens(torch.device("cpu"))
    assert cu.tolist() == [0, 4, 5, 8, 10] and cu.dtype == torch.int32
    assert flat.layout.longest == 4 and flat.real_tokens == 7
    found = Layout.of(flat.labels, flat.position_ids)
    assert found.targets.tolist() == [1, 2, 5, 6] and found.seq_lens == (4, 1, 3, 2)
    assert flat.layout.padded(2).seq_lens == (4, 1, 3, 2, 2)
    padded = collate_padded([a, b], pad_id=0)
    assert padded.layout.targets.tolist() == [1, 2, 4, 5] and padded.layout.seq_lens == ()
    assert Layout.of(padded.labels).targets.tolist() == [1, 2, 4, 5]
    assert padded.real_tokens == 7
    dummy = dummy_batch(pad_id=0).layout
    assert dummy.targets.tolist() == [] and dummy.seq_lens == (1,)
    assert rows.to(torch.device("cpu")).layout is rows.layout  # host data: it stays


class _Rows:
    """packing.TokenRows of three samples."""

    ids = [[10, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34]]
    masks = [[False, False, True, True], [False, True, True], [False, True, False, True, True]]

    def loss_mask(self, i):
        return self.masks[i]


@pytest.mark.parametrize("packed,width,flat", [(True, 9, False), (True, None, True),
                                               (True, None, False), (False, None, False)])
def test_another_process_s_layout_is_found_on_the_host_as_its_collator_gives_it(packed, width,
                                                                                flat):
    """Issue 52: each process finds every other process's micro-batch layout (`layout_of`)
    without building its tensors, to know every process's token counts before a
    vocab-parallel pass: the very layout `collate` gives, tokens included."""
    from reasoner.data.packing import DUMMY, collate, layout_of

    data = _Rows()
    for rows in ([[0, 1]], [[0, 1], [2]], [[2]], [[1], [0]]):
        if not packed:
            rows = [[i] for r in rows for i in r]
        b = collate(data, rows, packed, width, 0, flat)
        got = layout_of(data, rows, packed, width)
        assert got.targets.tolist() == b.layout.targets.tolist(), rows
        assert (got.seq_lens, got.tokens) == (b.layout.seq_lens, b.layout.tokens), rows
        assert got.tokens == b.input_ids.numel() == b.labels.numel()
    assert layout_of(data, [], packed, width) is DUMMY
    assert collate(data, [], packed, width, 0, flat).layout.tokens == 1


def test_every_process_s_counts_of_a_pass_by_rank_with_sequence_parallel_slices():
    """`Layout.slices` cuts the flat row as `sequence_parallel.split` does (padded to a
    multiple of the group's size, contiguous); `pass_peers` gives, pass by pass, every rank's
    (input tokens, targets), a group past its own micro-batches running the one-token dummy."""
    from reasoner.data.packing import DUMMY, Layout, pass_peers, peer_sizes

    a = Layout(np.array([1, 2, 5, 6, 8]), (4, 1, 3, 2), 10)  # 10 tokens, 5 targets
    assert a.slices(1) == [(10, 5)]
    assert a.slices(2) == [(5, 2), (5, 3)]  # [0, 5) and [5, 10)
    assert a.slices(3) == [(4, 2), (4, 2), (4, 1)]  # padded to 12: [0, 4) [4, 8) [8, 12)
    assert a.padded(2).tokens == 12 and a.padded(2).slices(3) == a.slices(3)
    assert DUMMY.slices(2) == [(1, 0), (1, 0)]
    b = Layout(np.array([0]), (3,), 3)
    assert peer_sizes([a, b], 2) == ((5, 2), (5, 3), (2, 1), (2, 0))  # ranks 0-1, then 2-3
    every = [["a", "b"], ["b"]]  # group 0 has two micro-batches, group 1 one
    lay = {"a": a, "b": b}.__getitem__
    assert pass_peers(every, lay, 1) == [((10, 5), (3, 1)), ((3, 1), (1, 0))]
    assert pass_peers([[], []], lay, 1) == []
