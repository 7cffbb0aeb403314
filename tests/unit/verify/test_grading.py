"""The reward path end to end: a response in our template -> extract_answer -> the rule verifier.

GRADED is this project's own table, one row per trap found when our verdicts were read against
Math-Verify's labelled test suite (scripts/bench_verify_suite.py measures that suite itself, read
from a Math-Verify checkout; docs/verify.md has the numbers). Each row: reference, response, the
right verdict, and why. The test prints our agreement and plain math-verify's
(`verify(parse(reference), parse(response))`) on the same responses, fails if ours is lower, and
fails on any false positive of ours: a wrong answer rewarded is the one error RL amplifies.
"""

from __future__ import annotations

import logging

import pytest
from tests_helpers import shared_eval_rows

from reasoner.verify.extract import extract_answer
from reasoner.verify.rules import VerifierPool

A = "<answer>\\boxed{{{}}}</answer>"

GRADED = [
    # variables and primes are part of the answer: never cleaned away
    ("2", A.format("2x"), False, "2x is not 2"),
    ("2x", A.format("2x"), True, "the same expression"),
    ("3", A.format("3n"), False, "3n is not 3"),
    ("5", A.format("5i"), False, "5i is not 5"),
    ("12", A.format("12 ab"), False, "12ab is not 12"),
    ("\\frac{1}{2}", A.format("\\frac{1}{2} x"), False, "x/2 is not 1/2"),
    ("E", A.format("E'"), False, "a prime marks another point"),
    ("f(x)", A.format("f'(x)"), False, "a derivative is not the function"),
    ("f'(x)", A.format("f'(x)"), True, "the same derivative"),
    ("5", A.format("5'"), False, "5' (feet or minutes) is not the plain number"),
    # unit words: a closed list, only against a plain-number reference
    ("12", A.format("12 meters"), True, "unit word from the list"),
    ("12", A.format("12\\text{ cm}"), True, "unit in \\text"),
    ("3/4", "<answer>3/4 cup</answer>", True, "unit word after a fraction"),
    ("10 weeks", A.format("10"), True, "unit word in the reference"),
    ("10 cm^2", A.format("10"), True, "unit with a power in the reference"),
    ("30", A.format("30^\\circ"), True, "degrees"),
    ("2", A.format("2m"), False, "a bare single letter is a variable, not metres"),
    ("2", A.format("2\\text{ m}"), True, "a single-letter unit inside \\text"),
    ("7", A.format("7 apples"), False, "apples is not a unit of the list"),
    # several answers: a set, or a tuple where the reference is one
    ("\\{1,2,3\\}", "\\boxed{1},\\boxed{2},\\boxed{3}", True, "three boxes, one set"),
    ("1, 2, 3", "<answer>\\boxed{3}, \\boxed{1}, \\boxed{2}</answer>", True, "a set has no order"),
    ("(2,2), (6,2)", "\\boxed{(2,2)} and \\boxed{(6,2)}", True, "two pairs"),
    ("(2,2), (6,2)", "\\boxed{(2,2)} and \\boxed{(6,3)}", False, "one pair wrong"),
    ("(6,2)", "\\boxed{(2,2)} and \\boxed{(6,2)}", False, "an extra pair"),
    ("(1,2,3)", "<answer>\\boxed{1}, \\boxed{2}, \\boxed{3}</answer>", True, "ordered as the tuple"),
    ("(1,2,3)", "<answer>\\boxed{3}, \\boxed{2}, \\boxed{1}</answer>", False, "a tuple has an order"),
    ("\\{-1, 1\\}", "so \\boxed{-1}. Then \\boxed{1}", False, "a sentence apart: the last box only"),
    # number formats
    ("1000", A.format("1 000"), True, "space as thousands separator"),
    ("10000", A.format("10\\,000"), True, "thin space as thousands separator"),
    ("14916", A.format("14{,}916"), True, "LaTeX comma group"),
    ("7425000", A.format("7,425,000"), True, "comma groups"),
    ("1000.99", A.format("1000,99"), True, "decimal comma"),
    ("0.111", A.format("0,111"), True, "decimal comma after 0"),
    ("1000", A.format("1,00"), False, "1,00 is 1 with a decimal comma"),
    ("3128.5", A.format("3128 1/2"), True, "mixed number"),
    ("1.5", A.format("1\\frac{1}{2}"), True, "mixed number in LaTeX"),
    ("0.5", A.format("1 1/2"), False, "a mixed number is not the product 1 x 1/2"),
    ("16386.2", A.format("\\$16,\\!386.20"), True, "dollars, group comma, negative thin space"),
    ("1/3", A.format("0.333333"), True, "equal at six decimals, as math-verify rounds"),
    ("1/3", A.format("0.33"), False, "not equal at six decimals"),
    # the imaginary unit, when i is the only symbol
    ("1+2i", A.format("i(2-i)"), True, "i(2-i) = 2i + 1"),
    ("-1", A.format("i^2"), True, "i^2 = -1"),
    ("1+2i", A.format("1-2i"), False, "the conjugate"),
    ("11", A.format("x = 11"), True, "a name set to the answer"),
    ("11", A.format("x = 12"), False, "a name set to another value"),
    # fonts
    ("B", A.format("\\mathcal{B}"), True, "a font is not the answer"),
    ("\\mathbb{R}", A.format("\\mathbb{R}"), True, "the reals"),
    # intervals, including one math-verify needs long for
    ("[1,+\\infty)", A.format("[1,\\infty)"), True, "the same interval"),
    ("[1,+\\infty)", A.format("[2^{\\frac{1}{2^{1000}}}, \\infty)"), False, "a different start"),
    # a worked solution as the reference: its boxed answer counts
    ("So the answer is $\\boxed{14{,}916}$.", A.format("14916"), True, "reference with a box"),
    ("Let's see: $\\boxed{28\\%}$", A.format("28\\%"), True, "an apostrophe is no prime"),
]


