from tests_helpers import shared_eval_rows

from reasoner.config import DecontamConfig, FilterConfig
from reasoner.verify import decontam, filters


def row(pid, k, reward, tokens=10, finish="stop", response=None):
    return {"id": pid, "sample_idx": k, "reward": reward, "response_tokens": tokens,
            "finish_reason": finish, "verdict": "correct" if reward > 0 else "incorrect",
            "response": response if response is not None else f"{pid}-{k}"}


def constructed():
    rows = []
    rows += [row("all_right", k, 1.0) for k in range(4)]
    rows += [row("all_wrong", k, -1.0) for k in range(4)]
    rows += [row("mixed", 0, 1.0, 100), row("mixed", 1, 1.0, 5000), row("mixed", 2, -1.0, 100),
             row("mixed", 3, -1.0, 100)]
    rows += [row("trunc", 0, 1.0, 50), row("trunc", 1, 1.0, 9000, finish="length"),
             row("trunc", 2, -1.0, 50), row("trunc", 3, -1.0, 50)]
    rows += [row("dups", 0, 1.0, 40, response="same"), row("dups", 1, 1.0, 40, response="same"),
             row("dups", 2, -1.0, 40), row("dups", 3, -1.0, 40)]
    rows += [row("long", k, 1.0 if k == 0 else -1.0, 3000) for k in range(4)]
    return rows


def test_default_order_and_exact_counts():
    kept, report = filters.apply(constructed(), FilterConfig(truncated="negative", dedupe=True))
    names = [r["filter"] for r in report]
    assert names == ["truncated (kept as negatives)", "duplicate responses",
                     "zero variance (all correct or all wrong)"]
    assert [(r["problems_removed"], r["samples_removed"]) for r in report] == [(0, 0), (0, 1), (2, 8)]
    assert {r["id"] for r in kept} == {"mixed", "trunc", "dups", "long"}
    trunc = [r for r in kept if r["id"] == "trunc"]
    assert [r["reward"] for r in trunc] == [1.0, -1.0, -1.0, -1.0]  # the cut-off positive is -1
    assert trunc[0]["group_accuracy"] == 0.25 and trunc[0]["group_size"] == 4
    dups = [r for r in kept if r["id"] == "dups"]
    assert len(dups) == 3 and dups[0]["group_accuracy"] == 1 / 3


def test_all_filters_recipe_style():
    cfg = FilterConfig(truncated="drop", dedupe=True, min_group_mean_tokens=1000,
                       drop_zero_variance=True, max_positive_tokens=4000)
    kept, report = filters.apply(constructed(), cfg)
    counts = {r["filter"].split(" (")[0].split(" longer")[0]: (r["problems_removed"], r["samples_removed"])
              for r in report}
    assert counts == {"truncated": (0, 1), "duplicate responses": (0, 1), "difficulty": (4, 14),
                      "zero variance": (0, 0), "positives": (0, 1)}
    # mixed (mean 1325 tokens) and long (3000) are hard; mixed loses its 5000-token positive
    assert sorted((r["id"], r["sample_idx"]) for r in kept) == [
        ("long", 0), ("long", 1), ("long", 2), ("long", 3), ("mixed", 0), ("mixed", 2), ("mixed", 3)]
    assert all(r["group_accuracy"] == 0.5 for r in kept if r["id"] == "mixed")


def test_decontamination_catches_a_lightly_reworded_aime_problem(tmp_path):
    aime = shared_eval_rows("aime24.jsonl")
    original = aime[3]["prompt"].split("\nPlease reason step by step")[0]
    reworded = (original.replace("Let", "Suppose").replace("Find", "Determine")
                .replace("the", "the", 1) + " Give an integer.")
    assert reworded != original
    problems = [{"id": f"p{i}", "problem": t} for i, t in enumerate([
        "Mia has 3 apples. She buys 4 more apples. How many apples does Mia have now?",
        reworded,
        "Compute the sum of the first ten positive integers.",
    ])]
    bench = tmp_path / "aime24.jsonl"
    bench.write_text("".join(__import__("json").dumps(r) + "\n" for r in aime))
    cfg = DecontamConfig(benchmarks=[{"path": str(bench), "fields": {"problem": "prompt"}}])
    kept, removed = decontam.decontaminate(problems, cfg)
    assert [p["id"] for p in kept] == ["p0", "p2"]
    assert [r["id"] for r in removed] == ["p1"] and removed[0]["score"] >= 0.3


def test_ngram_scores():
    bench = ["the quick brown fox jumps over the lazy dog again and again"]
    same = decontam.ngram_matches(bench, bench, 4, 0.3)
    assert same == [(0, 1.0)]
    assert decontam.ngram_matches(["a completely different sentence about numbers"], bench, 4, 0.3) == [None]
