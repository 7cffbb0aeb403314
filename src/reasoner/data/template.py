"""The one place that turns problems and answers into prompt and response text.

SFT, infer, verify and eval all render through here, so the prompt a model is trained on is
the prompt it is sampled with. A response is `<think>reasoning</think><answer>\\boxed{x}</answer>`
(tag names from config); SFT gets the prompt/response split so it can mask the prompt.
"""

from __future__ import annotations

from typing import Any

from reasoner.config import TemplateConfig

PLACEHOLDERS = ("think_open", "think_close", "answer_open", "answer_close")


def instruction(t: TemplateConfig) -> str:
    """The instruction with its tag placeholders filled in; other braces stay as written, so
    `\\boxed{}` needs no escaping."""
    text = t.instruction
    for name in PLACEHOLDERS:
        text = text.replace("{" + name + "}", getattr(t, name))
    return text


def user_message(problem: str, t: TemplateConfig) -> str:
    """The problem and the instruction, unless the problem already carries that instruction
    (benchmark files often end with one: it is not added twice)."""
    text = instruction(t)
    if not text or " ".join(text.split()) in " ".join(problem.split()):
        return problem
    return f"{problem}\n{text}"


def _has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def uses_chat_template(t: TemplateConfig, tokenizer: Any) -> bool:
    return t.use_chat_template and _has_chat_template(tokenizer)


def render_messages(messages: list[dict], t: TemplateConfig, tokenizer: Any = None,
                    **template_args: Any) -> str:
    """Render a chat up to the assistant's turn (generation prompt included); `template_args`
    go to the chat template (e.g. Qwen3's enable_thinking; templates ignore unknown ones)."""
    if uses_chat_template(t, tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **template_args)
    # Plain fallback for tokenizers without a chat template (base models).
    parts = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant: "


def prompt_messages(problem: str, t: TemplateConfig, system: str | None = None) -> list[dict]:
    """The chat that asks `problem`: the system message (the template's; a data row's own only
    when the template has none) and the problem with the instruction."""
    system = t.system_prompt or system
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user_message(problem, t)}]


def render_prompt(problem: str, t: TemplateConfig, tokenizer: Any = None) -> str:
    """The full prompt text for a problem: system message, problem + instruction, chat template."""
    return render_messages(prompt_messages(problem, t), t, tokenizer)


def render_response(reasoning: str, answer: str, t: TemplateConfig) -> str:
    """Assistant text in the recipe's format: reasoning in think tags, answer boxed in answer tags."""
    return (
        f"{t.think_open}\n{reasoning.strip()}\n{t.think_close}\n"
        f"{t.answer_open}\\boxed{{{answer}}}{t.answer_close}"
    )


def end_of_turn(tokenizer: Any, t: TemplateConfig | None = None) -> str:
    """The text that ends an assistant turn: the chat template's own marker (`<|im_end|>` for
    ChatML, whatever the eos token is), else (or when `t` renders without the chat template)
    the eos token; '' without a tokenizer."""
    if tokenizer is None:
        return ""
    if _has_chat_template(tokenizer) and (t is None or t.use_chat_template):
        probe = "\x00probe\x00"
        chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": probe}]
        try:
            full = tokenizer.apply_chat_template(chat, tokenize=False)
        except Exception:  # noqa: BLE001  (templates that insist on other roles: use eos)
            full = ""
        tail = full.partition(probe)[2].strip() if probe in full else ""
        if tail:
            return tail
    return getattr(tokenizer, "eos_token", None) or ""


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Token ids that end generation: eos and the chat template's end of turn. A Qwen2.5 base
    tokenizer's eos is <|endoftext|> but a model SFT-trained through its chat template ends
    its turns with <|im_end|>: sampling must stop on both."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eot = end_of_turn(tokenizer)
    if eot:
        eot_ids = tokenizer.convert_tokens_to_ids([eot])
        if len(eot_ids) == 1 and eot_ids[0] is not None and eot_ids[0] != tokenizer.unk_token_id:
            ids.add(eot_ids[0])
    return sorted(ids)


def sft_messages(example: dict, t: TemplateConfig) -> list[dict]:
    """The conversation of an SFT example, asked exactly as infer and eval ask it: the
    template's system prompt when the row has none, the instruction on the last user turn."""
    if example.get("messages"):
        messages = [dict(m) for m in example["messages"]]
    else:
        messages = [{"role": "user", "content": example["prompt"]},
                    {"role": "assistant", "content": example["response"]}]
    if messages[-1]["role"] != "assistant":
        raise ValueError("the last message of an SFT example must be the assistant's")
    if len(messages) < 2 or messages[-2]["role"] != "user":
        raise ValueError("the assistant's last message must answer a user message")
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    turns = [m for m in messages if m["role"] != "system"]
    asked = prompt_messages(turns[-2]["content"], t, system)
    return [*asked[:-1], *turns[:-2], asked[-1], turns[-1]]


def render_sft(example: dict, t: TemplateConfig, tokenizer: Any = None) -> tuple[str, str]:
    """(prompt, response) text of an SFT example; the loss covers the response only.

    The prompt is what infer and eval send for the same problem. With a chat template the whole
    conversation is rendered through it and the response is the rest of that text up to and
    including the template's end of turn (`<|im_end|>`), so the model learns to stop where the
    template says a turn ends. Without one: the plain prompt, the answer and the eos token.
    """
    messages = sft_messages(example, t)
    prompt = render_messages(messages[:-1], t, tokenizer)
    answer = messages[-1]["content"]
    if not uses_chat_template(t, tokenizer):
        return prompt, answer + end_of_turn(tokenizer, t)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    rest = full[len(prompt):] if full.startswith(prompt) else None
    if rest is None or answer not in rest:
        raise ValueError(
            "the tokenizer's chat template does not render the conversation as prompt + answer "
            "(it rewrites earlier turns or the answer itself, e.g. by dropping the reasoning); "
            "set template.use_chat_template=false or train with a template that keeps it")
    cut = rest.index(answer) + len(answer)
    return prompt, rest[:cut] + rest[cut:].rstrip()  # the turn's end, not the newline after it


def think_span(response: str, t: TemplateConfig) -> str:
    """The reasoning text inside the think tags ('' when there is none; to the end if unclosed)."""
    start = response.find(t.think_open)
    if start < 0:
        return ""
    start += len(t.think_open)
    end = response.find(t.think_close, start)
    return response[start:] if end < 0 else response[start:end]
