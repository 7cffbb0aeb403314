"""backend openai against a stand-in server on localhost (the real vLLM server:
tests/integration/test_server.py): what is sent, what is retried, what stops a stage."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tests_helpers import quiet

from reasoner import infer, shards
from reasoner.config import InferConfig
from reasoner.data.template import render_prompt
from reasoner.errors import ServerError
from reasoner.infer import server as server_mod
from reasoner.infer.base import sample_seed


class Fake:
    """What the stand-in serves and what it was sent; `fail` lists status codes (or "junk")
    for the next completions, one each."""

    def __init__(self):
        self.bodies, self.fail, self.models, self.auth = [], [], ["tiny"], []
        self.lock = threading.Lock()


@pytest.fixture
def fake_server(monkeypatch):
    fake = Fake()
    monkeypatch.setattr(server_mod.time, "sleep", lambda s: None)  # back-off without waiting

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code, payload):
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(200, {"data": [{"id": m, "max_model_len": 256} for m in fake.models]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with fake.lock:
                fake.auth.append(self.headers.get("Authorization"))
                failure = fake.fail.pop(0) if fake.fail else None
            if failure == "junk":
                return self.reply(200, b"<html>gateway</html>")
            if failure is not None:
                return self.reply(failure, {"error": {"message": f"status {failure}"}})
            with fake.lock:
                fake.bodies.append(body)
            ids = [5 + (body["seed"] + k) % 20 for k in range(min(4, body["max_tokens"]))]
            self.reply(200, {"choices": [{"index": 0, "text": "ignored", "token_ids": ids,
                                          "finish_reason": "length"}]})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield fake
    httpd.shutdown()


def cfg(synth_dir, model_dir, out, url, **server):
    return quiet(InferConfig.model_validate({
        "model": {"name_or_path": str(model_dir)},
        "data": {"path": str(synth_dir / "test_problems"), "limit": 3},
        "output_dir": str(out), "template": {"instruction": ""},
        "sampling": {"n": 2, "max_tokens": 12, "temperature": 1.0, "seed": 0},
        "backend": "openai", "server": {"base_url": url, "model": "tiny", **server}}))


def test_prompts_go_as_the_token_ids_the_other_backends_use_with_each_samples_seed(
        fake_server, synth_dir, tiny_model_dir, tmp_path):
    from reasoner.models import load_tokenizer

    out = infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "s", fake_server.url))
    got = list(shards.iter_rows(out))
    assert len(got) == 6 and shards.is_complete(out)
    tok = load_tokenizer(str(tiny_model_dir))
    problems = {p["id"]: p for p in shards.iter_rows(synth_dir / "test_problems")}
    for row in got:
        body = next(b for b in fake_server.bodies
                    if b["seed"] == sample_seed(0, row["id"], row["sample_idx"]))
        text = render_prompt(problems[row["id"]]["problem"], cfg(
            synth_dir, tiny_model_dir, tmp_path, fake_server.url).template, tok)
        assert body["prompt"] == tok(text, add_special_tokens=False)["input_ids"]
        assert (body["model"], body["temperature"], body["top_k"], body["top_p"]) == (
            "tiny", 1.0, 40, 0.95)
        assert body["return_token_ids"] and body["include_stop_str_in_output"]
        ids = [5 + (body["seed"] + k) % 20 for k in range(4)]  # what the stand-in answered
        assert row["response"] == tok.decode(ids, skip_special_tokens=True)  # decoded here
        assert (row["response_tokens"], row["finish_reason"]) == (4, "length")
    manifest = shards.read_manifest(out)
    assert manifest["engine"] == {"backend": "openai",
                                  "engine": f"server {fake_server.url} (tiny)"}


def test_429_and_5xx_are_retried_other_4xx_and_junk_stop_with_one_paragraph(
        fake_server, synth_dir, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("THE_KEY", "sk-test")
    fake_server.fail = [503, 429, 502]
    out = infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "a", fake_server.url,
                        api_key_env="THE_KEY", concurrency=1))
    assert len(list(shards.iter_rows(out))) == 6 and len(fake_server.bodies) == 6
    assert set(fake_server.auth) == {"Bearer sk-test"}
    fake_server.fail = [401]
    with pytest.raises(ServerError, match=r"answered HTTP 401 \(a wrong or missing key"):
        infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "b", fake_server.url))
    fake_server.fail = ["junk"]
    with pytest.raises(ServerError, match="answered what is not JSON: <html>gateway</html>"):
        infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "c", fake_server.url))
    fake_server.fail = [503] * 3
    with pytest.raises(ServerError, match="HTTP 503 .* still after 3 attempts; is the server up"):
        infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "d", fake_server.url, retries=2,
                      concurrency=1))


def test_a_stopped_stage_resumes_sending_only_what_is_missing(fake_server, synth_dir,
                                                              tiny_model_dir, tmp_path,
                                                              monkeypatch):
    """The fourth request fails for good: three samples are on disk; the rerun sends the
    other three and the folder holds each of the six once."""
    config = cfg(synth_dir, tiny_model_dir, tmp_path / "s", fake_server.url, concurrency=1)
    sent = []
    original = server_mod.ServerGenerator._complete

    def fail_fourth(self, r, sampling):
        sent.append(r.seed)
        if len(sent) == 4:
            raise ServerError("stand-in: the server went away")
        return original(self, r, sampling)

    monkeypatch.setattr(server_mod.ServerGenerator, "_complete", fail_fourth)
    with pytest.raises(ServerError):
        infer.run(config)
    assert len(list(shards.iter_rows(tmp_path / "s"))) == 3
    monkeypatch.setattr(server_mod.ServerGenerator, "_complete", original)
    fake_server.bodies.clear()
    infer.run(config)
    rows = list(shards.iter_rows(tmp_path / "s"))
    assert len(rows) == 6 and len({(r["id"], r["sample_idx"]) for r in rows}) == 6
    assert len(fake_server.bodies) == 3


def test_a_server_of_another_model_or_a_wrong_url_is_named(fake_server, synth_dir,
                                                           tiny_model_dir, tmp_path):
    fake_server.models = ["Qwen/Qwen3-32B"]
    with pytest.raises(ServerError, match=r"serves \['Qwen/Qwen3-32B'\], not 'tiny': set "
                                          "server.model"):
        infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "a", fake_server.url))
    with pytest.raises(ServerError, match=r"http://127.0.0.1:9/v1/models: no answer .* still "
                                          "after 1 attempts"):
        infer.run(cfg(synth_dir, tiny_model_dir, tmp_path / "b", "http://127.0.0.1:9/v1",
                      retries=0))
    assert not list((tmp_path / "b").glob("part-*"))


def test_settings_that_say_where_the_server_is_leave_the_folder_identity_alone(
        synth_dir, tiny_model_dir, tmp_path):
    from reasoner import outputs

    def identity(**server):
        c = cfg(synth_dir, tiny_model_dir, tmp_path, "http://a:1/v1", **server)
        return outputs.Identity.of("infer", c.result_config(), []).digest

    base = identity()
    assert identity(base_url="http://b:2/v1", concurrency=64, timeout_s=5, retries=0,
                    api_key_env="K") == base
    assert identity(model="other") != base and identity(logprobs_mode="processed") != base


def test_stored_logprobs_need_a_server_that_says_it_sends_the_behaviour_ones(synth_dir,
                                                                           tiny_model_dir,
                                                                           tmp_path):
    from pydantic import ValidationError

    base = {"model": {"name_or_path": str(tiny_model_dir)},
            "data": {"path": str(synth_dir / "test_problems")}, "output_dir": str(tmp_path),
            "backend": "openai", "sampling": {"logprobs": True},
            "server": {"base_url": "http://a:1/v1"}}
    with pytest.raises(ValidationError, match="processed_logprobs.*old_logprobs: recompute"):
        InferConfig.model_validate(base)
    InferConfig.model_validate({**base, "server": {"base_url": "http://a:1/v1",
                                                   "logprobs_mode": "processed"}})
    with pytest.raises(ValidationError, match="backend openai needs server.base_url"):
        InferConfig.model_validate({**base, "server": {}, "sampling": {}})
