"""Final-answer extraction (DESIGN 5b `extract_answer`).

The content of the last `<answer>...</answer>` block; inside it, or else in the whole text, the
last `\\boxed{...}` (balanced braces; also `\\fbox{...}` and `\\boxed 5`) wins. An answer block
without a box counts as the answer itself. Markdown emphasis, `$` delimiters, trailing
punctuation and plain unit words after a number are removed. No completed answer: None (a
response cut off by the length limit has none unless its box or answer block was closed).
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)(\s*)")
_UNITS = re.compile(r"^(-?[\d.,]+(?:/\d+)?)\s*(?:\\(?:text|mathrm)\{\s*[A-Za-z ]+\}|[A-Za-z][A-Za-z ]*)\.?$")


def _boxes(text: str) -> list[str]:
    """Contents of every completed \\boxed / \\fbox in order (balanced braces)."""
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
                        found.append(text[i + 1:j])
                        break
                j += 1
        elif m.group(1):  # `\boxed 5`: a bare token after whitespace, up to a space or `$`
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                found.append(token.group(0))
    return found


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
        if s.startswith("\\text{") and s.endswith("}") and s.count("{") == 1:
            s = s[6:-1]
        units = _UNITS.match(s)
        if units:
            s = units.group(1)
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
        answer = boxes[-1] if boxes else scope
    else:
        boxes = _boxes(text)
        if not boxes:
            return None
        answer = boxes[-1]
    answer = clean(answer)
    return answer or None
