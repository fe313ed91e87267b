"""Preference reward from a sequence-classification reward model (DeepSeek-R1's second RL round),
loaded in process or served by vLLM.

R1 (arXiv:2501.12948, section 2.3.4) rewards general data with reward models: helpfulness is
judged on the final summary only (the answer after the reasoning), harmlessness on the whole
response. Recipe use, routed to the general rows of a mixed dataset::

    rewards:
      - {name: math_accuracy, weight: 1.0, when: {task: math}}
      - {name: reward_model, weight: 1.0, when: {task: general},
         model: Skywork/Skywork-Reward-V2-Llama-3.1-8B, text: summary, normalize: sigmoid}

Parameters:

- ``model``: folder or hub id of an ``AutoModelForSequenceClassification`` with one output
  (``num_labels=1``). In process it is loaded once per process and kept, on the process's current
  GPU when there is one (r1kit's stage process sets it per local rank), else on the CPU. Every
  process loads its own whole copy, also while the trainer shards the policy (ZeRO-3, FSDP with
  ``fsdp_cpu_ram_efficient_loading``), whose loading paths would otherwise hand the reward a
  partitioned or zero-filled model. Loading uses no collective, so routing (``when:``) that
  makes only some processes score is safe. With ``url`` only its tokenizer loads.
- ``text``: ``summary`` scores the text after the last ``</think>`` (the whole completion when it
  has none); ``full`` scores the whole completion, reasoning included.
- ``prompt_column``: the column holding the user's question; the reward model sees
  ``[user: question, assistant: text]`` through its tokenizer's chat template (question, a blank
  line and the text when it has none). In a grpo stage ``prompt`` is the rendered prompt (template
  included); keep the bare question in another column and name it here to show the model only that.
- ``normalize``: ``none`` returns the raw scores (logits); ``sigmoid`` maps them into (0, 1), the
  range of the rule rewards they are summed with.
- ``batch_size`` (inputs per forward pass in process, per request when served) and ``max_length``
  (tokens; longer inputs lose their beginning, since the score is read at the last token).
- ``url`` (one base URL ending ``/v1``, or several): score with the model served by vLLM's pooling
  runner (``vllm serve MODEL --runner pooling``) instead, through r1kit's endpoint client
  (r1kit.sampling.endpoint: ``concurrency`` requests in flight over all URLs, retries, one-line
  errors for no server, a refused key, a model not served, a server that does not classify).
  The text is rendered and truncated here with ``model``'s tokenizer and sent as token ids to
  vLLM's ``/classify`` with ``use_activation: false`` (the raw logit, not vLLM's sigmoid), so the
  served model scores the very tokens the in-process one would. ``served_name``: the name the
  server serves it under (default: ``model`` as written, vLLM's default); ``api_key_env``: the
  environment variable holding the key.

``serve: {gpus: [7]}`` in place of ``url``: r1kit starts a vLLM server of ``model`` on its pooling
runner for the stage, on those GPUs, and stops it after (r1kit.stages.served_rewards).

Not here: pairwise or generative judges (r1kit.rewards.judge), training a reward model (the
``reward`` stage, r1kit.stages.reward).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Annotated, Literal

from r1kit.errors import RewardError
from r1kit.hardware import has_gpu
from r1kit.reward_registry import POSITIVE, REQUIRED
from r1kit.sampling.base import Endpoint
from r1kit.reward_text import encode, rendered, scores, tokenizer_of
from r1kit.stages import served_rewards
from r1kit.sampling.endpoint import Client, EndpointError, _message, _threaded

TEXTS = ("summary", "full")
NORMALIZE = ("none", "sigmoid")
ROUTE = "/classify"
"""vLLM's classification API, at the server's root beside /v1."""


@contextlib.contextmanager
def whole_weights():
    """Inside: `from_pretrained` loads a whole model on this process, whatever sharded training
    has switched on (transformers' ZeRO-3 config, FSDP's rank-0-only CPU loading)."""
    from transformers.integrations import deepspeed

    saved_env = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")
    ref = deepspeed._hf_deepspeed_config_weak_ref
    zero3 = ref() if ref is not None else None
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
        else:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved_env
        if zero3 is not None:
            deepspeed.set_hf_deepspeed_config(zero3)


@functools.lru_cache(maxsize=2)
def load(model: str):
    """(tokenizer, model) for `model`, loaded once per process."""
    import torch
    from transformers import AutoModelForSequenceClassification

    tokenizer = tokenizer_of(model)
    with whole_weights():
        rm = AutoModelForSequenceClassification.from_pretrained(model, dtype="auto")
    if rm.config.num_labels != 1:
        raise RewardError(f"reward_model: {model} has {rm.config.num_labels} outputs; a reward model has one (num_labels=1)")
    # The score is read at the last token that is not padding: the model must know the pad id.
    rm.config.pad_token_id = tokenizer.pad_token_id
    device = torch.device("cuda", torch.cuda.current_device()) if has_gpu() else torch.device("cpu")
    return tokenizer, rm.to(device).eval()


def scored_here(model: str, texts: list[str], batch_size: int, max_length: int) -> list[float]:
    tokenizer, rm = load(model)
    return scores(rm, tokenizer, encode(tokenizer, texts, max_length), batch_size)


# ---- served ---------------------------------------------------------------------------------

class ScoringClient(Client):
    """r1kit's endpoint client asking vLLM's classification API, its hints naming this reward's parameters."""

    KEY_FIELD, NAME_HINT = "the reward's api_key_env", "set the reward's served_name"

    def address(self, url: str, path: str) -> str:
        return url.removesuffix("/v1") + path

    def unanswered(self, body: dict, data) -> str:
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list) or len(rows) != len(body["input"]):
            return f"a reply with {len(rows) if isinstance(rows, list) else 0} scores for {len(body['input'])} inputs"
        labels = max(len(r.get("probs") or []) if isinstance(r, dict) else 0 for r in rows)
        if labels != 1:
            raise EndpointError(f"{self.name}: the served model gives {labels} scores per input; a reward model gives one (num_labels=1)")
        return ""

    def _refusal(self, url: str, reply) -> str:
        if reply.status_code in (404, 501):  # vLLM serving a model to generate has no /classify
            self.check(url)  # a model it does not serve, named
            raise EndpointError(f"{self.address(url, ROUTE)}: HTTP {reply.status_code}: {_message(reply)}; the server does not classify: "
                                "serve the reward model with vLLM's pooling runner (--runner pooling)")
        return super()._refusal(url, reply)



