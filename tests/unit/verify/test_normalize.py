"""The rule verifier's readings before math-verify: each safe on a wrong answer too."""

from fractions import Fraction

import pytest

from reasoner.verify import normalize as N


@pytest.mark.parametrize("text, value", [
    ("7,425,000", Fraction(7425000)), ("1 000", Fraction(1000)), ("10\\,000", Fraction(10000)),
    ("1000,99", Fraction("1000.99")), ("0,111", Fraction("0.111")), ("3/4", Fraction(3, 4)),
    ("\\frac{3}{4}", Fraction(3, 4)), ("\\dfrac{3}{4}", Fraction(3, 4)),
    ("3128 1/2", Fraction(6257, 2)), ("1\\frac{1}{2}", Fraction(3, 2)), ("-1./3", Fraction(-1, 3)),
    ("-2.5", Fraction(-5, 2)), ("1,00", Fraction(1)),  # a decimal comma: 1,00 is no thousands group
])
def test_plain_numbers_written_any_usual_way(text, value):
    assert N.plain_number(text) == value


@pytest.mark.parametrize("text", ["3 5/4", "2x", "1/0", "x = 3", "1,0000,000"])
def test_what_is_not_a_plain_number_stays_unread(text):
    assert N.plain_number(text) is None


def test_units_come_off_only_from_the_closed_list():
    assert N.strip_unit("10 weeks") == "10"
    assert N.strip_unit("3\\text{ cm}^2") == "3"
    assert N.strip_unit("\\$5") == "5"
    assert N.strip_unit("45^\\circ") == "45"
    assert N.strip_unit("2x") == "2x" and N.strip_unit("5 m") == "5 m"  # bare letters: variables


def test_names_fonts_and_primes():
    assert N.strip_assignment("x = 11") == "11" and N.strip_assignment("N \\approx 11") == "11"
    assert N.strip_fonts("\\mathcal{B}") == "B" and N.strip_fonts("\\mathbb{R}") == "\\mathbb{R}"
    assert N.primes("E'") == 1 and N.primes("E") == 0 and N.primes("Let's see") == 0
    assert N.primes("f'(x) + g'(x)") == 2 and N.primes("\\prime") == 1
    assert N.letters("\\frac{x}{\\sin y} + e^{i\\pi} + 3\\text{ cm}") == {"x", "y"}


def test_same_number_allows_math_verify_rounding_only():
    assert N.same_number(Fraction(1, 3), Fraction("0.333333"))
    assert not N.same_number(Fraction(1, 3), Fraction("0.3333"))
    assert N.read_as_number(Fraction(1)) and not N.read_as_number("1")
