"""Eval reports a person reads: the markdown of one report and the side-by-side comparison."""

import json

from reasoner.eval.report import compare, markdown


def report(name, accuracies, tokens=40.0):
    p1 = sum(accuracies) / len(accuracies)
    return {"benchmark": "bench", "model": name, "problems": len(accuracies), "k": 4,
            "pass@1": p1, "pass@1_ci95": [p1 - 0.1, p1 + 0.1], "pass@k": {"1": p1, "2": p1},
            "maj@k": p1, "mean_response_tokens": tokens, "median_response_tokens": tokens,
            "truncation_rate": 0.0, "no_answer_rate": 0.25,
            "accuracy_by_length": [{"bucket": "<4096", "samples": 4 * len(accuracies),
                                    "accuracy": p1}],
            "per_problem": [{"id": f"q{i}", "accuracy": a, "correct": int(4 * a), "samples": 4,
                             "mean_tokens": tokens, "majority_answer": "7",
                             "majority_correct": a > 0.5, "reference": "7"}
                            for i, a in enumerate(accuracies)]}


def test_markdown_has_the_headline_numbers_and_a_row_per_problem():
    md = markdown(report("m", [1.0, 0.5]))
    assert "| pass@1 (avg@4) | 75.0% (95% CI 65.0-85.0) |" in md
    assert "| pass@2 | 75.0% |" in md and "| no answer | 25.0% |" in md
    assert "| q0 | 4/4 | 40 | 7 ✓ | 7 |" in md and "| q1 | 2/4 | 40 | 7 ✗ | 7 |" in md


def test_compare_gives_each_run_its_difference_to_the_first(tmp_path):
    paths = []
    for name, acc in [("base", [0.0] * 20), ("better", [1.0] * 20)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(report(name, acc)))
        paths.append(tmp_path / name)
    result = compare(paths, tmp_path / "cmp", resamples=200)
    base, better = result["runs"]
    assert (base["diff"], base["diff_ci95"], base["significant"]) == (0.0, [0.0, 0.0], False)
    assert better["diff"] == 1.0 and better["diff_ci95"] == [1.0, 1.0] and better["significant"]
    assert better["common_problems"] == 20
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["runs"] == result["runs"]
    assert (tmp_path / "cmp" / "compare.md").read_text() == result["markdown"]
    assert "| +100.0 | +100.0 to +100.0 | yes |" in result["markdown"]
