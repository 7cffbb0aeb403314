import json
import subprocess
from pathlib import Path

import pytest
import torch
from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes, why

CHECK = Path(__file__).parents[2] / "vocab_parallel_check.py"


@pytest.mark.slow
def test_two_processes_score_and_differentiate_like_one_without_gathering_the_lm_head(tmp_path):
    """FSDP2 with a vocab-parallel embedding and lm-head (tied and untied), 2 gloo processes,
    each scoring its row of a batch: log-probs and every parameter's gradient equal those of
    the whole model scoring the whole batch (fp64: sums in another order, ~1e-15), with pad
    tokens in the input, an odd vocabulary (51 + 50 rows) and a step where one process has
    nothing to score; every process's counts gathered (step 0) or handed in with the layout, as
    the trainers do (steps 1-2). The lm-head stays this process's 51 rows while the output is
    alive: FSDP2's root unit would hold all 101 (and their gradient) until the end of
    backward."""
    out = tmp_path / "result.json"
    done = subprocess.run(torchrun_two_processes(CHECK, out), capture_output=True, text=True,
                          env=SUBPROCESS_ENV, timeout=900)
    assert done.returncode == 0, why(done)
    result = json.loads(out.read_text())
    for layout in ("tied", "untied"):
        r = result[layout]
        assert r["logprob"] < 1e-12 and r["grad"] < 1e-12, (layout, r)
        assert r["head_rows_in_forward"] == [51, 51, 51], (layout, r)
    # under bf16 / fp16 autocast, backward differentiates what forward returned: before, it
    # recomputed the logits in fp32 against the forward's bf16 log-sum-exp (several percent off)
    for dtype in ("bfloat16", "float16"):
        r = result[dtype]
        assert r["logprob"] < 5e-5 and r["grad_hidden"] < 5e-5 and r["grad_rows"] < 5e-5, r
        # no host read: every process's token count is handed in (the trainers find them on
        # the host, `packing.pass_peers`; before: gathered and read back, once a forward), and
        # rows are selected by clamped indices with the others zeroed, never by a mask (before
        # that: a nonzero for every owner and chunk of the backward besides)
        assert r["host_syncs"] == [], r
        assert "gives process" in r["refused"] and "but it has" in r["refused"], r


@pytest.mark.parametrize("vocab,world", [(101, 2), (100, 2), (151_936, 8), (7, 3), (5, 4)])
def test_row_ranges_are_torch_chunks_split_which_fsdp2_and_the_checkpoint_reader_assume(vocab, world):
    """Every process's rows, as `row_range` gives them (and `sharded.fill_shards` reads them
    from the safetensors file), are exactly torch.chunk's pieces, in order, covering the matrix;
    a process past the last piece gets an empty range."""
    from reasoner.models.vocab_parallel import row_range

    pieces = torch.arange(vocab).chunk(world)
    for rank in range(world):
        start, stop = row_range(vocab, rank, world)
        want = pieces[rank].tolist() if rank < len(pieces) else []
        assert list(range(start, stop)) == want, (rank, start, stop)
