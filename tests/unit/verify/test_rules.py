import json
import time

import pytest
from tests_helpers import shared_eval_rows

from reasoner.verify.rules import VerifierPool, is_equivalent

PAIRS = [
    # integers ("1 000" is a thousands separator; math-verify alone reads 1*0; "1e1" stays 10^1)
    ("73", "73", True), ("73", "073", True), ("73", "74", False), ("0", "0", True),
    ("-5", "-5", True), ("-5", "5", False), ("1000", "1,000", True), ("1000", "1 000", True),
    ("1000000", "10^6", True), ("12", "12.0", True), ("12", "12.5", False),
    # fractions vs decimals
    ("1/2", "0.5", True), ("\\frac{1}{2}", "0.5", True), ("\\frac12", "1/2", True),
    ("\\dfrac{3}{4}", "0.75", True), ("1/3", "0.33", False), ("2/3", "\\frac{4}{6}", True),
    ("\\frac{1}{2}", "\\frac{1}{3}", False), ("-\\frac{1}{2}", "-0.5", True),
    # LaTeX forms
    ("\\sqrt{2}", "2^{1/2}", True), ("\\sqrt{8}", "2\\sqrt{2}", True), ("\\pi", "\\pi", True),
    ("2\\pi", "\\pi", False), ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True),
    ("e^{2}", "e^2", True), ("\\left(1\\right)", "1", True),
    # \text
    ("\\text{5}", "5", True), ("5", "\\text{5}", True), ("\\text{12}", "13", False),
    # percent
    ("50\\%", "50", True), ("50\\%", "50%", True), ("25\\%", "0.25", True), ("25\\%", "30\\%", False),
    # negatives
    ("-3", "-3.0", True), ("-3", "3", False), ("-\\sqrt{2}", "-2^{1/2}", True),
    # intervals
    ("(1,2]", "(1,2]", True), ("(1,2]", "(1,2)", False), ("[0,\\infty)", "[0, \\infty)", True),
    ("(-\\infty, 3)", "(-\\infty,3)", True),
    # sets
    ("\\{1,2\\}", "\\{2,1\\}", True), ("\\{1,2,3\\}", "\\{1,2\\}", False),
    ("\\{-1, 1\\}", "\\{1,-1\\}", True),
    # expressions
    ("x^2+2x+1", "(x+1)^2", True), ("x^2-1", "(x-1)(x+1)", True), ("2x", "x+x", True),
    ("x^2", "x^3", False), ("a+b", "b+a", True), ("\\frac{x}{2}", "0.5x", True),
    # wrong but close
    ("3", "3.01", False), ("100", "99", False), ("\\pi", "3.14159", False), ("0.5", "0.55", False),
    ("204", "240", False), ("1/7", "0.142857", True), ("7", "7.0001", False),
    # odd inputs never raise
    ("5", "", False), ("5", "\\frac{", False), ("5", "abc", False),
    ("\\frac{9}{3}", "3", True), ("2.50", "2.5", True), ("10", "1e1", False),
]


def test_equivalence_table():
    with VerifierPool(workers=2, timeout_s=10) as pool:
        got = pool.map([(r, c) for r, c, _ in PAIRS])
    wrong = [(r, c, exp, g) for (r, c, exp), g in zip(PAIRS, got, strict=True) if g is not exp]
    assert not wrong


def test_plain_values_are_order_independent():
    plain = [(r, c) for r, c, _ in PAIRS[:20]]
    with VerifierPool(workers=2, timeout_s=10) as pool:
        forward = pool.map(plain)
        backward = pool.map([(c, r) for r, c in plain])
    assert forward == backward


def test_every_aime_answer_against_itself_and_a_perturbed_value():
    rows = shared_eval_rows("aime24.jsonl") + shared_eval_rows("aime25.jsonl")
    assert len(rows) == 60
    pairs = []
    for r in rows:
        a = str(r["answer"])
        pairs += [(a, a), (a, str(int(a) + 1)), (a, f"\\boxed{{{a}}}"[7:-1])]
    with VerifierPool(workers=2, timeout_s=10) as pool:
        got = pool.map(pairs)
    assert got == [True, False, True] * 60


def test_a_new_workers_first_plain_text_parse_is_inside_a_one_second_deadline():
    """math-verify's first parse of plain text imports sympy's units and more (5 s here, the
    first time): workers start warm, so that is not charged to their first item. Before, CI
    read "73" vs "None" as undecided (None) under load."""
    with VerifierPool(workers=1, timeout_s=1.0) as pool:
        assert pool.map([("73", "None"), ("3", "x+1"), ("x^2+1", "1+x^2")]) == [False, False, True]
        assert pool.replaced == 0


ADVERSARIAL = ["2^{2^{2^{2^{2^{2^{2^{2}}}}}}}", "9^{9^{9^{9^{9}}}}", "{" * 2000 + "1" + "}" * 2000,
               "\\frac{" * 500 + "1" + "}{2}" * 500, "1" * 100_000, "x+" * 50_000 + "1",
               "\x00\xff\xfe\x89PNG junk", bytes(range(256)).decode("latin-1") * 50]


def test_adversarial_inputs_return_in_time_and_pool_survives():
    limit = 2.0
    with VerifierPool(workers=2, timeout_s=limit) as pool:
        for junk in ADVERSARIAL:
            start = time.monotonic()
            result = pool.map([("5", junk), (junk, junk)])
            assert time.monotonic() - start < 2 * limit + 1.0, junk[:40]
            assert all(r in (True, False, None) for r in result)
        assert pool.map([("1/2", "0.5"), ("3", "4")]) == [True, False]


def test_is_equivalent_never_hangs():
    assert is_equivalent("1", "1", timeout_s=1.0) is True  # the pool is up: time the item only
    start = time.monotonic()
    assert is_equivalent("5", "2^{2^{2^{2^{2^{2^{2^{2}}}}}}}", timeout_s=1.0) is None
    assert time.monotonic() - start < 3.0
    assert is_equivalent("73", "73.0") is True
    assert is_equivalent("73", None) is False  # odd input: a verdict, not an exception


@pytest.mark.parametrize("name", ["aime24.jsonl", "aime25.jsonl"])
def test_aime_answers_are_strings_the_verifier_accepts(name):
    rows = shared_eval_rows(name)
    assert all(isinstance(json.loads(json.dumps(str(r["answer"]))), str) for r in rows)


SLOW_MAIN = '''
import time
time.sleep(1.0)  # a slow import: forkserver / spawn workers re-run the main script's top level
from reasoner.verify.rules import VerifierPool
if __name__ == "__main__":
    with VerifierPool(2, timeout_s=0.5) as pool:
        print(pool.map([("1", "1"), ("2", "2"), ("1/2", "0.5")]))
'''


def test_a_slow_worker_start_does_not_count_against_the_deadline(tmp_path):
    """A script whose imports take 1 s (eval scripts import torch) verifies with a 0.5 s
    deadline: the deadline runs from the worker's hello, so nothing is called a timeout."""
    import subprocess
    import sys

    script = tmp_path / "slow_main.py"
    script.write_text(SLOW_MAIN)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[True, True, True]"
