"""Judge verification: an LLM compares the candidate's final answer with the reference.

As PCL-Reasoner-V1.5 did with Qwen3-32B. The prompt is a template file (configs/judge/); the
judge sees the problem, the reference and the extracted answer (or the response tail when no
answer could be extracted). Decoding is greedy with thinking off (the default), or Qwen3's
recommended sampling with it on; thinking is stripped from the reply, which is then parsed
strictly: only a single `\\boxed{0}` or `\\boxed{1}` at the very end counts.
Anything else is `invalid`, retried with sampling up to `retries` times, and then recorded as
invalid, never as correct.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from reasoner.config import JudgeConfig, SamplingConfig, TemplateConfig
from reasoner.data.template import render_messages
from reasoner.errors import ConfigError
from reasoner.infer.base import Request, sample_seed
from reasoner.shipped import find_file

_FINAL = re.compile(r"\\boxed\{\s*([01])\s*\}\s*$")


def strip_thinking(text: str) -> str:
    """The reply after the last `</think>` (reasoning models think first); unchanged if none."""
    end = text.rfind("</think>")
    return text[end + len("</think>"):] if end >= 0 else text


def parse_verdict(reply: str) -> int | None:
    """1 / 0 from a reply ending in exactly one `\\boxed{1}` / `\\boxed{0}`; otherwise None."""
    text = strip_thinking(reply).strip()
    if text.count("\\boxed") != 1:
        return None
    m = _FINAL.search(text)
    return int(m.group(1)) if m else None


def load_prompt(path: Path) -> str:
    path = find_file(Path(path))  # configs/judge/...: the package's when not here
    if not path.is_file():
        raise ConfigError(f"judge prompt template {path} does not exist (judge.prompt_file)")
    text = path.read_text()
    missing = [k for k in ("{reference}", "{candidate}") if k not in text]
    if missing:
        raise ConfigError(f"{path}: the judge prompt must contain {', '.join(missing)} "
                          "({problem} is optional)")
    return text


def render(template: str, problem: str, reference: str, extracted: str | None, response: str,
           tail_chars: int, candidate: str = "extracted") -> str:
    """The judge prompt. `candidate`: "extracted" shows the extracted final answer (the response
    tail when none was found); "tail" always shows the response's last `tail_chars` characters
    (PCL-Reasoner-V1.5: the end of the reasoning, in which only the boxed answer counts)."""
    if candidate == "tail":
        shown = response[-tail_chars:]
    elif extracted is not None:
        shown = extracted
    else:
        shown = ("(no final answer was extracted; the end of the response follows)\n"
                 + response[-tail_chars:])
    # str.replace, not format: problems are full of LaTeX braces
    return (template.replace("{problem}", problem).replace("{reference}", reference)
            .replace("{candidate}", shown))


class Judge:
    """Batched judging through an infer backend; verdicts 1 / 0 / None (invalid)."""

    def __init__(self, cfg: JudgeConfig):
        from reasoner.infer import make_generator

        if cfg.model is None:
            raise ConfigError("this verify mode needs a judge model: set judge.model.name_or_path")
        self.cfg = cfg
        self.template = load_prompt(cfg.prompt_file)
        self.gen = make_generator(cfg.model, cfg.backend, cfg.vllm, cfg.max_model_len,
                                  batch_size=cfg.batch_size, ray=cfg.ray, server=cfg.server)
        self.tokenizer = self.gen.tokenizer

    def _sampling(self, attempt: int) -> SamplingConfig:
        if self.cfg.enable_thinking:  # Qwen3's advice for thinking mode: never greedy
            return SamplingConfig(n=1, temperature=0.6, top_k=20, top_p=0.95,
                                  max_tokens=self.cfg.max_tokens, seed=attempt)
        if attempt == 0:  # greedy first
            return SamplingConfig(n=1, temperature=0.0, top_k=0, top_p=1.0,
                                  max_tokens=self.cfg.max_tokens, seed=0)
        return SamplingConfig(n=1, temperature=0.7, top_k=0, top_p=0.95,
                              max_tokens=self.cfg.max_tokens, seed=attempt)

    def prompt_text(self, item: dict) -> str:
        """The judge's full prompt for one item, through its chat template (thinking on or off)."""
        text = render(self.template, item["problem"], item["answer"], item.get("extracted"),
                      item["response"], self.cfg.tail_chars, self.cfg.candidate)
        return render_messages([{"role": "user", "content": text}], TemplateConfig(),
                               self.tokenizer, enable_thinking=self.cfg.enable_thinking)

    def stream(self, items: list[dict]) -> Iterator[tuple[int, int | None, str]]:
        """(index, verdict, last reply) of each item as soon as its verdict is final.

        Items have problem, answer, extracted, response, id, sample_idx. Every prompt goes to
        the backend at once (vLLM schedules them; nobody waits for a slow neighbour); an
        unparseable reply is asked again, sampled, up to `retries` times, then is `None`."""
        prompts = [self.tokenizer(self.prompt_text(it), add_special_tokens=False)["input_ids"]
                   for it in items]
        todo = list(range(len(items)))
        for attempt in range(self.cfg.retries + 1):
            sampling = self._sampling(attempt)
            requests = [Request(items[i]["id"], items[i]["sample_idx"], prompts[i],
                                sample_seed(attempt, items[i]["id"], items[i]["sample_idx"]),
                                self.cfg.max_tokens) for i in todo]
            again = []
            for j, c in self.gen.stream(requests, sampling):
                verdict = parse_verdict(c.text)
                if verdict is None and attempt < self.cfg.retries:
                    again.append(todo[j])
                else:
                    yield todo[j], verdict, c.text
            todo = sorted(again)
            if not todo:
                return

    def judge(self, items: list[dict]) -> list[tuple[int | None, str]]:
        """(verdict, last reply) per item, in item order."""
        results: list[tuple[int | None, str]] = [(None, "")] * len(items)
        for i, verdict, reply in self.stream(items):
            results[i] = (verdict, reply)
        return results

    def close(self) -> None:
        self.gen.close()
