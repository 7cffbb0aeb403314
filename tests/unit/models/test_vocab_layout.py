"""How the embedding and lm-head split over processes: the traffic of each layout, the choice
`auto` makes, and that the plan's byte count is what the processes send."""

import json
import subprocess
from pathlib import Path

import pytest
from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes, why

from reasoner.models.vocab_layout import VocabSplit, vocab_layout, vocab_traffic_bytes


def test_vocab_traffic_grows_with_processes_only_when_vocab_parallel():
    from reasoner.errors import ConfigError

    big = dict(tokens=32768, hidden=5120, vocab=152064, untied=True)  # Qwen2.5-32B, 32K rows
    vp = [vocab_traffic_bytes("vocab-parallel", w, **big) for w in (2, 4, 64)]
    fs = [vocab_traffic_bytes("fsdp", w, **big) for w in (2, 4, 64)]
    assert vp[1] == 2 * vp[0] and vp[2] == 32 * vp[0]  # linear in the processes
    assert fs[2] < 2 * fs[0] and fs[2] == pytest.approx(63 / 64 * 2 * 152064 * 5120 * 8)
    # auto: the cheaper one (2 processes of 32K tokens: vocab-parallel; 64: FSDP2 units)
    assert vocab_layout(VocabSplit("auto", 32768), 2, 5120, 152064, tied=False) == "vocab-parallel"
    assert vocab_layout(VocabSplit("auto", 32768), 64, 5120, 152064, tied=False) == "fsdp"
    assert vocab_layout(VocabSplit("auto", 32768), 64, 5120, 152064, tied=True) == "vocab-parallel"
    with pytest.raises(ConfigError, match="needs untied embeddings"):
        vocab_layout(VocabSplit("fsdp", 32768), 64, 896, 151936, tied=True)
    # fsdp chosen by auto for an untied policy; a tied reference model beside it stays split
    assert vocab_layout(VocabSplit("fsdp", 32768, chosen=True), 64, 896, 151936,
                        tied=True) == "vocab-parallel"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_plans_traffic_is_what_the_processes_send(tmp_path, dtype):
    """scripts/bench_comm.py's count on 2 gloo processes, both layouts, bf16 and fp16 (both
    gather 2-byte parameters under FSDP2's mixed precision): the bytes each process receives for
    the embedding and lm-head per micro-batch are the plan's, within 2%."""
    import sys

    script = Path(__file__).parents[3] / "scripts" / "bench_comm.py"
    for layout in ("vocab-parallel", "fsdp"):
        out = tmp_path / f"{layout}.json"
        done = subprocess.run(torchrun_two_processes(script, "--worker", layout, out, dtype),
                              capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=600)
        assert done.returncode == 0, why(done)
        got = max(json.loads(Path(f"{out}.{r}").read_text())["vocab"] for r in (0, 1))
        sys.path.insert(0, str(script.parent))
        from bench_comm import HIDDEN, TOKENS, VOCAB

        plan = vocab_traffic_bytes(layout, 2, TOKENS, HIDDEN, VOCAB, True, 2, 2)
        assert got == pytest.approx(plan, rel=0.02), (layout, dtype, got, plan)
