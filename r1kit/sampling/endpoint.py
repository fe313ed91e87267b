"""The endpoint sampling backend: a model served behind an OpenAI-compatible API (vLLM, SGLang,
a hosted API), sampled with r1kit's prompts and protocol.

    from r1kit.sampling.base import Endpoint
    from r1kit.sampling.endpoint import EndpointSampler
    sampler = EndpointSampler("Qwen/Qwen2.5-Math-7B", Endpoint(url=["http://127.0.0.1:8000/v1"], name="qwen"))
    sampler.generate_full([prompt], n=8, params=SamplingParams(max_tokens=4096))

r1kit renders the prompt (template, think prefill) with the model's tokenizer and sends it to
``/completions`` as token ids, so a vLLM or SGLang server continues exactly the tokens the
in-process backends would; with ``chat: true`` it sends the question as a user message to
``/chat/completions`` instead (an API without a completions endpoint; the server applies its own
chat template, so the template must be ``chat`` or ``plain``: `chat_problem`; no tokenizer is
needed, and a reasoning model's separate ``reasoning_content`` comes back inside <think> tags).
Each prompt is one request with ``n`` samples and its own seed, ``params.seed`` plus n times the
prompt's place in the call, as r1kit.sampling.vllm_backend seeds: vLLM draws sample j of a
request from seed + j, so no two samples of a call share a stream, and a served vLLM draws what
the in-process one draws (with ``chat: true`` the n samples are n requests of seeds seed + j: a
chat reply counts only the tokens of all its samples together). A completion's token count comes
from the server's token ids (vLLM's ``return_token_ids``), else from ``usage`` (one sample), else
from the local tokenizer on the completions endpoint; with ``chat: true`` never from a local
re-tokenization (the server's template and tokenizer made the text): None, unknown. It is
truncated when the server's ``finish_reason`` is ``length``.

What a real server needs:

- at most ``concurrency`` requests in flight over all servers, each to the least busy URL;
- retries with doubling backoff (1 s, 2 s, ... at most 60 s, or the server's Retry-After) on
  429, 5xx, timeouts, dropped connections and replies cut short; ``retries`` of them, then a
  one-line `EndpointError`;
- one-line `EndpointError`s (exit 2) for what retrying cannot fix, found before any sample:
  nothing listening at a URL, a refused key (401/403), a model name the server does not serve
  (the names it serves listed), a request the server rejects (400, e.g. max_tokens past the
  model's length), a prompt plus max_tokens past the context a server reports (vLLM's
  ``max_model_len`` in /models), which vLLM would answer with completions cut short in silence
  (with ``chat: true`` the server renders the prompt: found at its first reply);
- the API key read from the environment variable ``api_key_env`` names, sent as a bearer token
  and never stored.

Resuming without asking the server twice is r1kit.sampling.jobs': a job journals each chunk as it
finishes and runs ``concurrency`` requests' worth of chunks at once. Tool rollouts
(r1kit.sampling.tool_loop) stop each turn at a block's closing fence (a stop string), run it,
and continue the same completion with the server from the token ids so far.

Not here: starting servers (r1kit.sampling.serve), what is sampled (the consumers).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

from r1kit.errors import RecipeError
from r1kit.sampling.base import Completion, Endpoint, SamplingParams

log = logging.getLogger("r1kit")

RETRY_STATUS = {408, 409, 425, 429}
"""Statuses below 500 worth asking again (a timeout, a conflict, too early, too many requests); every 5xx is too."""
MAX_WAIT = 60.0


class EndpointError(RecipeError):
    """A served model cannot be sampled: one line naming the URL and what to fix."""


class ChatTurns:
    """The tokenizer of ``chat: true``: r1kit's chat template gives the user's turn as it is,
    which the server wraps in its own chat template."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return messages[-1]["content"]


