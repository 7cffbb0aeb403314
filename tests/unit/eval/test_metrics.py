import itertools
import random

import pytest
from tests_helpers import shared_eval_rows

from reasoner.eval import metrics
from reasoner.eval.metrics import bucket_label, length_buckets, majority, pass_at_k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_enumeration_over_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(8, 0, 4) == 0.0 and pass_at_k(8, 8, 1) == 1.0 and pass_at_k(8, 2, 1) == 0.25
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    assert metrics.ks_for(8) == [1, 2, 4, 8] and metrics.ks_for(6) == [1, 2, 4, 6]


def test_majority_with_equivalence_and_ties():
    same = lambda a, b: {a, b} <= {"1/2", "0.5"}  # noqa: E731  a stand-in for math-verify
    assert majority(["3", "1/2", "0.5"], same) == 1  # 1/2 and 0.5 together beat 3
    assert majority(["3", "4", "4", "3"], same) == 0  # tie: the answer seen first wins
    assert majority(["4", "3", "3", "4"], same) == 0
    assert majority([None, "7", None], same) == 1  # no answer does not vote
    assert majority([None, None], same) is None


def test_length_buckets_and_truncation_exact():
    rows = [{"id": "a", "sample_idx": i, "response_tokens": t, "reward": r, "finish_reason": f,
             "extracted": "1", "answer": "1"}
            for i, (t, r, f) in enumerate([(10, 1, "stop"), (31, -1, "stop"), (32, 1, "stop"),
                                           (40, 1, "stop"), (64, -1, "length"), (100, -1, "length")])]
    got = length_buckets(rows, [32, 64])
    assert got == [{"bucket": "<32", "samples": 2, "accuracy": 0.5},
                   {"bucket": "32-64", "samples": 2, "accuracy": 1.0},
                   {"bucket": ">=64", "samples": 2, "accuracy": 0.0}]
    assert bucket_label([4096, 8192], 5000) == "4K-8K" and bucket_label([4096], 4096) == ">=4K"
    s = metrics.summarize(rows, lambda a, b: a == b, [32, 64], resamples=200)
    assert s["truncation_rate"] == pytest.approx(2 / 6) and s["pass@1"] == pytest.approx(0.5)
    assert s["median_response_tokens"] == 36.0 and s["k"] == 6


def test_length_buckets_follow_the_data():
    """Issue 51, finding 11: with no `length_buckets` the edges are the lengths' quartiles (two
    significant digits); the fixed 4K-32K edges put every 64-token answer in one bucket."""
    from reasoner.config import EvalConfig

    assert EvalConfig(model={"name_or_path": "m"}, output_dir="o").length_buckets is None
    assert metrics.quartile_edges([10, 20, 30, 40, 50]) == [20, 30, 40]
    assert metrics.quartile_edges(list(range(1000, 33000, 7))) == [9000, 17000, 25000]
    assert metrics.quartile_edges([64] * 5) == [64] and metrics.quartile_edges([0]) == [1]
    rows = [{"id": "a", "sample_idx": i, "response_tokens": t, "reward": 1 if i % 2 else -1,
             "finish_reason": "stop", "extracted": "1", "answer": "1"}
            for i, t in enumerate([40, 52, 60, 64, 70, 81, 90, 96])]
    s = metrics.summarize(rows, lambda a, b: a == b, None, resamples=100)
    assert [(b["bucket"], b["samples"]) for b in s["accuracy_by_length"]] == [
        ("<58", 2), ("58-67", 2), ("67-83", 2), (">=83", 2)]


def test_bootstrap_interval_contains_mean_and_narrows():
    rng = random.Random(0)
    values = [rng.random() for _ in range(400)]
    lo, hi = metrics.bootstrap_ci(values, 1000, 0)
    mean = sum(values) / len(values)
    assert lo < mean < hi and hi - lo < 0.07
    lo2, hi2 = metrics.bootstrap_ci(values[:40], 1000, 0)
    assert hi2 - lo2 > hi - lo


@pytest.mark.parametrize("name", ["aime24.jsonl", "aime25.jsonl"])
def test_aime_loaders_read_shared_files(name, tmp_path):
    from tests_helpers import SHARED_EVAL

    from reasoner.eval.benchmarks import load_problems, local
    from reasoner.verify.rules import VerifierPool

    shared_eval_rows(name)  # skips with the reason when it is absent
    problems = load_problems([local(SHARED_EVAL / name)])
    assert len(problems) == 30 and len({p["id"] for p in problems}) == 30
    assert all(isinstance(p["answer"], str) and p["answer"].isdigit() for p in problems)
    assert all("\\boxed{}" in p["problem"] for p in problems)  # the prompt field became problem
    with VerifierPool(workers=2) as pool:
        assert pool.map([(p["answer"], p["answer"]) for p in problems]) == [True] * 30


def test_other_shared_files_map_their_answers():
    from tests_helpers import SHARED_EVAL

    from reasoner.eval.benchmarks import load_problems, local

    shared_eval_rows("gsm8k.jsonl")
    gsm = load_problems([local(SHARED_EVAL / "gsm8k.jsonl").model_copy(update={"limit": 5})])
    assert all(p["answer"].lstrip("-").isdigit() for p in gsm)
    minerva = load_problems([local(SHARED_EVAL / "minerva_math.jsonl").model_copy(update={"limit": 5})])
    assert all(p["answer"] for p in minerva)
    amc = load_problems([local(SHARED_EVAL / "amc23.jsonl").model_copy(update={"limit": 5})])
    assert len(amc) == 5
