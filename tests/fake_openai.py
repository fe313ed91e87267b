"""A fake OpenAI-compatible server for r1kit's endpoint tests: the standard library only,
replies that are a pure function of the request, and faults on demand.

    with FakeServer(names=["tiny"], key="sk-test") as server:     # in-process, on a free port
        server.url                   # http://127.0.0.1:PORT/v1
        server.faults += ["429", "drop"]   # the next two POSTs fail so, one fault each
        server.requests              # every POST: path, prompt, seed, n, fault, in-flight count
        server.gauge.peak            # most POSTs in flight at once

    python tests/fake_openai.py --served-model-name NAME --host H --port P [--delay S] [--log FILE]
        [--api-key KEY] [--fault F ...]      # vLLM's flags (--model, --max-model-len ...) are ignored

As a script it stands in for vLLM's server (r1kit.sampling.serve.Servers' ``command``): it
prints its arguments and the pid of a child it starts (``sleep 1000``, as vLLM starts engine
processes), writes each POST as a JSON line to ``--log``, and on SIGTERM ends the child (unless
``--keep-child``) and exits.

GET /health, GET /v1/models; POST /v1/completions and /v1/chat/completions; POST /classify (vLLM's
pooling runner, at the root) where ``classify`` scores token ids. Sample j of a prompt
is `completion(prompt, seed, j, temperature, max_tokens)`: words and token ids from a hash
(greedy ignores seed and j), finish_reason "length" when it reaches max_tokens. With
``max_model_len`` set, /models reports it and, as vLLM does, max_tokens shrinks in silence to
what the context leaves after the prompt (token ids, or a chat message's words). Faults: "429"
(Retry-After: `retry_after`), any other status code ("500", "400"), "drop" (close without a
reply), "slow" (sleep `slow` seconds first), "cut" (a body shorter than its Content-Length),
"garbage" (200 with a body that is not JSON). ``usage = False``: replies without ``usage``.
``chat_reply``: a function of a chat request's body giving every sample's content instead (a
scripted judge). ``classify``: a function of one input's token ids giving its score (a served
reward model).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = "so the sum is then carry one two three four five six seven eight nine ten".split()


def completion(prompt, seed, index: int, temperature: float, max_tokens: int) -> dict:
    """Sample `index` of `prompt`: {"text", "token_ids", "finish_reason"}."""
    key = [prompt, temperature] if temperature == 0 else [prompt, seed, index, temperature]
    digest = hashlib.sha256(json.dumps(key).encode()).digest()
    ids = list(digest[1 : 2 + digest[0] % 12])[:max_tokens]
    return {"text": " ".join(WORDS[i % len(WORDS)] for i in ids), "token_ids": ids,
            "finish_reason": "length" if len(ids) >= max_tokens else "stop"}


class Gauge:
    """POSTs in flight now, and the most at once (one gauge may serve several servers)."""

    def __init__(self):
        self.lock, self.now, self.peak = threading.Lock(), 0, 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            return self.now

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM: a dropped connection is a pooled one

    def log_message(self, *args):
        pass

    def handle(self):
        try:
            super().handle()
        except ConnectionResetError:  # the client closed its connection mid-request (a sampler closed on Ctrl-C)
            self.close_connection = True

    def reply(self, status: int, body, headers: dict | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def authorized(self) -> bool:
        key = self.server.fake.key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self.reply(401, {"error": {"message": "Unauthorized"}})
            return False
        return True

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, b"")
        elif not self.authorized():
            pass
        elif self.path == "/v1/models":
            context = {"max_model_len": self.server.fake.max_model_len} if self.server.fake.max_model_len else {}
            self.reply(200, {"object": "list", "data": [{"id": n, "object": "model", **context} for n in self.server.fake.names]})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        fake = self.server.fake
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client died between its headers and its body: nothing was asked
            self.close_connection = True
            return
        body = json.loads(raw or b"{}")
        with fake.gauge as inflight:
            try:
                self.answer(fake, body, inflight)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
                self.close_connection = True

    def answer(self, fake: "FakeServer", body: dict, inflight: int) -> None:
        chat = self.path == "/v1/chat/completions"
        prompt = body.get("messages") if chat else body.get("prompt")
        with fake.lock:
            fault = fake.faults.pop(0) if fake.faults else None
        fake.record({"path": self.path, "prompt": prompt, "seed": body.get("seed"), "n": body.get("n", 1), "fault": fault,
                     "inflight": inflight, "body": {k: v for k, v in body.items() if k not in ("prompt", "messages")}})
        time.sleep(fake.delay + (fake.slow if fault == "slow" else 0))
        if fault == "drop":
            self.close_connection = True
            return
        if fault == "garbage":
            return self.reply(200, b"<html>502 Bad Gateway</html>", {"Content-Type": "text/html"})
        if fault not in (None, "slow", "cut"):
            return self.reply(int(fault), {"error": {"message": f"injected fault {fault}"}},
                              {"Retry-After": fake.retry_after} if fault == "429" else {})
        if not self.authorized():
            return
        if self.path == "/classify" and fake.classify and body.get("model") in fake.names:
            rows = [{"index": i, "label": "LABEL_0", "probs": [fake.classify(ids)], "num_classes": 1} for i, ids in enumerate(body["input"])]
            return self.reply(200, {"object": "list", "model": body["model"], "data": rows[::-1]})  # any order
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self.reply(404, {"detail": "Not Found"})  # FastAPI's reply to a route vLLM does not have
        if body.get("model") not in fake.names:
            return self.reply(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        prompt_tokens = len(prompt) if not chat else sum(len(m["content"].split()) for m in prompt)
        max_tokens = body.get("max_tokens", 16)
        if fake.max_model_len:  # as vLLM: a completion that would pass the context is cut short, in silence
            max_tokens = min(max_tokens, fake.max_model_len - prompt_tokens)
        samples = [completion(prompt, body.get("seed"), j, body.get("temperature", 1.0), max_tokens) for j in range(body.get("n", 1))]
        choices = [{"index": j, "message": {"role": "assistant", "content": fake.chat_reply(body) if fake.chat_reply else s["text"]},
                    "finish_reason": s["finish_reason"]} if chat
                   else {"index": j, "text": s["text"], "finish_reason": s["finish_reason"],
                         **({"token_ids": s["token_ids"]} if body.get("return_token_ids") else {})} for j, s in enumerate(samples)]
        used = sum(len(s["token_ids"]) for s in samples)
        usage = {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}} if fake.usage else {}
        data = json.dumps({"object": "text_completion", "model": body["model"], "choices": choices[::-1], **usage}).encode()  # any order
        if fault == "cut":
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Length", str(len(data) + 100))
            self.end_headers()
            return self.wfile.write(data[: len(data) // 2])
        self.reply(200, data)


class FakeServer:
    """The server on `host`:`port` (0: a free one), serving model `names`; a context manager that
    runs it in a thread. `key`: the API key it requires, if any; `delay`: seconds per POST."""

    def __init__(self, names=("tiny",), key: str | None = None, delay: float = 0.0, log: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, gauge: Gauge | None = None):
        self.names, self.key, self.delay, self.log = list(names), key, delay, log
        self.faults: list[str] = []
        self.requests: list[dict] = []
        self.retry_after, self.slow, self.usage = "0", 2.0, True  # Retry-After of a 429; seconds of "slow"; send usage
        self.max_model_len: int | None = None  # the context /models reports, which cuts completions short (None: none)
        self.chat_reply = None  # body -> the content of a chat reply's samples (None: hash words)
        self.classify = None  # token ids -> a score: POST /classify answers, as vLLM's pooling runner (None: no such route)
        self.lock, self.gauge = threading.Lock(), gauge or Gauge()
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads, self.httpd.fake = True, self
        self.url = f"http://{host}:{self.httpd.server_port}/v1"

    def record(self, request: dict) -> None:
        with self.lock:
            self.requests.append(request)
            if self.log:
                with open(self.log, "a") as f:
                    f.write(json.dumps(request) + "\n")

    def answered(self) -> list[dict]:
        """The POSTs answered without a fault."""
        return [r for r in self.requests if r["fault"] is None]

    def __enter__(self) -> "FakeServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag, kind in [("--served-model-name", str), ("--host", str), ("--port", int), ("--delay", float), ("--log", str), ("--api-key", str)]:
        parser.add_argument(flag, type=kind)
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--keep-child", action="store_true", help="on SIGTERM, exit and leave the child running")
    parser.add_argument("--chat-reply", help="the content of every chat reply (a scripted judge)")
    args, _ = parser.parse_known_args()
    server = FakeServer([args.served_model_name or "fake"], args.api_key, args.delay or 0.0, args.log, args.host or "127.0.0.1", args.port or 0)
    server.faults = args.fault
    if args.chat_reply is not None:
        server.chat_reply = lambda body: args.chat_reply
    child = subprocess.Popen(["sleep", "1000"])
    signal.signal(signal.SIGTERM, lambda *_: (args.keep_child or child.kill(), os._exit(0)))
    print(f"fake_openai: argv {sys.argv[1:]}", flush=True)
    print(f"fake_openai: child {child.pid}; serving at {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
