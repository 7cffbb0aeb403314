"""A few minutes of CPU SFT teach a from-scratch tiny model the synthetic task (quickstart configs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reasoner.verify.extract import extract_answer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.xdist_group("quickstart")
def test_quickstart_sft_solves_a_clear_share_of_held_out_problems(quickstart_sft):
    root = quickstart_sft
    out = subprocess.run(
        [sys.executable, "-m", "reasoner", "infer", str(REPO / "configs/quickstart/infer.yaml"),
         f"model.name_or_path={root}/sft/final", f"data.path={root}/data/test_problems",
         f"output_dir={root}/greedy", "sampling.n=1", "sampling.temperature=0", "data.limit=400"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (root / "greedy" / "part-00000.jsonl").read_text().splitlines()]
    assert len(rows) == 400
    accuracy = sum(extract_answer(r["response"]) == r["answer"] for r in rows) / len(rows)
    print(f"greedy held-out accuracy after quickstart SFT: {accuracy:.3f}")
    # sampled pass@1 of this SFT model is 58-64% on seeds 0-2 (README); the from-scratch model
    # scores 0
    assert accuracy >= 0.2
