"""Ulysses sequence parallelism: which group sizes a model allows, how a row is cut and where its
sequences start, and (two gloo processes) that it computes what one process computes."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from tests_helpers import SUBPROCESS_ENV, strict_autograd, torchrun_two_processes, why

from reasoner.data.packing import Layout
from reasoner.errors import ConfigError
from reasoner.models.sequence_parallel import SequenceGroup, check_heads, split

CHECK = Path(__file__).parents[2] / "sequence_parallel_check.py"


def test_a_size_must_split_the_query_heads_and_the_key_value_heads_or_be_their_multiple():
    """verl's rule: Qwen2.5-32B (40 query / 8 key-value heads) takes 1, 2, 4, 8 (then 10, 20,
    40 with the key/value heads replicated), the quickstart's tiny model (4 / 2) 2 and 4,
    SmolLM2-135M (9 / 3) refuses 2."""
    for size in (1, 2, 4, 8):
        check_heads(40, 8, size)
    check_heads(4, 2, 2)
    check_heads(4, 2, 4)  # 2 key/value heads, each copied to 2 processes
    with pytest.raises(ConfigError, match=r"run.sequence_parallel=2 does not split SmolLM2's "
                                          r"attention: it has 9 query heads and 3 key/value "
                                          r"heads.*Sizes this model allows: 3, 9"):
        check_heads(9, 3, 2, "SmolLM2")
    with pytest.raises(ConfigError, match="40 query heads and 8 key/value heads"):
        check_heads(40, 8, 16)  # 40 % 16 != 0


def test_a_row_is_padded_to_a_multiple_of_the_group_and_cut_in_contiguous_slices():
    """7 tokens over 2 processes: padded to 8 (the padding a sequence of its own, outside the
    loss), each process 4 consecutive tokens; the boundaries and targets are the whole row's,
    and each slice's targets its own, all from the host-side layout."""
    ids = torch.tensor([[11, 12, 13, 14, 15, 16, 17]])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    labels = torch.tensor([[12, 13, 14, -100, 16, 17, -100]])
    layout = Layout(np.array([0, 1, 2, 4, 5]), (4, 3))
    first = split(ids, pos, labels, SequenceGroup(2, 0), layout, pad_id=0)
    second = split(ids, pos, labels, SequenceGroup(2, 1), layout, pad_id=0)
    assert first.input_ids.tolist() == [[11, 12, 13, 14]]
    assert second.input_ids.tolist() == [[15, 16, 17, 0]]
    assert second.position_ids.tolist() == [[0, 1, 2, 0]]
    assert second.labels.tolist() == [[16, 17, -100, -100]]
    cu = first.attn_kwargs["cu_seq_lens_q"]
    assert cu.tolist() == [0, 4, 7, 8] and cu.dtype == torch.int32
    assert first.attn_kwargs["max_length_q"] == 4
    assert first.targets.tolist() == second.targets.tolist() == [0, 1, 2, 4, 5]
    assert first.local.tolist() == [0, 1, 2] and second.local.tolist() == [0, 1]
    found = Layout.of(labels, pos)  # what a caller that hands no layout gets: the same
    assert found.targets.tolist() == [0, 1, 2, 4, 5] and found.seq_lens == (4, 3)


@pytest.mark.slow
def test_two_processes_compute_what_one_does_in_fp64(tmp_path):
    """A packed row whose samples straddle the slice boundary: token log-probs equal to one
    process's, and the gradient (summed over the processes) equal; key/value heads split and
    replicated, sdpa and eager. A one-token micro-batch leaves the second slice all padding:
    no target, a finite loss and finite gradients."""
    out = tmp_path / "sp.json"
    done = subprocess.run(torchrun_two_processes(CHECK, out), capture_output=True, text=True,
                          env=SUBPROCESS_ENV, timeout=600, cwd=CHECK.parent)
    assert done.returncode == 0, why(done)
    result = json.loads(out.read_text())
    for case in ("sdpa-kv2", "sdpa-kv1", "eager-kv2", "eager-kv1"):
        assert result[case]["tokens"] == 21
        assert result[case]["logp"] < 1e-12 and result[case]["grad"] < 1e-12, (case, result)
        assert result[case]["found"] == 0.0  # the layout read back gives the same numbers
    assert result["one_token"] == {"tokens": 0, "loss": 0.0, "finite": True}


def test_the_collectives_are_the_autograd_ones_the_whole_torch_range_has():
    """`all_gather_single` (a 2026 name) raises ImportError on older torch, and the older
    `all_gather_tensor` has no backward there: attention and log-prob gradients silently zero.
    The `*_autograd` collectives (torch 2.4 on) are the only ones the module may call."""
    import ast

    import reasoner.models.sequence_parallel as sp

    tree = ast.parse(Path(sp.__file__).read_text())
    called = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              and node.module == "torch.distributed._functional_collectives" for a in node.names}
    assert called == {"all_gather_tensor_autograd", "all_to_all_single_autograd"}


def test_the_gradient_check_fails_on_an_op_without_a_backward():
    """What tests/sequence_parallel_check.py runs under: an op with no autograd kernel (as the
    plain collectives were on older torch) raises in backward instead of giving zero."""
    lib = torch.library.Library("reasoner_test", "FRAGMENT")
    lib.define("no_backward(Tensor x) -> Tensor")
    lib.impl("no_backward", lambda x: x * 2, "CPU")
    x = torch.ones(3, requires_grad=True)
    mode = torch._C._get_autograd_fallback_mode()
    import warnings

    with warnings.catch_warnings():
        strict_autograd()
        try:
            with pytest.raises(UserWarning, match="autograd kernel was not registered"):
                torch.ops.reasoner_test.no_backward(x).sum().backward()
        finally:
            torch._C._set_autograd_fallback_mode(mode)
