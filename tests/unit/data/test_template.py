from reasoner.config import TemplateConfig
from reasoner.data.template import render_prompt, render_response, render_sft, think_span


def test_response_format_and_think_span():
    t = TemplateConfig(think_open="<thought>", think_close="</thought>")
    r = render_response("1 + 2 = 3", "3", t)
    assert r == "<thought>\n1 + 2 = 3\n</thought>\n<answer>\\boxed{3}</answer>"
    assert think_span(r, t) == "\n1 + 2 = 3\n"
    assert think_span("<thought>unfinished", t) == "unfinished"
    assert think_span("no tags", t) == ""


def test_plain_rendering_without_chat_template():
    t = TemplateConfig(instruction="Answer in {answer_open}.")
    assert render_prompt("2+2?", t) == "User: 2+2?\nAnswer in <answer>.\n\nAssistant: "
    prompt, response = render_sft({"prompt": "2+2?", "response": "4"}, t)
    assert prompt.endswith("Assistant: ") and response == "4"


def test_an_instruction_already_in_the_problem_is_not_added_twice():
    from reasoner.config import TemplateConfig
    from reasoner.data.template import user_message

    t = TemplateConfig(instruction="Please reason step by step, and put your final answer within \\boxed{{}}.")
    aime = ("Find the number of ordered pairs.\nPlease reason step by step, and put your final "
            "answer within \\boxed{}.")
    assert user_message(aime, t) == aime
    plain = "Find the number of ordered pairs."
    assert user_message(plain, t) == plain + "\nPlease reason step by step, and put your final answer within \\boxed{}."
