"""`openai` backend: a model behind an OpenAI-compatible server (vLLM's, SGLang's, lmdeploy's).

A team's shared judge or sampler, reached over HTTP instead of an engine per stage. What is
sent is what the in-process backends compute from: the prompt is rendered and tokenized here
with the model's own tokenizer (`model.name_or_path`, read locally) and sent as token ids to
`/completions`, with each request's seed and the same sampling parameters (vLLM's extensions
`top_k`, `stop_token_ids`, `include_stop_str_in_output`, `return_token_ids`). The reply's token
ids are decoded here as the vllm backend decodes them, so a sample means the same whichever
backend drew it.

Behaviour log-probs come from the server only when the config says it runs `--logprobs-mode
processed_logprobs` (config.generation.check_backend refuses the rest: vLLM's default mode
returns the model's raw log-probs, and a client cannot see the mode).

Requests run `concurrency` at a time and are yielded as each returns, so infer writes every
sample when it exists and a rerun sends only what is missing. Connection errors, 429 and 5xx
are retried with exponential back-off; another 4xx, a reply that is not the API's JSON, or a
server serving another model stops the stage with one paragraph naming the URL and what came
back.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from reasoner.config import ModelConfig, SamplingConfig, ServerConfig
from reasoner.data.template import stop_token_ids
from reasoner.errors import ConfigError, ServerError
from reasoner.infer.base import Completion, Request, Streaming
from reasoner.infer.vllm import finish_reason

MAX_BACKOFF_S = 30.0


class Retry(Exception):
    """A failure worth another attempt (connection refused or reset, 429, 5xx, a time-out)."""


class ServerGenerator(Streaming):
    name = "openai"

    def __init__(self, model: ModelConfig, server: ServerConfig, max_model_len: int | None = None,
                 want_logprobs: bool = False):
        from reasoner.models import load_tokenizer

        if not server.base_url:
            raise ConfigError("backend openai needs server.base_url (e.g. http://localhost:8000/v1)")
        self.cfg = server
        self.url = server.base_url.rstrip("/")
        self.key = None
        if server.api_key_env:
            self.key = os.environ.get(server.api_key_env)
            if not self.key:
                raise ConfigError(f"server.api_key_env={server.api_key_env}, but that environment "
                                  "variable is not set: export it with the server's key")
        self.served = server.model or model.name_or_path
        self.want_logprobs = want_logprobs
        self.tokenizer = load_tokenizer(model.name_or_path, model.trust_remote_code)
        self.context_window = max_model_len or self._served_window()
        self.preferred_batch = 4 * server.concurrency
        self.stop_ids = stop_token_ids(self.tokenizer)

    def _served_window(self) -> int:
        """The served model's context window from `/models` (vLLM says `max_model_len`), after
        checking that the server serves it at all."""
        listing = self._call("GET", "/models")
        models = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(models, list):
            raise ServerError(f"{self.url}/models answered {_short(listing)}, not a list of "
                              "models: is server.base_url the API's root (it usually ends in /v1)?")
        names = [m.get("id") for m in models if isinstance(m, dict)]
        found = next((m for m in models if isinstance(m, dict) and m.get("id") == self.served),
                     None)
        if found is None:
            raise ServerError(f"{self.url} serves {names}, not {self.served!r}: set server.model "
                              "to the served name (the server's --served-model-name), or point "
                              "server.base_url at the server of that model")
        window = found.get("max_model_len") or getattr(self.tokenizer, "model_max_length", 0)
        if not window or window > 10**8:  # a tokenizer's "no limit" sentinel
            raise ServerError(f"{self.url} does not say {self.served!r}'s context window (no "
                              "max_model_len in /models): set max_model_len in the config")
        return int(window)

    def engine_info(self) -> dict[str, str]:
        return {"backend": "openai", "engine": f"server {self.url} ({self.served})"}

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """Up to `concurrency` requests in flight; each yielded as its reply arrives. A failure
        that outlasts the retries cancels what has not started and raises."""
        todo = iter(enumerate(requests))
        with ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="server") as pool:
            running: dict[Future, int] = {}

            def top_up() -> None:
                while len(running) < self.cfg.concurrency:
                    nxt = next(todo, None)
                    if nxt is None:
                        return
                    running[pool.submit(self._complete, nxt[1], sampling)] = nxt[0]

            top_up()
            try:
                while running:
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for future in done:
                        yield running.pop(future), future.result()
                    top_up()
            finally:
                for future in running:
                    future.cancel()

    def _complete(self, r: Request, sampling: SamplingConfig) -> Completion:
        body: dict[str, Any] = {
            "model": self.served, "prompt": list(r.prompt_ids), "max_tokens": r.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "seed": r.seed, "stop": list(sampling.stop),
            "stop_token_ids": self.stop_ids, "include_stop_str_in_output": True,
            "return_token_ids": True, "n": 1,
            # what a served model's generation_config.json could otherwise set by default
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "min_p": 0.0}
        if self.want_logprobs:
            body.update(logprobs=0, return_tokens_as_token_ids=True)
        reply = self._call("POST", "/completions", body)
        try:
            choice = reply["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            reason = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.url}/completions answered {_short(reply)}: no choices[0]."
                              "token_ids (the server must accept vLLM's return_token_ids, so "
                              "that samples are token ids as with the other backends)") from None
        logprobs = None
        if self.want_logprobs:
            logprobs = [0.0] * len(ids) if sampling.temperature == 0 else self._logprobs(
                choice, ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, text, finish_reason(reason), logprobs)

    def _logprobs(self, choice: dict, ids: list[int]) -> list[float]:
        """The sampled tokens' log-probs, checked against the token ids they belong to."""
        lp = choice.get("logprobs") or {}
        values, tokens = lp.get("token_logprobs"), lp.get("tokens")
        if not isinstance(values, list) or len(values) != len(ids) or (
                tokens is not None and tokens != [f"token_id:{t}" for t in ids]):
            raise ServerError(f"{self.url}/completions returned log-probs that do not match its "
                              f"{len(ids)} tokens: {_short(lp)}")
        return [float(v) for v in values]

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        """One API call with the retries (see the module's docstring); the reply's JSON."""
        attempts = self.cfg.retries + 1
        for attempt in range(attempts):
            try:
                return self._once(method, path, body)
            except Retry as why:
                if attempt == attempts - 1:
                    raise ServerError(f"{self.url}{path}: {why}, still after {attempts} attempts; "
                                      "is the server up? The samples written so far are kept: "
                                      "the same command resumes") from None
                time.sleep(min(MAX_BACKOFF_S, 2.0 ** attempt))
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, body: dict | None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers,
                                         method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            said = e.read().decode(errors="replace")
            if e.code == 429 or e.code >= 500:
                raise Retry(f"HTTP {e.code} {_short(said)}") from None
            hint = {401: " (a wrong or missing key: server.api_key_env)",
                    403: " (the key may not use this model)",
                    404: " (a wrong server.base_url or model name)"}.get(e.code, "")
            raise ServerError(f"{self.url}{path} answered HTTP {e.code}{hint}: {_short(said)}"
                              ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            raise Retry(f"no answer ({getattr(e, 'reason', e)})") from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise ServerError(f"{self.url}{path} answered what is not JSON: "
                              f"{_short(raw.decode(errors='replace'))}") from None

    def close(self) -> None:
        pass


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + " ..."
