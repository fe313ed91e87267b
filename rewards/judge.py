"""LLM-as-judge reward: a chat model behind an OpenAI-compatible endpoint grades each completion.

    rewards:
      - {name: judge, weight: 1.0, url: http://127.0.0.1:8000/v1, model: judge, template: reference}

    r1kit rewards score judge --input rows.jsonl --param url=http://127.0.0.1:8000/v1 --param model=judge

R1 graded the rejection-sampling data that no rule can check by asking DeepSeek-V3 whether an
answer matches the reference; this reward asks any chat model served by vLLM, SGLang or an API.
Each completion (its summary, the text after ``</think>``, unless ``text: full``) goes into a
template, sent as one user message to ``/chat/completions``; the judge's reply becomes a score by
a parse rule (the parameter is ``template``, not ``prompt``: the ``prompt`` column, the question,
reaches every reward, and a parameter of that name would hide it):

- ``template: reference`` (R1's reference check): question, reference answer (the ``answer_column``)
  and response; the judge ends with ``Verdict: yes`` or ``Verdict: no``. Parse rule ``verdict``:
  1.0 for yes (also ``equivalent``, ``correct``), 0.0 for no (``not equivalent``, ``incorrect``),
  read after the reply's last ``Verdict:``, else on its last line.
- ``template: rubric``: question and response, rated from 0 to 10 for correctness, helpfulness and
  clarity; the judge ends with ``Score: N``. Parse rule ``score``: the number after the last
  ``Score:`` (else the last line's), 0 to 10 (``7/10`` reads 7), divided by 10.
- a template of one's own: any other text with ``{response}`` in it (and optionally ``{question}``,
  ``{reference}``; other braces doubled), with ``parse: verdict`` or ``parse: score`` (0 to 10).

A reply that neither rule reads gives None, never 0: it is counted (``counts["unparsed"]``), warned
about once per batch with the first such reply, and in a GRPO stage logged as ``judge/unparsed``
(TRL's ``log_metric``). A row without a reference (``template: reference``) scores None and costs no
request. ``choices: [yes, no]`` asks vLLM's structured outputs to let the judge answer only those
words (a server without them may refuse or ignore the field).

Requests go through r1kit's endpoint client (r1kit.sampling.endpoint): ``concurrency`` in flight
over all ``url``s, each to the least busy; retries with backoff on 429 (its Retry-After), 5xx,
dropped connections and replies that are not JSON, ``retries`` times, then one line; one-line
errors, found at the first call, for no server at a URL, a refused key (``api_key_env`` names the
variable holding it) and a model the server does not serve.

Every reply is kept in ``judge_cache.jsonl`` (append-only, one line per reply, synced; a line cut
by a kill is dropped), keyed by a hash of the judge model, the template, the rendered message and
the sampling settings. The file lives in the stage's folder in a run and in r1kit's cache folder
otherwise (r1kit.reward_registry.folder), and is read into memory once per process: a resumed
stage or a rerun never asks twice. The raw reply is kept, so a changed parse rule reads the same
replies again.

``serve: {model: NAME, gpus: [6]}`` in place of ``url`` and ``model``: r1kit starts a vLLM
server of that chat model for the stage, on those GPUs, and stops it after (r1kit.stages.served_rewards).

Not here: sequence-classifier reward models, in process or served (r1kit.rewards.reward_model),
pairwise comparisons.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import string
import threading
from pathlib import Path
from typing import Annotated, Literal

from r1kit import reward_registry
from r1kit.errors import RewardError, suggest
from r1kit.files import append_synced, complete_lines, drop_partial_line, shard_file, shard_files
from r1kit.reward_registry import POSITIVE
from r1kit.sampling.base import Endpoint
from r1kit.stages import served_rewards
from r1kit.sampling.endpoint import Client, EndpointError, _threaded

log = logging.getLogger("r1kit")

REFERENCE = """You are grading a response to a question against the reference answer.

Question:
{question}

Reference answer:
{reference}

Response:
{response}

Is the final answer of the response equivalent to the reference answer? Differences of form do not \
matter (notation, simplification, units written out, the order of an unordered list); a missing, \
hedged or different final answer is not equivalent. Think briefly if you need to, then end your \
reply with one line: "Verdict: yes" or "Verdict: no"."""

RUBRIC = """You are rating a response to a question.

