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

    t = TemplateConfig(instruction="Please reason step by step, and put your final answer within \\boxed{}.")
    aime = ("Find the number of ordered pairs.\nPlease reason step by step, and put your final "
            "answer within \\boxed{}.")
    assert user_message(aime, t) == aime
    plain = "Find the number of ordered pairs."
    assert user_message(plain, t) == plain + "\nPlease reason step by step, and put your final answer within \\boxed{}."


class _ChatTok:
    """A tokenizer stand-in with a ChatML chat template (jinja, as transformers renders it)."""

    eos_token, eos_token_id, unk_token_id = "<|endoftext|>", 0, None

    def __init__(self, template):
        self.chat_template = template

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        import jinja2

        return jinja2.Template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt)

    def convert_tokens_to_ids(self, tokens):
        return [{"<|im_end|>": 7}.get(t) for t in tokens]


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_sft_rows_are_asked_like_infer_asks_and_end_with_the_templates_end_of_turn():
    from reasoner.data.template import end_of_turn, stop_token_ids

    tok = _ChatTok(CHATML)
    t = TemplateConfig(system_prompt="Be careful.", instruction="Box it: \\boxed{}.")
    chat = {"messages": [{"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "<think>2+2=4</think> 4"}]}
    for row in (chat, {"prompt": "2+2?", "response": "<think>2+2=4</think> 4"}):
        prompt, response = render_sft(row, t, tok)
        assert prompt == render_prompt("2+2?", t, tok) == (
            "<|im_start|>system\nBe careful.<|im_end|>\n"
            "<|im_start|>user\n2+2?\nBox it: \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
        assert response == "<think>2+2=4</think> 4<|im_end|>"  # not eos, not the newline after
    assert end_of_turn(tok) == "<|im_end|>" and stop_token_ids(tok) == [0, 7]


def test_sft_keeps_earlier_turns_and_adds_the_instruction_once():
    t = TemplateConfig(instruction="Box it.")
    tok = _ChatTok(CHATML)
    row = {"messages": [{"role": "system", "content": "Own system."},
                        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                        {"role": "user", "content": "2+2? Box it."},
                        {"role": "assistant", "content": "4"}]}
    prompt, response = render_sft(row, t, tok)
    assert prompt == ("<|im_start|>system\nOwn system.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                      "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\n2+2? Box it."
                      "<|im_end|>\n<|im_start|>assistant\n")
    assert response == "4<|im_end|>"


def test_a_template_that_drops_the_reasoning_is_refused():
    import pytest

    r1_like = CHATML.replace("m['content']", "m['content'].split('</think>')[-1]")
    row = {"prompt": "2+2?", "response": "<think>2+2=4</think> 4"}
    with pytest.raises(ValueError, match="use_chat_template=false"):
        render_sft(row, TemplateConfig(), _ChatTok(r1_like))
    plain = render_sft(row, TemplateConfig(use_chat_template=False), _ChatTok(r1_like))
    assert plain[1] == "<think>2+2=4</think> 4<|endoftext|>"
