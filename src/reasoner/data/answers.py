"""Final answers in text: the last `\\boxed{}` group or `<answer>` block of a response, or of a
reference solution (data sources reduce a worked MATH solution to its answer with it; the
verifier reads responses with it, `verify/extract.py`).

The final answer is the content of the last `<answer>...</answer>` block: every completed
`\\boxed{...}` in it (balanced braces; also `\\fbox{...}` and `\\boxed 5`), or the block itself
when it has no box. Without an answer block, the last box of the text and the boxes just before
it that are separated from it only by commas, "and" or spacing (`\\boxed{1}, \\boxed{2}`) form
the final answer. Several boxes come back as one comma-separated list, which the rule verifier
compares as a set (or a tuple, where the reference is one).

Only formatting is removed here (markdown emphasis, `$` delimiters, trailing punctuation, a
`\\text{...}` wrapping the whole answer). Nothing that could turn a wrong answer into a right
one: `2x` stays `2x`, `E'` stays `E'`, and unit words are left for the rule verifier, which
strips them from a closed list only when the reference is a plain number. No completed answer:
None (a response cut off by the length limit has none unless its box or block was closed).
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)(\s*)")
# What may stand between two boxes of one final answer: separators (`\boxed{1}, \boxed{2} and
# \boxed{3}`), or a short connecting phrase with "and" or a comma and no sentence end
# (`\boxed{(3,3)} \text{ for part (a) and } \boxed{(1,1)}`).
_BETWEEN = re.compile(r"^(?:\s|\$|,|;|&|\\quad|\\qquad|\\text\{\s*(?:and|or|,)\s*\}|\band\b|\bor\b)*$")
_PHRASE = re.compile(r"^[^.!?\n]{0,40}$")


def _joins(between: str) -> bool:
    if _BETWEEN.match(between):
        return True
    short = _PHRASE.match(between)  # a short phrase with "and" or a comma, or symbols only
    return bool(short and (re.search(r"\band\b|,", between) or not re.search(r"[A-Za-z0-9]", between)))


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every completed \\boxed / \\fbox, in order (balanced braces)."""
    found = []
    for m in _BOX.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{" and text[j - 1] != "\\":
                    depth += 1
                elif text[j] == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        found.append((m.start(), j + 1, text[i + 1:j]))
                        break
                j += 1
        elif m.group(1):  # `\boxed 5`: a bare token after whitespace, up to a space or `$`
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                found.append((m.start(), i + token.end(), token.group(0)))
    return found


def _final_group(text: str, boxes: list[tuple[int, int, str]]) -> list[str]:
    """The last box and the boxes right before it with only separators in between."""
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if not _joins(text[box[1]:group[0][0]]):
            break
        group.insert(0, box)
    return [content for _, _, content in group]


def clean(answer: str) -> str:
    """Strip what is formatting rather than mathematics."""
    s = answer.strip()
    for _ in range(3):
        before = s
        s = s.strip()
        s = re.sub(r"^\*\*(.*)\*\*$", r"\1", s, flags=re.S)  # **73**
        s = re.sub(r"^\*(.*)\*$", r"\1", s, flags=re.S)
        s = re.sub(r"^\$+(.*?)\$+$", r"\1", s, flags=re.S)  # $73$
        s = re.sub(r"^\\\((.*)\\\)$", r"\1", s, flags=re.S)
        s = re.sub(r"^\\\[(.*)\\\]$", r"\1", s, flags=re.S)
        s = s.rstrip(".。;,!").strip()
        s = re.sub(r"\s*\$\s*(?:,|and|\\text\{\s*and\s*\})\s*\$\s*", ", ", s)  # \boxed{12 $ and $ 13}
        if s.startswith("\\text{") and s.endswith("}") and s.count("{") == 1:
            s = s[6:-1]
        if s == before:
            break
    return s


def extract_answer(text: str, answer_open: str = "<answer>", answer_close: str = "</answer>"
                   ) -> str | None:
    """The final answer of a response, or None when it gave none."""
    if not text:
        return None
    scope = None
    end = text.rfind(answer_close)
    if end >= 0:
        start = text.rfind(answer_open, 0, end)
        if start >= 0:
            scope = text[start + len(answer_open):end]
    if scope is not None:
        boxes = _boxes(scope)
        parts = [content for _, _, content in boxes] if boxes else [scope]
    else:
        boxes = _boxes(text)
        if not boxes:
            return None
        parts = _final_group(text, boxes)
    parts = list(dict.fromkeys(p for p in (clean(p) for p in parts) if p))  # \boxed{5}, \boxed{5}
    return ", ".join(parts) or None


_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number of `text` (lm-eval's GSM8K "flexible-extract"): `So, there are 270 apples
    in total.` -> `270`. Thousands commas are dropped; None when the text holds no digit.

    Only for answers without a final answer (`verify.extraction: flexible`): it reads whatever
    number came last, so it is never used to override an extracted answer.
    """
    found = _LAST_NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None
