"""How the verifier reads a response's final answer (`extract_answer`, docs/design.md): strictly,
or with `extraction: flexible` also the last number of a response that gave none. The parsing
itself lives in data/answers.py, below the data sources that read reference solutions with it.
"""

from __future__ import annotations

from typing import Any

from reasoner.data.answers import clean, extract_answer, last_number

__all__ = ["clean", "extract", "extract_answer", "last_number"]


def extract(response: str, t: Any, extraction: str) -> dict:
    """{extracted, extracted_by}: the strict final answer, or with `flexible` the last number of
    a response that has none ("last_number")."""
    found = extract_answer(response, t.answer_open, t.answer_close)
    if found is not None or extraction == "strict":
        return {"extracted": found, "extracted_by": "strict" if found is not None else None}
    number = last_number(response)
    return {"extracted": number, "extracted_by": "last_number" if number is not None else None}