@functools.lru_cache(maxsize=8)
def client(urls: tuple[str, ...], name: str, api_key_env: str, key: str, concurrency: int) -> tuple[ScoringClient, int | None]:
    """(a client, the least served context in tokens or None) per process and settings, whose servers
    were asked first whether they answer, take the key and serve `name`. `key` is there so a
    changed key makes a new client."""
    if api_key_env and not key:
        raise EndpointError(f"api_key_env: the environment variable {api_key_env} is not set (it holds the reward model server's API key)")
    made = ScoringClient(Endpoint(url=list(urls), api_key_env=api_key_env, concurrency=concurrency), name)
    try:
        contexts = [c for c in map(made.check, made.urls) if c is not None]
    except BaseException:
        made.close()
        raise
    return made, min(contexts, default=None)


def scored_there(model: str, texts: list[str], batch_size: int, max_length: int, urls: tuple[str, ...], name: str,
                 api_key_env: str, concurrency: int) -> list[float]:
    ids = encode(tokenizer_of(model), texts, max_length)
    try:
        asker, context = client(urls, name, api_key_env, os.environ.get(api_key_env, "") if api_key_env else "", concurrency)
        longest = max(map(len, ids))
        if context is not None and longest > context:
            raise RewardError(f"reward_model: an input of {longest} tokens passes the served context of {context} tokens (max_model_len); "
                              f"set max_length to at most {context}, or serve a longer max_model_len")
        chunks = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
        body = {"model": name, "use_activation": False}  # the raw logit: vLLM's default is a sigmoid over the one label
        replies = _threaded(min(len(chunks), concurrency), lambda chunk: asker.post(ROUTE, {**body, "input": chunk}), chunks)
    except EndpointError as exc:
        raise RewardError(f"reward_model: {exc}") from None
    return [float(row["probs"][0]) for reply in replies for row in sorted(reply["data"], key=lambda r: r.get("index", 0))]