Question:
{question}

Response:
{response}

Rate the response from 0 to 10 for how correct, helpful and clear it is: 0 is wrong or useless, 5 \
partly right or hard to follow, 10 fully correct, complete and clear. Think briefly if you need \
to, then end your reply with one line: "Score: N", N a whole number from 0 to 10."""

TEMPLATES = {"reference": (REFERENCE, "verdict"), "rubric": (RUBRIC, "score")}
"""Built-in templates by name: (text, parse rule)."""
FIELDS = ("question", "reference", "response")
VERDICTS = {"yes": 1.0, "equivalent": 1.0, "correct": 1.0, "no": 0.0, "not equivalent": 0.0, "incorrect": 0.0}
CACHE = "judge_cache.jsonl"

counts = {"asked": 0, "cached": 0, "unparsed": 0}
"""Replies asked of a server, read from the cache, and unparsed (None), in this process."""
_lock = threading.Lock()


# ---- parse rules ----------------------------------------------------------------------------

def _tail(reply: str, label: str) -> str:
    """The line after the reply's last ``label:``, else its last non-empty line, without markup."""
    found = list(re.finditer(rf"{label}\s*:", reply, re.IGNORECASE))
    text = reply[found[-1].end():] if found else reply
    lines = [line for line in text.splitlines() if line.strip()]
    line = (lines[0] if found else lines[-1]) if lines else ""
    return line.strip().strip("*_`'\"[]().").strip()


def verdict(reply: str) -> float | None:
    """1.0 / 0.0 for a final yes / no (see the module docstring); None when there is none."""
    words = re.sub(r"[^a-z]+", " ", _tail(reply, "verdict").lower()).split()
    return VERDICTS.get(" ".join(words))


def score(reply: str) -> float | None:
    """A final score from 0 to 10, divided by 10; None when there is none or it is out of range."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:/\s*10)?\.?", _tail(reply, "score"))
    value = float(found.group(1)) if found else None
    return value / 10 if value is not None and value <= 10 else None


RULES = {"verdict": verdict, "score": score}


# ---- settings -------------------------------------------------------------------------------

def template_of(template: str) -> tuple[str, str]:
    """(text, its own parse rule or "") of a built-in template's name or a template's text."""
    return TEMPLATES.get(template, (template, ""))


def fields(template: str) -> list[str]:
    """The placeholders of `template` (a ValueError for a lone brace)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def check(params: dict) -> str | None:
    """The first problem of the judge's settings, in one line naming the parameter; None when none."""
    if params.get("serve") is not None:
        if params["url"] is not None:
            return "serve: r1kit starts the judge's server, so it takes no url; give one or the other"
        if problem := served_rewards.problem(params["serve"], served_model=True):
            return problem
        if params["model"]:
            return "model: r1kit names the model it serves; give the model to serve as serve.model"
        urls = ["http://127.0.0.1:1/v1"]  # the address of the server r1kit will start
    elif not params["model"]:
        return "model: name the model the judge's server serves (or serve: {model: ...} for r1kit to start one)"
    elif params["url"] is None:
        return "url: the judge's server, like http://127.0.0.1:8000/v1 (or serve: {model: ...} for r1kit to start one)"
    else:
        urls = params["url"] if isinstance(params["url"], list) else [params["url"]]
    if not urls or not all(isinstance(u, str) for u in urls):
        return f"url: a base URL or a list of them, like http://127.0.0.1:8000/v1; got {params['url']!r}"
    if problem := Endpoint(url=urls).problem():
        return problem.replace("endpoint.url", "url")
    name, parse = params["template"], params["parse"]
    template, own = template_of(name)
    if not own and "{response}" not in name:
        return (f"template: unknown judge template {name!r}{suggest(name, list(TEMPLATES))}; built-in: {', '.join(TEMPLATES)}, or "
                "a text of your own with {response} in it (and {question}, {reference} if it needs them)")
    try:
        other = [f for f in fields(template) if f not in FIELDS]
    except ValueError as exc:
        return f"template: not a template ({exc}); write a literal brace twice: {{{{ }}}}"
    if other:
        return (f"template: a template takes only {{question}}, {{reference}} and {{response}}; this one has {{{other[0]}}} "
                "(write a literal brace twice: {{ }})")
    if not own and parse == "auto":
        return "parse: a template of your own needs its parse rule: verdict (yes / no) or score (0 to 10)"
    if own and parse not in ("auto", own):
        return f"parse: template {name} ends with a {own}, which parse rule {parse} cannot read; leave parse out or set {own}"
    rule = own or parse
    if params["choices"]:
        if rule != "verdict" or not all(isinstance(c, str) and verdict(c) is not None for c in params["choices"]):
            return f"choices: the words a verdict may be ({', '.join(VERDICTS)}), with a verdict's parse rule; got {params['choices']!r}"
    if params["temperature"] < 0 or params["retries"] < 0:
        return f"temperature and retries must be at least 0; got {params['temperature']} and {params['retries']}"
    return None


