"""The one place that turns problems and answers into prompt and response text.

SFT, infer, verify and eval all render through here, so the prompt a model is trained on is
the prompt it is sampled with. A response is `<think>reasoning</think><answer>\\boxed{x}</answer>`
(tag names from config); SFT gets the prompt/response split so it can mask the prompt.
"""

from __future__ import annotations

from typing import Any

from reasoner.config import TemplateConfig


def instruction(t: TemplateConfig) -> str:
    return t.instruction.format(
        think_open=t.think_open, think_close=t.think_close,
        answer_open=t.answer_open, answer_close=t.answer_close,
    )


def user_message(problem: str, t: TemplateConfig) -> str:
    """The problem and the instruction, unless the problem already carries that instruction
    (benchmark files often end with one: it is not added twice)."""
    text = instruction(t)
    if not text or " ".join(text.split()) in " ".join(problem.split()):
        return problem
    return f"{problem}\n{text}"


def _has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def render_messages(messages: list[dict], t: TemplateConfig, tokenizer: Any = None) -> str:
    """Render a chat up to the assistant's turn (generation prompt included)."""
    if t.use_chat_template and _has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Plain fallback for tokenizers without a chat template (base models).
    parts = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant: "


def render_prompt(problem: str, t: TemplateConfig, tokenizer: Any = None) -> str:
    """The full prompt text for a problem: system message, problem + instruction, chat template."""
    messages = []
    if t.system_prompt:
        messages.append({"role": "system", "content": t.system_prompt})
    messages.append({"role": "user", "content": user_message(problem, t)})
    return render_messages(messages, t, tokenizer)


def render_response(reasoning: str, answer: str, t: TemplateConfig) -> str:
    """Assistant text in the recipe's format: reasoning in think tags, answer boxed in answer tags."""
    return (
        f"{t.think_open}\n{reasoning.strip()}\n{t.think_close}\n"
        f"{t.answer_open}\\boxed{{{answer}}}{t.answer_close}"
    )


def end_of_turn(tokenizer: Any) -> str:
    """Text that ends an assistant turn (the eos token), so a trained model learns to stop."""
    eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
    return eos or ""


def render_sft(example: dict, t: TemplateConfig, tokenizer: Any = None) -> tuple[str, str]:
    """(prompt, response) text of an SFT example; the loss covers the response only.

    `prompt` + `response` rows: the prompt is the problem, rendered like an inference prompt.
    `messages` rows: everything before the last assistant message is the prompt.
    """
    messages = example.get("messages")
    if messages:
        messages = [dict(m) for m in messages]
        if messages[-1]["role"] != "assistant":
            raise ValueError("the last message of an SFT example must be the assistant's")
        prompt = render_messages(messages[:-1], t, tokenizer)
        return prompt, messages[-1]["content"] + end_of_turn(tokenizer)
    return render_prompt(example["prompt"], t, tokenizer), example["response"] + end_of_turn(tokenizer)


def think_span(response: str, t: TemplateConfig) -> str:
    """The reasoning text inside the think tags ('' when there is none; to the end if unclosed)."""
    start = response.find(t.think_open)
    if start < 0:
        return ""
    start += len(t.think_open)
    end = response.find(t.think_close, start)
    return response[start:] if end < 0 else response[start:end]
