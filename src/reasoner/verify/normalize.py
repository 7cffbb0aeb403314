"""What the rule verifier does before math-verify compares two answers, and why each step is safe.

Every step either reads a notation math-verify misreads (thousands separators written with a
space or `\\,`, a decimal comma, a mixed number, `\\mathcal{B}`, the imaginary unit) or refuses
a match math-verify would wrongly allow (a prime: math-verify parses `E'` as `E`). Unit words
are removed only from a closed list and only when the reference is a plain number, so `2x`
never becomes `2`. Each rule has test cases with a wrong answer that must stay wrong
(tests/unit/verify/test_grading.py).
"""

from __future__ import annotations

import re
from fractions import Fraction

# Closed list of unit words (plural and singular). Single letters (m, s, g, h, L) count only
# inside \text{} / \mathrm{}: bare, they are as likely a variable.
_UNIT_WORDS = (
    "seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|"
    "millimet(?:er|re)s?|centimet(?:er|re)s?|kilomet(?:er|re)s?|met(?:er|re)s?|mm|cm|km|"
    "inch(?:es)?|feet|foot|ft|yards?|yd|miles?|"
    "milligrams?|kilograms?|grams?|mg|kg|pounds?|lbs?|ounces?|oz|tons?|"
    "millilit(?:er|re)s?|lit(?:er|re)s?|ml|mL|gallons?|cups?|"
    "dollars?|cents?|euros?|degrees?|units?|square units|sq units"
)
_LETTER_UNITS = "s|m|g|h|L|l"
_POWER = r"(?:\^\{?[23]\}?|²|³)?"
_UNIT = re.compile(
    rf"\s*(?:\\(?:text|mathrm|textrm|mbox)\{{\s*(?:(?:square|sq\.?|cubic)\s+)?(?:{_UNIT_WORDS}|{_LETTER_UNITS})"
    rf"\s*\}}{_POWER}|(?:(?:square|sq\.?|cubic)\s+)?(?:{_UNIT_WORDS}){_POWER}(?![A-Za-z])|"
    rf"\^\{{?\\circ\}}?|°)\s*\.?$")
_FONT = re.compile(r"\\(?:mathcal|mathbf|mathit|mathsf|boldsymbol|bm)\{([^{}]*)\}")
# A prime marks a derivative or a new point: E', f'(x), x''. An apostrophe inside a word
# ("Let's" in a worked solution) is not one.
_PRIME = re.compile(r"(?<=[A-Za-z0-9)}])'+(?![A-Za-z])|\\prime\b")
_SPACE_IN_NUMBER = re.compile(r"(?<=\d)(?:\\,|\\;|\\:|\\ |~|\{,\}|\\!|\s)(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def strip_fonts(s: str) -> str:
    r"""`\mathcal{B}` -> `B`: a font is not part of the answer (\mathbb stays: it names a set)."""
    return _FONT.sub(r"\1", s)


def primes(s: str) -> int:
    """How many primes the answer has (math-verify drops them: E' would equal E)."""
    return len(_PRIME.findall(s))


def strip_assignment(s: str) -> str:
    """`x = 11`, `N \\approx 11` -> `11`: a name set to the answer (for plain-number references)."""
    return re.sub(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\approx|≈)\s*", "", s)


def strip_unit(s: str) -> str:
    """`10 weeks` -> `10`, `3\\text{ cm}^2` -> `3`: one trailing unit from the closed list."""
    s = s.strip().removeprefix("\\$").strip().strip("$").strip()
    return _UNIT.sub("", s).strip()


def plain_number(s: str) -> Fraction | None:
    """The value of a plain number written any usual way, else None.

    Integers and decimals, thousands groups split by `,`, a space, `\\,` or `{,}` (`1 000`,
    `10\\,000`), a decimal comma when it cannot be a thousands group (`1000,99`), fractions
    (`3/4`, `\\frac{3}{4}`) and mixed numbers (`3128 1/2`, `1\\frac{1}{2}`).
    """
    s = s.strip().replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\!", "")
    s = _SPACE_IN_NUMBER.sub(",", s)
    if re.fullmatch(r"-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?", s):  # 7,425,000 / 1,000.5
        return Fraction(s.replace(",", ""))
    if re.fullmatch(r"-?\d+,(?:\d{1,2}|\d{4,})|-?0,\d+", s):  # 1000,99 / 0,111: decimal comma
        return Fraction(s.replace(",", "."))
    if _NUMBER.fullmatch(s):
        return Fraction(s)
    s = re.sub(r"(?<=\d)\.(?=\s*/)", "", s)  # "-1./3": a float-formatted numerator
    # a fraction (3/4, \frac{3}{4}), or a whole number and a proper fraction (3128 1/2)
    m = (re.fullmatch(r"(-?)()(\d+)\s*/\s*(\d+)", s)
         or re.fullmatch(r"(-?)()\\frac\{(\d+)\}\{(\d+)\}", s)
         or re.fullmatch(r"(-?)(\d+)\s+(\d+)\s*/\s*(\d+)", s)
         or re.fullmatch(r"(-?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}", s))
    if not m:
        return None
    sign, whole, num, den = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
    if den == 0 or (whole and not 0 < num < den):
        return None
    value = int(whole or 0) + Fraction(num, den)
    return -value if sign else value


_COMMAND_ARG = re.compile(
    r"\\(?:text|textbf|textit|textnormal|textrm|emph|mathrm|mbox|operatorname|begin|end)\{[^{}]*\}")
_FUNCTIONS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "sqrt", "min", "max",
              "gcd", "lcm", "det", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh"}


def letters(s: str) -> set[str]:
    """Letters that name variables in a LaTeX answer: not commands (\\frac, \\pi), not text or
    unit words in \\text{}, not function names, not e (Euler's number) or i (the unit)."""
    s = _COMMAND_ARG.sub(" ", s)
    s = re.sub(r"\\[A-Za-z]+|\b(?:percent(?:age)?|pct)\b", " ", s)  # math-verify reads those as %
    words = re.findall(r"[A-Za-z]+", s)
    return {c for w in words if w not in _FUNCTIONS for c in w} - {"e", "i", "E"}


def read_as_number(obj) -> bool:
    """True when math-verify's reading holds no symbol, function or text: only numbers."""
    if isinstance(obj, str):
        return False
    if getattr(obj, "free_symbols", None):
        return False
    atoms = getattr(obj, "atoms", None)
    if atoms is not None:
        from sympy.core.function import AppliedUndef

        return not atoms(AppliedUndef)
    return True


def same_number(a: Fraction, b: Fraction) -> bool:
    """Equal, or equal at math-verify's default rounding (6 decimals: 1/3 = 0.333333)."""
    return a == b or round(float(a), 6) == round(float(b), 6)