# ---- the reward -----------------------------------------------------------------------------

def check(params: dict) -> str | None:
    """The first problem of the settings, in one line naming the parameter; None when none."""
    if not params["model"]:
        return "set `model` to a reward model's folder or hub id (its tokenizer renders the text, also for a served one)"
    if params["text"] not in TEXTS:
        return f"text must be one of {TEXTS}, got {params['text']!r}"
    if params["normalize"] not in NORMALIZE:
        return f"normalize must be one of {NORMALIZE}, got {params['normalize']!r}"
    if params.get("serve") is not None:
        if params["url"] is not None:
            return "serve: r1kit starts the reward model's server, so it takes no url; give one or the other"
        if params["served_name"]:
            return "served_name: r1kit names the model it serves; leave served_name out"
        return served_rewards.problem(params["serve"], served_model=False)
    url = params["url"]
    if url is None:
        given = [k for k in ("served_name", "api_key_env") if params[k]]
        return f"{given[0]}: only for a served reward model; set url too, like http://127.0.0.1:8000/v1" if given else None
    urls = url if isinstance(url, list) else [url]
    if not urls or not all(isinstance(u, str) for u in urls):
        return f"url: a base URL or a list of them, like http://127.0.0.1:8000/v1; got {url!r}"
    if problem := Endpoint(url=urls).problem():
        return problem.replace("endpoint.url", "url")
    return None


def reward_model(
    completions: list[str],
    *,
    model: Annotated[str, REQUIRED] = "",
    text: Literal["summary", "full"] = "summary",
    prompt_column: str = "prompt",
    normalize: Literal["none", "sigmoid"] = "none",
    batch_size: Annotated[int, POSITIVE] = 8,
    max_length: Annotated[int, POSITIVE] = 4096,
    url: str | list | None = None,
    served_name: str = "",
    api_key_env: str = "",
    concurrency: Annotated[int, POSITIVE] = 8,
    serve: dict | None = None,
    **columns,
) -> list[float]:
    """Score of a sequence-classification reward model for the summary (or the full completion).

    `model` is a folder or hub id (num_labels=1); `text` is "summary" (after ``</think>``, as R1
    judges helpfulness) or "full"; `normalize` is "none" (raw) or "sigmoid"; with `url`, the
    model served by vLLM's pooling runner scores (see the module docstring).
    """
    settings = {"model": model, "text": text, "normalize": normalize, "url": url, "served_name": served_name, "api_key_env": api_key_env,
                "serve": serve}
    if problem := check(settings):
        raise RewardError(f"reward_model: {problem}")
    if serve is not None:
        raise RewardError(f"reward_model: {served_rewards.OUTSIDE_A_STAGE}")
    if not completions:
        return []
    texts = rendered(tokenizer_of(model), completions, text, columns.get(prompt_column) or [None] * len(completions))
    if url is None:
        raw = scored_here(model, texts, batch_size, max_length)
    else:
        urls = tuple(url) if isinstance(url, list) else (url,)
        raw = scored_there(model, texts, batch_size, max_length, urls, served_name or model, api_key_env, concurrency)
    return [1.0 / (1.0 + math.exp(-s)) for s in raw] if normalize == "sigmoid" else raw


reward_model.check = check
reward_model.gpu = lambda params: params["url"] is None and params.get("serve") is None  # in process: this process's GPU
reward_model.server = lambda params: (params["model"], {"runner": "pooling"}, "served_name")  # r1kit.stages.served_rewards
reward_model.loads_model = True  # `model` may name an earlier reward stage (r1kit.stages.served_rewards)