def _verdicts(pairs: list[tuple[str, str]]) -> list[bool]:
    extracted = [extract_answer(resp) for _, resp in pairs]
    with VerifierPool(workers=2, timeout_s=10) as pool:
        got = iter(pool.map([(ref, e) for (ref, _), e in zip(pairs, extracted, strict=True)
                             if e is not None]))
        return [next(got) is True if e is not None else False for e in extracted]


def _plain(pairs: list[tuple[str, str]]) -> list[bool]:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    return [bool(verify(parse(ref), parse(resp), timeout_seconds=10)) for ref, resp in pairs]


def test_graded_table_at_least_plain_math_verify_and_no_false_positive():
    pairs = [(ref, resp) for ref, resp, _, _ in GRADED]
    ours, plain = _verdicts(pairs), _plain(pairs)
    labels = [label for _, _, label, _ in GRADED]
    ours_ok = sum(o == lab for o, lab in zip(ours, labels, strict=True))
    plain_ok = sum(p == lab for p, lab in zip(plain, labels, strict=True))
    print(f"\ngraded table: reasoner {ours_ok}/{len(GRADED)}, plain math-verify {plain_ok}/{len(GRADED)}")
    wrong = [(ref, resp, why) for (ref, resp, label, why), o in zip(GRADED, ours, strict=True)
             if o != label]
    assert not wrong
    assert ours_ok >= plain_ok


def _references() -> list[str]:
    refs = [str(r["answer"]) for name in ("aime24.jsonl", "aime25.jsonl", "amc23.jsonl")
            for r in shared_eval_rows(name)]
    refs += [r["answer"].split("####")[-1].strip() for r in shared_eval_rows("gsm8k.jsonl")[:200]]
    refs += [extract_answer(r["solution"]) for r in shared_eval_rows("minerva_math.jsonl")]
    return [r for r in dict.fromkeys(refs) if r]


@pytest.mark.slow
def test_no_wrong_candidate_is_rewarded_for_any_benchmark_reference():
    """For every reference answer of the shared benchmarks: `r x`, `r'`, `r+1` and `-r` are
    never correct (each is a different value or expression), and `r` itself always is.
    (`0 x` is 0 and `... = 0 x` the same equation, so `r x` is left out for those.)"""
    refs = _references()
    assert len(refs) > 300
    pairs, kinds = [], []
    for r in refs:
        cands = {"itself": r, "prime": f"{r}'", "plus one": f"{r}+1"}
        if r != "0" and "=" not in r:
            cands["times x"] = f"{r} x"
        if r.lstrip("-").strip("0.") and not r.startswith("-"):  # -0 is 0
            cands["negated"] = f"-({r})"
        for kind, c in cands.items():
            pairs.append((r, A.format(c)))
            kinds.append(kind)
    got = _verdicts(pairs)
    false_positives = [(p[0], k) for p, k, g in zip(pairs, kinds, got, strict=True)
                       if g and k != "itself"]
    assert not false_positives
    missed = [p[0] for p, k, g in zip(pairs, kinds, got, strict=True) if k == "itself" and not g]
    assert not missed
