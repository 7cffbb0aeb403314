import pytest

from reasoner.verify.extract import extract_answer

CASES = [
    # tags
    ("<think>x</think>\n<answer>\\boxed{42}</answer>", "42"),
    ("<answer>\\boxed{1}</answer> then <answer>\\boxed{2}</answer>", "2"),
    ("<answer>17</answer>", "17"),
    ("<answer> 17 </answer>", "17"),
    ("<answer>The answer is \\boxed{9}.</answer>", "9"),
    ("<answer>\\boxed{3}</answer> \\boxed{9}", "3"),  # the answer block wins
    ("<think>\\boxed{5}</think><answer>\\boxed{6}</answer>", "6"),
    ("<answer>\\boxed{4}", "4"),  # open block, completed box
    ("<answer>4", None),  # cut off: no completed answer
    ("<answer>\\boxed{4", None),
    ("\\boxed{12", None),
    # boxes
    ("so \\boxed{7}", "7"),
    ("\\boxed{1} and \\boxed{2}", "1, 2"),  # several boxes: one answer, a list
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{{1,2}}", "{1,2}"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\boxed{(1, 2]}", "(1, 2]"),
    ("\\boxed{x^{2}+1}", "x^{2}+1"),
    ("\\fbox{8}", "8"),
    ("\\boxed 5", "5"),
    ("$\\boxed 5$", "5"),
    ("\\boxed {13}", "13"),
    ("\\boxed{-3}", "-3"),
    ("\\boxed{3.14}", "3.14"),
    ("\\boxed{1,000}", "1,000"),
    ("\\boxed{50\\%}", "50\\%"),
    ("\\boxed{\\text{(B)}}", "(B)"),
    ("\\boxed{}", None),
    # markdown, punctuation, units, delimiters
    ("<answer>**73**</answer>", "73"),
    ("<answer>**73**.</answer>", "73"),
    ("<answer>*5*</answer>", "5"),
    ("<answer>$12$</answer>", "12"),
    ("<answer>\\(12\\)</answer>", "12"),
    ("<answer>12.</answer>", "12"),
    ("\\boxed{12 meters}", "12 meters"),  # units stay: rules strips a closed list
    ("\\boxed{12\\text{ cm}}", "12\\text{ cm}"),
    ("\\boxed{7 apples.}", "7 apples"),
    ("<answer>3/4 cup</answer>", "3/4 cup"),
    # several answers: the boxes of the answer block, or the last run of boxes
    ("<answer>\\boxed{1}, \\boxed{2}, \\boxed{3}</answer>", "1, 2, 3"),
    ("\\boxed{(2,2)} and \\boxed{(6,2)}", "(2,2), (6,2)"),
    ("so \\boxed{3}. Checking again, the answer is \\boxed{5}", "5"),  # a sentence apart: not one
    ("\\boxed{5} and \\boxed{5}", "5"),
    ("\\boxed{(3,3)} \\text{ for part (a) and } \\boxed{(1,1)}", "(3,3), (1,1)"),
    ("\\boxed{12 $ and $ 13}", "12, 13"),
    # nothing that changes the mathematics
    ("\\boxed{2x}", "2x"),
    ("\\boxed{E'}", "E'"),
    ("\\boxed{f'(x)}", "f'(x)"),
    # no answer
    ("The answer is 5.", None),
    ("", None),
    ("**73**", None),
    ("<think>thinking forever", None),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_extract(text, expected):
    assert extract_answer(text) == expected


def test_custom_tags():
    assert extract_answer("<final>\\boxed{2}</final>", "<final>", "</final>") == "2"


def test_last_number_reads_an_answer_written_without_a_box():
    from reasoner.verify.extract import last_number

    assert last_number("So, there are 270 apples in total.") == "270"
    assert last_number("He pays $1,250.50 for 3 of them") == "3"
    assert last_number("The total is 1,250.") == "1250"
    assert last_number("no digits here") is None


def test_flexible_extraction_only_fills_in_where_strict_finds_nothing():
    from reasoner.config import TemplateConfig
    from reasoner.verify.extract import extract

    t = TemplateConfig()

    boxed = "3 + 4 = 7, then 8. The answer is \\boxed{7}."
    assert extract(boxed, t, "flexible") == {"extracted": "7", "extracted_by": "strict"}
    assert extract("3 + 4 = 7 apples", t, "flexible") == {"extracted": "7",
                                                                 "extracted_by": "last_number"}
    assert extract("3 + 4 = 7 apples", t, "strict") == {"extracted": None,
                                                               "extracted_by": None}


def test_strict_reading_of_flexible_rows_counts_last_numbers_as_no_answer():
    from reasoner.eval.metrics import strict_only

    rows = [{"extracted": "7", "extracted_by": "last_number", "reward": 1.0},
            {"extracted": "7", "extracted_by": "strict", "reward": 1.0}]
    assert [(r["extracted"], r["reward"]) for r in strict_only(rows)] == [(None, -1.0), ("7", 1.0)]
