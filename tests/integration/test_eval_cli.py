"""`reasoner eval bench` / `eval compare` end to end through the CLI."""

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest
import tests_helpers

from reasoner import shards
from reasoner.verify.extract import extract_answer

REPO = Path(__file__).resolve().parents[2]
CFG = str(REPO / "configs/quickstart/eval.yaml")
PROBLEMS = 100  # held-out problems the eval-bench report is recomputed on, 4 samples each


def reasoner(*a):
    out = tests_helpers.reasoner(*a, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def brute_pass(outcomes: list[bool], k: int) -> float:
    from itertools import combinations

    subsets = list(combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.slow
@pytest.mark.xdist_group("quickstart")
def test_eval_bench_report_recomputed_independently(quickstart_sft, tmp_path):
    root = quickstart_sft
    out = tmp_path / "eval"
    run = reasoner("eval", "bench", CFG, f"model.name_or_path={root}/sft/final", "sampling.n=4",
                   f"data=[{{path: {root}/data/test_problems, limit: {PROBLEMS}}}]", "--out", str(out),
                   "--name", "synthetic")
    assert "pass@1 (avg@4)" in run.stdout and "maj@4" in run.stdout
    for name in ("report.json", "report.md", "accuracy_by_length.png", "length_hist.png",
                 "pass_at_k.png"):
        assert (out / name).exists(), name
    report = json.loads((out / "report.json").read_text())
    samples = list(shards.iter_rows(out / "samples"))
    groups: dict[str, list[dict]] = {}
    for s in sorted(samples, key=lambda s: s["sample_idx"]):
        groups.setdefault(s["id"], []).append(s)
    assert len(groups) == report["problems"] == PROBLEMS and report["k"] == 4
    ok = {pid: [extract_answer(s["response"]) == s["answer"] for s in g] for pid, g in groups.items()}
    assert report["pass@1"] == pytest.approx(sum(sum(v) / 4 for v in ok.values()) / PROBLEMS)
    for k in ("1", "2", "4"):
        expect = sum(brute_pass(v, int(k)) for v in ok.values()) / PROBLEMS
        assert report["pass@k"][k] == pytest.approx(expect)
    maj = 0
    for g in groups.values():
        answers = [extract_answer(s["response"]) for s in g]
        counts = Counter(a for a in answers if a is not None)
        if counts:
            top = max(counts.values())
            first = next(a for a in answers if a is not None and counts[a] == top)
            maj += first == g[0]["answer"]
    assert report["maj@k"] == pytest.approx(maj / PROBLEMS)
    lengths = [s["response_tokens"] for s in samples]
    assert report["mean_response_tokens"] == pytest.approx(statistics.fmean(lengths))
    assert report["median_response_tokens"] == statistics.median(lengths)
    assert report["truncation_rate"] == sum(s["finish_reason"] == "length" for s in samples) / (4 * PROBLEMS)
    lo, hi = report["pass@1_ci95"]
    assert lo < report["pass@1"] < hi
    assert 0 < report["pass@1"] < 0.5  # the SFT model (CI scale: ~3%) solves a share, not all


def test_eval_bench_resumes_without_regenerating(tiny_model_dir, synth_dir, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "bench", CFG, f"model.name_or_path={tiny_model_dir}", "--data",
            f"{synth_dir}/test_problems", "--out", str(out), "sampling.max_tokens=8",
            "sampling.n=2"]
    reasoner(*args)
    part = out / "samples" / "part-00000.jsonl"
    lines = part.read_bytes().splitlines(keepends=True)
    assert len(lines) == 100
    part.write_bytes(b"".join(lines[:60]) + lines[60][:30])  # killed mid-row, 40 rows lost
    shards.update_manifest(out / "samples", complete=False)
    shards.update_manifest(out, complete=False)  # the eval itself never finished
    (out / "report.json").unlink()
    again = reasoner(*args)
    manifest = json.loads((out / "samples" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["last_run"]["generated"] == 40
    assert part.read_bytes().splitlines(keepends=True)[:60] == lines[:60]
    assert (out / "report.json").exists() and "pass@1" in again.stdout


def test_eval_compare_marks_significance(tmp_path):
    def write(name: str, accs: list[float]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        per = [{"id": f"p{i}", "accuracy": a} for i, a in enumerate(accs)]
        mean = sum(accs) / len(accs)
        (folder / "report.json").write_text(json.dumps({
            "benchmark": "b", "pass@1": mean, "pass@1_ci95": [mean - 0.05, mean + 0.05],
            "maj@k": mean, "mean_response_tokens": 10.0, "per_problem": per}))
        return folder

    a = write("sft", [0.25] * 100)
    b = write("rl", [0.5] * 100)
    c = write("same", [0.25] * 99 + [0.5])
    out = reasoner("eval", "compare", str(a), str(b), str(c), "--out", str(tmp_path / "cmp"))
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["significant"] for r in result["runs"]] == [False, True, False]
    assert result["runs"][1]["diff"] == pytest.approx(0.25)
    assert "| yes |" in out.stdout and (tmp_path / "cmp" / "compare.png").exists()
