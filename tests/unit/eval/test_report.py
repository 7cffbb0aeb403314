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


def test_an_empty_length_bucket_reads_as_a_dash_and_the_baseline_as_baseline(tmp_path):
    r = report("m", [1.0, 0.5])
    r["accuracy_by_length"].append({"bucket": ">=96", "samples": 0, "accuracy": None})
    assert "| >=96 | 0 | - |" in markdown(r) and "n/a%" not in markdown(r)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(r))
    md = compare([tmp_path / "a", tmp_path / "b"], resamples=100)["markdown"]
    first = next(line for line in md.splitlines() if line.startswith(f"| {tmp_path}/a"))
    assert first.endswith("| baseline | | |") and "+0.0 to +0.0" not in first


def test_with_flexible_extraction_compare_also_gives_the_strict_difference(tmp_path):
    paths = []
    for name, flex, strict in [("start", [0.5] * 10, [0.0] * 10), ("rl", [0.75] * 10, [0.5] * 10)]:
        r = report(name, flex)
        r["strict"] = {"pass@1": sum(strict) / 10, "pass@1_ci95": [0, 1], "maj@k": 0,
                       "no_answer_rate": 0.5}
        for p, a in zip(r["per_problem"], strict, strict=True):
            p["accuracy_strict"] = a
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(r))
        paths.append(tmp_path / name)
    result = compare(paths, resamples=100)
    rl = result["runs"][1]
    assert rl["diff"] == 0.25 and rl["strict_diff"] == 0.5 and rl["strict_diff_ci95"] == [0.5, 0.5]
    assert f"| {tmp_path}/rl | 50.0 | +50.0 | +50.0 to +50.0 |" in result["markdown"]
    assert "| pass@1 under strict extraction | 50.0% |" in markdown(json.loads(
        (tmp_path / "rl" / "report.json").read_text()))


def test_the_pass_at_k_plot_is_labelled_at_its_ks_and_names_the_model():
    import pytest

    plt = pytest.importorskip("matplotlib.pyplot")
    from reasoner.eval.report import pass_at_k_figure

    r = report("runs/q/rl/final", [1.0, 0.5])
    r["pass@k"] = {"1": 0.5, "2": 0.6, "4": 0.7, "8": 0.8}
    fig = pass_at_k_figure(r, plt)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
    # issue 51, finding 11: `final` alone names no model; its run's folder does
    assert ax.get_title() == "bench: pass@k of rl/final"
    plt.close(fig)
    r["model"] = "Qwen/Qwen2.5-0.5B"
    fig = pass_at_k_figure(r, plt)
    assert fig.axes[0].get_title() == "bench: pass@k of Qwen2.5-0.5B"
    plt.close(fig)


def write(tmp_path, name: str, r: dict):
    (tmp_path / name).mkdir()
    (tmp_path / name / "report.json").write_text(json.dumps(r))
    return tmp_path / name


def test_compare_pairs_only_shared_problems_and_gives_no_interval_without_any(tmp_path):
    """Issue 51, finding 10: 6 own problems against 20 GSM8K ones share none: no paired
    interval ('+0.0 to +0.0' was printed), and how many are shared is said."""
    gsm8k = write(tmp_path, "gsm8k", report("m", [0.5] * 20))
    mine = report("m", [1.0] * 6)
    for p in mine["per_problem"]:
        p["id"] = "mine-" + p["id"]
    result = compare([gsm8k, write(tmp_path, "mine", mine)], resamples=100)
    own = result["runs"][1]
    assert (own["diff"], own["diff_ci95"], own["significant"]) == (None, None, False)
    assert own["common_problems"] == 0
    assert "to +0.0" not in result["markdown"]
    assert "| n/a (no shared problems) | | |" in result["markdown"]
    assert result["pairing"] == ["mine shares 0 of its 6 problems with gsm8k (20): no paired "
                                 "difference"]
    assert "**Paired over shared problems only:** mine shares 0" in result["markdown"]
    # half of them shared: the difference is over those 10 only (1.0 - 0.25), not 0.625 - 0.25
    half = report("m", [1.0] * 10 + [0.0] * 10)
    for p in half["per_problem"][10:]:
        p["id"] = "other-" + p["id"]
    base = write(tmp_path, "base", report("m", [0.25] * 20))
    d = compare([base, write(tmp_path, "half", half)], resamples=100)["runs"][1]
    assert d["diff"] == 0.75 and d["diff_ci95"] == [0.75, 0.75] and d["common_problems"] == 10


def test_compare_reads_the_backend_as_resolved(tmp_path):
    """Issue 51, finding 10: `backend: auto` that ran on hf is not a difference from `hf`."""
    auto, hf, vllm = (report("m", [0.5] * 4) for _ in range(3))
    auto["config"], hf["config"], vllm["config"] = ({"backend": b} for b in ("auto", "hf", "auto"))
    auto["generation"], hf["generation"] = {"backend": "hf"}, {"backend": "hf"}
    vllm["generation"] = {"backend": "vllm"}
    paths = [write(tmp_path, n, r) for n, r in (("auto", auto), ("hf", hf), ("vllm", vllm))]
    assert compare(paths[:2], resamples=100)["warnings"] == []
    assert compare(paths, resamples=100)["warnings"] == [
        "backend differs (auto: 'hf', hf: 'hf', vllm: 'vllm')"]
    old = report("m", [0.5] * 4)  # a report without `generation` and only `auto`: unknown
    old["config"] = {"backend": "auto"}
    assert compare([paths[1], write(tmp_path, "old", old)], resamples=100)["warnings"] == []


def test_report_cells_are_escaped():
    """Issue 51, finding 11: a newline in a majority answer broke report.md's table."""
    r = report("m", [1.0])
    r["per_problem"][0].update(majority_answer="x = 1\nor x | 2", reference="1")
    row = next(line for line in markdown(r).splitlines() if line.startswith("| q0 "))
    assert row == "| q0 | 4/4 | 40 | x = 1 or x \\| 2 ✓ | 1 |"


def test_plots_at_zero_percent_say_so(tmp_path):
    """Issue 51, finding 11: at 0% the plots were empty, with a '%' axis from -0.04 to 0.04."""
    import pytest

    plt = pytest.importorskip("matplotlib.pyplot")
    from reasoner.eval.report import pass_at_k_figure, plots

    r = report("m", [0.0, 0.0])
    r["pass@k"] = {"1": 0.0, "2": 0.0}
    rows = [{"response_tokens": 8, "reward": -1.0}] * 8
    assert plots(r, rows, tmp_path) == ["accuracy_by_length.png", "length_hist.png",
                                        "pass_at_k.png"]
    fig = pass_at_k_figure(r, plt)
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.texts] == ["0% everywhere: no sample was correct"]
    plt.close(fig)