def read_columns(params: dict) -> list[str]:
    """The dataset columns the judge's template reads."""
    return list(needed(template_of(params["template"])[0], params["question_column"], params["answer_column"]).values())


def needed(template: str, question_column: str, answer_column: str) -> dict[str, str]:
    """The columns that fill `template`'s {question} and {reference}, by placeholder."""
    return {f: c for f, c in (("question", question_column), ("reference", answer_column)) if f in fields(template)}


# ---- the requests ---------------------------------------------------------------------------

class JudgeClient(Client):
    """r1kit's endpoint client, its hints naming the judge's parameters."""

    KEY_FIELD, NAME_HINT = "the judge's api_key_env", "set the judge's model"


@functools.lru_cache(maxsize=8)
def client(urls: tuple[str, ...], model: str, api_key_env: str, key: str, concurrency: int, retries: int) -> JudgeClient:
    """One client per process and settings (its bound on requests in flight holds across calls),
    whose servers were asked first whether they answer, take the key and serve `model`. `key`
    (the variable's value, never stored elsewhere) is there so a changed key makes a new client."""
    if api_key_env and not key:
        raise EndpointError(f"api_key_env: the environment variable {api_key_env} is not set (it holds the judge's API key)")
    made = JudgeClient(Endpoint(url=list(urls), api_key_env=api_key_env, concurrency=concurrency, retries=retries), model)
    try:
        for url in made.urls:
            made.check(url)
    except BaseException:
        made.close()
        raise
    return made


def ask(judge: JudgeClient, message: str, max_tokens: int, temperature: float, choices: list[str]) -> str:
    """The judge's reply to one user message (its content; a reasoning model's reasoning is not read)."""
    body = {"model": judge.name, "messages": [{"role": "user", "content": message}], "max_tokens": max_tokens, "temperature": temperature}
    if choices:
        body["structured_outputs"] = {"choice": choices}
    try:
        data = judge.post("/chat/completions", body)
    except EndpointError as exc:
        if "chat template" in str(exc).lower():
            raise EndpointError(f"{exc}; a judge is asked chat messages: serve it with a chat template (vLLM: --chat-template FILE)") from None
        raise
    return ((data["choices"][0].get("message") or {}).get("content")) or ""


# ---- the cache ------------------------------------------------------------------------------

