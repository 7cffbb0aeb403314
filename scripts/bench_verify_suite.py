"""Agreement of `reasoner verify`'s rule path with labelled gold / prediction pairs.

    python scripts/bench_verify_suite.py PATH/TO/Math-Verify/tests [--show-misses]

Reads the labelled cases of a test folder written in Math-Verify's style (pytest
`parametrize` tables whose arguments name `gold`, `pred` and `expected` or `result`; tables
that also set a non-default precision, strictness or set-relation flag are skipped, since our
verifier uses the defaults). Each prediction becomes a response in our template
(`<answer>\\boxed{pred}</answer>`, or the prediction as given when it already holds a box).
The project's verdict is `extract_answer` -> `is_equivalent`; plain math-verify's is
`verify(parse(gold), parse(response))` on the same response. Prints both agreements.

The cases are read from the folder you point at; nothing of it is copied into this repository.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

LABELS = ("expected", "result")


def cases(folder: Path) -> list[tuple[str, str, bool, str]]:
    """(gold, pred, label, where) for every default-config labelled case under `folder`."""
    found = []
    for path in sorted(folder.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for deco in fn.decorator_list:
                if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"):
                    continue
                names = [n.strip() for n in ast.literal_eval(deco.args[0]).split(",")]
                label = next((n for n in LABELS if n in names), None)
                if "gold" not in names or "pred" not in names or label is None:
                    continue
                if set(names) - {"gold", "pred", label, "precision"}:
                    continue  # strict / set-relation variants: not our configuration
                for node in deco.args[1].elts:
                    try:
                        row = ast.literal_eval(node)
                    except ValueError:  # a row built by code (f-strings): not a plain case
                        continue
                    values = dict(zip(names, row, strict=True))
                    if values.get("precision", 6) != 6:
                        continue
                    found.append((str(values["gold"]), str(values["pred"]), bool(values[label]),
                                  f"{path.name}::{fn.name}"))
    return found


def as_response(pred: str) -> str:
    return pred if "\\boxed" in pred else f"<answer>\\boxed{{{pred}}}</answer>"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--show-misses", action="store_true")
    args = parser.parse_args()
    import logging

    from math_verify import parse, verify

    from reasoner.verify.extract import extract_answer
    from reasoner.verify.rules import VerifierPool

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    rows = cases(args.folder)
    extracted = [extract_answer(as_response(pred)) for _, pred, _, _ in rows]
    with VerifierPool(workers=2, timeout_s=10.0) as pool:
        verdicts = iter(pool.map([(g, e) for (g, _, _, _), e in zip(rows, extracted, strict=True)
                                  if e is not None]))
        ours_all = [next(verdicts) is True if e is not None else False for e in extracted]
    ours = plain = 0
    for (gold, pred, label, where), mine in zip(rows, ours_all, strict=True):
        response = as_response(pred)
        theirs = bool(verify(parse(gold), parse(response)))
        ours += mine == label
        plain += theirs == label
        if args.show_misses and mine != label:
            print(f"MISS {where}: gold={gold!r} pred={pred!r} label={label} ours={mine} "
                  f"plain={theirs}", file=sys.stderr)
    print(f"{len(rows)} cases: reasoner {ours}/{len(rows)} agree with the labels, "
          f"plain math-verify {plain}/{len(rows)}")


if __name__ == "__main__":
    main()