class Client:
    """Requests to `endpoint`'s servers for model `name`: bounded, spread, retried (see the module docstring)."""

    KEY_FIELD = "endpoint.api_key_env"
    """The setting that names the key's variable, for the errors (a reward's client names its own)."""
    NAME_HINT = "set endpoint.name; r1kit eval: --served-model"
    """What to set where a server does not serve the model."""

    def __init__(self, endpoint: Endpoint, name: str, timeout: float | None = None):
        import httpx

        self.config, self.name = endpoint, name
        self.urls = [u.rstrip("/") for u in endpoint.url]
        self.busy = {u: 0 for u in self.urls}
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(endpoint.concurrency)
        key = os.environ.get(endpoint.api_key_env, "") if endpoint.api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(timeout=httpx.Timeout(timeout or endpoint.timeout, connect=30.0),
                                 limits=httpx.Limits(max_connections=endpoint.concurrency + len(self.urls)),
                                 trust_env=not all(map(loopback, self.urls)))  # a proxy setting never reroutes a local server
        self.closed = threading.Event()
        """Set by `close`: a back-off wait ends at once and no request starts (Ctrl-C does not wait a minute)."""
        self.requests = 0
        """Requests answered (bench/served.py, the tests)."""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections: requests in flight end at once (an interrupted job does not wait for them)."""
        self.closed.set()
        self.http.close()

    def models(self, url: str) -> dict[str, int | None]:
        """The names `url` serves, each with its context length (vLLM's ``max_model_len``; None
        where the server does not say); one-line errors for no server, a refused key or another reply."""
        import httpx

        try:
            reply = self.http.get(f"{url}/models", headers=self.headers, timeout=30.0)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{url}: no server answers ({_reason(exc)}); check the URL and that the server is up") from None
        if reply.status_code in (401, 403):
            raise EndpointError(f"{url}: the server refused the API key (HTTP {reply.status_code}); {self._key_hint()}")
        if reply.status_code != 200:
            raise EndpointError(f"{url}/models: HTTP {reply.status_code}: {_message(reply)}; is this an OpenAI-compatible base URL (ending /v1)?")
        try:
            return {m["id"]: m.get("max_model_len") if isinstance(m.get("max_model_len"), int) else None for m in reply.json()["data"]}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise EndpointError(f"{url}/models: not an OpenAI model list; is this an OpenAI-compatible base URL (ending /v1)?") from None

    def check(self, url: str) -> int | None:
        """That `url` answers, takes the key and serves the model; its context length (or None)."""
        served = self.models(url)
        if self.name not in served:
            raise EndpointError(f"{url}: serves no model {self.name!r}; it serves: {', '.join(served) or 'none'} ({self.NAME_HINT})")
        return served[self.name]

    def _key_hint(self) -> str:
        env = self.config.api_key_env
        return f"set {env} to a valid key" if env else f"name the variable holding the key in {self.KEY_FIELD}"

    def post(self, path: str, body: dict) -> dict:
        """POST `body` to the least busy server, retrying what a retry can fix."""
        import httpx

        error = ""
        for attempt in range(self.config.retries + 1):
            if self.closed.is_set():
                raise EndpointError(f"{self.urls[0]}: the client was closed (the job was interrupted)")
            wait = min(MAX_WAIT, 2.0**attempt) * (0.5 + random.random() / 2)
            with self.slots:
                with self.lock:
                    url = min(self.urls, key=self.busy.__getitem__)
                    self.busy[url] += 1
                try:
                    reply = self.http.post(self.address(url, path), json=body, headers=self.headers)
                    data = reply.json() if reply.status_code == 200 else None
                except httpx.TransportError as exc:  # refused, dropped, timed out, cut short
                    error = _reason(exc)
                except ValueError as exc:
                    error = f"a reply that is not JSON ({exc})"
                else:
                    error = self._refusal(url, reply) if data is None else self.unanswered(body, data)
                    if not error:
                        with self.lock:
                            self.requests += 1
                        return data
                    wait = max(wait, _retry_after(reply))
                finally:
                    with self.lock:
                        self.busy[url] -= 1
            if attempt < self.config.retries:
                if self.closed.is_set():  # closed while in flight (Ctrl-C, another request's error): no retry to announce
                    continue
                log.warning("%s: %s; retry %d of %d in %.1f s", self.address(url, path), error, attempt + 1, self.config.retries, wait)
                self.closed.wait(wait)
        raise EndpointError(f"{self.address(url, path)}: {error}; {self.config.retries} retries exhausted")

    def address(self, url: str, path: str) -> str:
        """Where `path` is asked of the server at base URL `url` (one ending /v1)."""
        return url + path

    def unanswered(self, body: dict, data) -> str:
        """What a 200 reply to `body` lacks, retried (a completion's choices cut short); "" when it answers."""
        choices = data.get("choices") if isinstance(data, dict) else None
        if isinstance(choices, list) and len(choices) == body.get("n", 1):
            return ""
        return f"a reply with {len(choices or [])} choices for n={body.get('n', 1)}"

    def _refusal(self, url: str, reply) -> str:
        """The error of a reply that is not 200: raised when no retry can fix it, else returned."""
        status = reply.status_code
        if status in RETRY_STATUS or status >= 500:
            return f"HTTP {status}: {_message(reply)}"
        if status in (401, 403):
            raise EndpointError(f"{url}: the server refused the API key (HTTP {status}); {self._key_hint()}")
        if status == 404:
            self.check(url)  # names what the server serves
        raise EndpointError(f"{url}: the server refused the request (HTTP {status}): {_message(reply)}")


def probe(endpoint: Endpoint, name: str | None) -> None:
    """Ask every URL of `endpoint` which models it serves, as `EndpointSampler` does first; an
    EndpointError when one does not answer, refuses the key or (with `name`) lacks the model."""
    with Client(endpoint, name or "", timeout=10.0) as client:
        for url in client.urls:
            client.check(url) if name else client.models(url)


class EndpointSampler:
    backend = "endpoint"

    def __init__(self, model: str, endpoint: Endpoint, tokenizer=None):
        """A client of `endpoint`'s servers for `model` (the tokenizer's folder or hub id, and the
        served name unless ``endpoint.name`` gives one). Asks every server which models it serves
        first, so that a wrong URL, key or name fails here, before any sample."""
        from r1kit.sampling import backends

        if problem := backends.settings_problem("endpoint", endpoint) or endpoint.machine_problem():
            raise EndpointError(problem)
        self.config, self.concurrency = endpoint, endpoint.concurrency
        self.client = Client(endpoint, endpoint.name or model)
        try:
            contexts = [c for c in map(self.client.check, self.client.urls) if c is not None]
            self.context = min(contexts, default=None)
            """The served context in tokens (the least of the servers'), where they say; None: unknown."""
            self.counting = tokenizer if tokenizer is not None else _tokenizer(model, endpoint.chat)
            """The model's tokenizer: prompts to token ids, texts to token counts (None: an API's model, not loadable)."""
            self.tokenizer = ChatTurns() if endpoint.chat else self.counting
            """What the consumers render prompts with: with ``chat: true`` the server applies the chat template."""
        except BaseException:
            self.close()
            raise
        self.tokenizing = threading.Lock()  # a fast tokenizer refuses calls from two threads at once ("Already borrowed")
        self.post = self.client.post

    def close(self) -> None:
        self.client.close()

    def ids(self, text: str) -> list[int]:
        with self.tokenizing:
            return self.counting(text, add_special_tokens=False)["input_ids"]

    # -- sampling ------------------------------------------------------------------------------

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        return [[c.text for c in row] for row in self.generate_full(prompts, n, params)]

    def generate_full(self, prompts: list[str], n: int, params: SamplingParams, tools: list | None = None) -> list[list[Completion]]:
        if tools:
            return self._with_tools(prompts, n, params, tools)
        return _threaded(min(len(prompts), self.concurrency), lambda i: self._sample(prompts[i], n, params, params.seed + i * n), range(len(prompts)))

    def _body(self, params: SamplingParams, n: int, seed: int, max_tokens: int) -> dict:
        return {"model": self.client.name, "n": n, "temperature": params.temperature, "top_p": params.engine_top_p,
                "max_tokens": max_tokens, "seed": seed}

    def _sample(self, prompt: str, n: int, params: SamplingParams, seed: int) -> list[Completion]:
        draws = params.draws(n)
        body = self._body(params, draws, seed, params.max_tokens)
        if self.config.chat:
            if draws > 1:  # a chat reply counts only all its samples' tokens (usage): each sample is asked alone
                return [c for j in range(draws) for c in self._sample(prompt, 1, params, seed + j)]
            data = self.post("/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]})
            self._fits((data.get("usage") or {}).get("prompt_tokens"), params.max_tokens)  # the server rendered the prompt
        else:
            ids = self.ids(prompt)
            self._fits(len(ids), params.max_tokens)
            data = self.post("/completions", {**body, "prompt": ids, "return_token_ids": True})
        out = []
        for c in sorted(data["choices"], key=lambda c: c.get("index", 0)):
            text = _chat_text(c.get("message") or {}) if self.config.chat else c.get("text") or ""
            out.append(Completion(text=text, tokens=self._count(c, text, data, draws), truncated=c.get("finish_reason") == "length"))
        return out * (n // draws)

    def _fits(self, prompt_tokens: int | None, max_tokens: int) -> None:
        """An EndpointError when a prompt plus `max_tokens` passes the served context, where a
        server (vLLM) cuts the completions short in silence instead of refusing the request."""
        if self.context is not None and isinstance(prompt_tokens, int) and prompt_tokens + max_tokens > self.context:
            raise EndpointError(
                f"{self.client.urls[0]}: a prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} passes the served context of "
                f"{self.context} tokens (max_model_len), and the server would cut completions short; lower max_tokens or serve a longer max_model_len"
            )

    def _count(self, choice: dict, text: str, data: dict, draws: int) -> int | None:
        if isinstance(choice.get("token_ids"), list):
            return len(choice["token_ids"])
        if draws == 1 and isinstance((data.get("usage") or {}).get("completion_tokens"), int):
            return data["usage"]["completion_tokens"]
        if self.config.chat:  # the server's chat template and tokenizer made the text: a local count would be a guess
            return None
        return len(self.ids(text))

    def _with_tools(self, prompts: list[str], n: int, params: SamplingParams, tools: list) -> list[list[Completion]]:
        """Rollouts that call `tools` (r1kit.sampling.tool_loop), each turn a request stopping at a block's closing fence."""
        from r1kit.sampling import tool_loop

        if self.config.chat:
            raise EndpointError("endpoint.chat: tool rollouts continue r1kit's own prompt; use the completions endpoint (chat: false)")
        eos_ids = {self.tokenizer.eos_token_id}
        calls = iter(range(1 << 30))

        def one(prompt: list[int], k: int, max_tokens: int, seed: int) -> list[list[int]]:
            body = {**self._body(params, k, seed, max_tokens), "prompt": prompt, "return_token_ids": True,
                    "stop": tool_loop.stop_strings(tools), "include_stop_str_in_output": True, "skip_special_tokens": False}
            data = self.post("/completions", body)
            return [c["token_ids"] if isinstance(c.get("token_ids"), list) else self.ids(c["text"])
                    for c in sorted(data["choices"], key=lambda c: c.get("index", 0))]

        def step(turn_prompts, counts, max_tokens, stop=None):
            seeds = [params.seed + next(calls) for _ in turn_prompts]
            rows = _threaded(min(len(turn_prompts), self.concurrency), lambda j: one(turn_prompts[j], counts[j], max_tokens, seeds[j]),
                             range(len(turn_prompts)))
            return [ids for row in rows for ids in row]

        ids = [self.ids(p) for p in prompts]
        out = tool_loop.completions(step, ids, [n] * len(prompts), params.max_tokens, tools, self.tokenizer, eos_ids)
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


def _threaded(workers: int, fn, items) -> list:
    """`fn` of each item on `workers` threads, in order. An error or Ctrl-C returns at once: what
    is in flight ends when the sampler closes (a ``with`` block would wait for it, a minute of
    back-off or a whole long sample)."""
    pool = ThreadPoolExecutor(max(1, workers))
    try:
        return list(pool.map(fn, items))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def chat_problem(endpoint: Endpoint, template: str) -> str | None:
    """Why prompts of `template` cannot go to `endpoint` (with ``chat: true`` the rendered prompt
    is the user's message, which the server wraps in its own chat template: only the question,
    with or without R1's guidance, belongs there), in one line naming the key, or None."""
    if endpoint.chat and template not in ("chat", "plain"):
        return (f"endpoint.chat: the server wraps the user message in its own chat template, so template {template}'s prompt would "
                "be sent inside it; set template: chat (the question with R1's guidance) or plain (the question alone)")
    return None


def _tokenizer(model: str, chat: bool):
    """The model's tokenizer; with ``chat: true`` None where there is none to load (an API's model)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        if chat:
            return None
        raise EndpointError(
            f"{model}: r1kit renders the prompt with the model's tokenizer and cannot load it ({str(exc).splitlines()[0]}); "
            "name a local folder or hub id as the stage's model, or set endpoint.chat: true"
        ) from None


def loopback(url: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(url).hostname in ("127.0.0.1", "localhost", "::1")


def _chat_text(message: dict) -> str:
    """A chat reply's text; a reasoning model's separate reasoning (``reasoning_content``, as
    DeepSeek's API and vLLM's reasoning parsers return it) goes first, inside <think> tags, as
    R1 writes it."""
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return f"<think>\n{reasoning.strip()}\n</think>\n\n{content}" if reasoning else content


def _reason(exc: Exception) -> str:
    import httpx

    kind = {httpx.ConnectError: "connection refused", httpx.TimeoutException: "timed out",
            httpx.RemoteProtocolError: "connection dropped or reply cut short", httpx.ReadError: "connection dropped"}
    what = next((v for k, v in kind.items() if isinstance(exc, k)), type(exc).__name__)
    return f"{what}: {exc}" if str(exc) else what


def _message(reply) -> str:
    """The error message a server put in its reply, on one line."""
    try:
        body = reply.json()
        text = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("detail") or body.get("error")
    except (ValueError, AttributeError):
        text = None
    return " ".join(str(text or reply.text or reply.reason_phrase).split())[:300]


def _retry_after(reply) -> float:
    try:
        return min(MAX_WAIT, float(reply.headers.get("retry-after", 0)))
    except ValueError:
        return 0.0