class Cache:
    """Replies by key in `folder`'s judge_cache.jsonl (this process's shard of it in a distributed run)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = shard_file(folder, CACHE, int(os.environ.get("RANK", "0")))
        drop_partial_line(self.path, complete_lines(self.path)[1])  # a kill mid-write: the next append starts clean
        self.replies: dict[str, str] = {}
        for path in shard_files(folder, CACHE):
            for line in complete_lines(path)[0]:
                entry = json.loads(line)
                self.replies[entry["key"]] = entry["reply"]

    def put(self, key: str, reply: str) -> None:
        with _lock, open(self.path, "a", encoding="utf-8") as f:
            append_synced(f, json.dumps({"key": key, "reply": reply}) + "\n")
            self.replies[key] = reply


_caches: dict[Path, Cache] = {}


def cache() -> Cache:
    """The cache of the folder a reward keeps files in now (r1kit.reward_registry.folder), read once per process."""
    folder = reward_registry.folder().resolve()
    with _lock:
        if folder not in _caches:
            _caches[folder] = Cache(folder)
        return _caches[folder]


# ---- the reward -----------------------------------------------------------------------------

def judge(
    completions: list[str],
    *,
    url: str | list | None = None,
    model: str = "",
    api_key_env: str = "",
    template: str = "reference",
    parse: Literal["auto", "verdict", "score"] = "auto",
    text: Literal["summary", "full"] = "summary",
    answer_column: str = "answer",
    question_column: str = "prompt",
    concurrency: Annotated[int, POSITIVE] = 16,
    max_tokens: Annotated[int, POSITIVE] = 1024,
    temperature: float = 0.0,
    retries: int = 8,
    choices: tuple = (),
    serve: dict | None = None,
    **columns,
) -> list[float | None]:
    """A chat model's grade of each completion: R1's reference check (1/0) or a 0-10 rubric (scaled to 0-1).

    `url` (one or several) and `model` name the served judge; `template` is reference, rubric or a
    text of one's own with `parse` verdict or score; unparsed replies score None and are
    counted; replies are cached on disk (see the module docstring).
    """
    settings = {"url": url, "model": model, "template": template, "parse": parse, "choices": choices, "temperature": temperature, "retries": retries,
                "serve": serve}
    if problem := check(settings):
        raise RewardError(f"judge: {problem}")
    if serve is not None:
        raise RewardError(f"judge: {served_rewards.OUTSIDE_A_STAGE}")
    wording, own = template_of(template)
    rule = RULES[own or parse]
    reads = needed(wording, question_column, answer_column)
    for field, column in reads.items():
        if column not in columns:
            key = "answer_column" if field == "reference" else "question_column"
            raise RewardError(f"judge: template {template if own else 'of your own'} needs the {field}s, column {column!r}, which the batch "
                              f"lacks; columns given: {', '.join(sorted(columns)) or 'none'} (set {key})")
    responses = [c.rpartition("</think>")[2].strip() if text == "summary" and "</think>" in c else c for c in completions]
    rows = [{"response": r, **{f: columns[c][i] for f, c in reads.items()}} for i, r in enumerate(responses)]
    mine = [i for i, row in enumerate(rows) if not ("reference" in row and row["reference"] is None)]  # no reference: not applicable
    messages = {i: wording.format(**{k: "" if v is None else str(v) for k, v in rows[i].items()}) for i in mine}
    asked = {"model": model, "template": wording, "max_tokens": max_tokens, "temperature": temperature, "choices": list(choices)}
    keys = {i: hashlib.sha256(json.dumps({**asked, "message": messages[i]}).encode()).hexdigest() for i in mine}
    store = cache()
    todo = list(dict.fromkeys(k for k in keys.values() if k not in store.replies))
    if todo:
        by_key = {keys[i]: messages[i] for i in mine}
        urls = tuple(url) if isinstance(url, list) else (url,)
        try:
            asker = client(urls, model, api_key_env, os.environ.get(api_key_env, "") if api_key_env else "", concurrency, retries)
            _threaded(min(len(todo), concurrency), lambda k: store.put(k, ask(asker, by_key[k], max_tokens, temperature, list(choices))), todo)
        except EndpointError as exc:
            raise RewardError(f"judge: {exc}") from None
    scores: list[float | None] = [None] * len(completions)
    unparsed = []
    for i in mine:
        scores[i] = rule(store.replies[keys[i]])
        if scores[i] is None:
            unparsed.append(store.replies[keys[i]])
    with _lock:
        counts["asked"] += len(todo)
        counts["cached"] += len(mine) - len(todo)
        counts["unparsed"] += len(unparsed)
    if unparsed:
        first = " ".join(unparsed[0].split())[-120:]
        log.warning("judge: %d of %d replies have no %s (scored None); the first ends: %r", len(unparsed), len(mine), own or parse, first)
    if callable(columns.get("log_metric")):  # TRL's trainer: a figure in the stage's metrics
        columns["log_metric"]("judge/unparsed", float(len(unparsed)))
    return scores


judge.check = check
judge.columns = read_columns
judge.server = lambda params: (params["serve"]["model"], {}, "model")  # r1kit.stages.served_rewards: what to serve, options, the name's parameter
judge.bounds = (0.0, 1.0)
