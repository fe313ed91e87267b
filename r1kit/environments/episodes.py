"""An environment's side of rollouts, in the two places it runs:

- `Episodes`: the world of r1kit's turn loop (r1kit.sampling.tool_loop) for the eval and rejection
  stages, on r1kit's decoding loop, in-process vLLM and the served backends. Each rollout has its
  own environment instance, reset from its row before its prompt is rendered (`Episodes.start`).
  A turn ends at the end of the sequence; the turn is read back into a message with the chat
  template's response template (TRL's ``parse_response``); its tool calls run, the calls of every
  rollout of the turn together on threads (one after another once every call has been quicker
  than `QUICK`: threads then cost more than they save), each call bounded by the environment's
  timeout; the tool messages
  (or, for a gym-style environment without tools, ``step``'s reply as a user message) are
  rendered by the chat template and appended, masked out. A turn without a call, a failed call,
  or ``max_turns`` ends the rollout.
- `trl_factory` and `trl_reward`: TRL's ``environment_factory`` (the grpo stage): the same class
  behind r1kit's guard (each call timed, failures recorded), its ``get_reward`` weighed by the
  recipe instead of TRL's weight 1. Gym-style environments (``step``, no tools), which TRL's loop
  cannot play, train through TRL's ``rollout_func`` with `Episodes` as the world
  (r1kit.trainers.rollouts.env_rollout_func); `trl_reward` reads their episode records.

Both render a reply as TRL does (the tokens the chat template adds after an assistant turn that
ends at its end-of-turn token), so greedy transcripts agree where the engines do.

Not here: the protocol and its checks (r1kit.environments), the turn loop, scoring beyond the
environment's own reward (the stages' rewards).
"""

from __future__ import annotations

import functools
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from r1kit import templates
from r1kit.environments import Guarded, Spec, metrics
from r1kit.errors import RecipeError


def route(specs: list[Spec], row: dict, where: str = "environment") -> Spec:
    """The environment of `row`: the only one, or the one its ``environment`` field names."""
    if len(specs) == 1:
        return specs[0]
    key = row.get("environment")
    for spec in specs:
        if spec.key == key:
            return spec
    raise RecipeError(f"{where}: a row's environment field is {key!r}; the environments answer to {', '.join(s.key for s in specs)}")


def user_message(template: str, prompt: str) -> str:
    """The first user message of a rollout in an environment, by the stage's template: ``chat``
    (the question with R1's guidance), ``plain`` (the question) or a ``{prompt}`` string."""
    if template == "chat":
        return templates.chat_user_turn(prompt)
    return prompt if template == "plain" else template.replace("{prompt}", prompt)


def template_problem(template: str, think_prefill: bool) -> str | None:
    """Why a stage's prompting cannot start a conversation with an environment, or None."""
    if template == "r1_zero":
        return "r1_zero continues plain text; with an environment the prompt is a chat turn: set template to chat, plain or a {prompt} string"
    if think_prefill:
        return "think_prefill: not with an environment (each turn starts where the chat template opens it); leave it out"
    return None


def _reply_ids(tokenizer, messages: list[dict], cache: dict | None = None) -> list[int]:
    """The tokens the chat template puts after an assistant turn (ending at the end-of-turn token)
    for `messages` (tool replies, or a user turn), up to the next assistant turn's opening; kept
    in `cache` by the messages' text (rendering costs a template pass each)."""
    key = tuple((m["role"], m.get("name"), str(m["content"])) for m in messages)
    if cache is not None and key in cache:
        return cache[key]
    call = [{"type": "function", "function": {"name": messages[0].get("name", "tool"), "arguments": {}}}]
    before = [{"role": "user", "content": "dummy"},
              {"role": "assistant", "content": "", **({"tool_calls": call} if messages[0]["role"] == "tool" else {})}]
    prefix = tokenizer.apply_chat_template(before, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(before + messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    ends = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if ends:
        prefix = prefix[: ends[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise RecipeError("the chat template renders an assistant turn differently when more messages follow it; "
                          "environment replies cannot be appended to a rollout")
    if cache is not None and len(cache) < 4096:
        cache[key] = full[len(prefix):]
    return full[len(prefix):]


QUICK = 0.002  # seconds: environments whose every call so far took less answer a turn's rollouts one after another


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """The threads that answer a turn's rollouts together, kept from one turn (and batch) to the
    next: starting them anew at each turn cost about as much as a short environment's answers."""
    return ThreadPoolExecutor(workers, thread_name_prefix="r1kit-episodes")


class Episodes:
    """The world of r1kit's turn loop for rollouts in environments (see the module docstring)."""

    stop_strings: list[str] = []

    def __init__(self, specs: list[Spec], tokenizer, concurrency: int = 16):
        from trl.chat_template_utils import add_response_schema

        self.specs, self.tokenizer, self.concurrency = specs, tokenizer, concurrency
        if any(s.tools for s in specs) and getattr(tokenizer, "response_template", None) is None:
            add_response_schema(tokenizer)
        bounds = [s.config.turn_tokens for s in specs if s.config.turn_tokens is not None]
        self.turn_tokens = min(bounds) if bounds else None
        self.guarded: list[Guarded] = []
        self.prompts: list[list[int]] = []
        self.conversations: list[list[dict]] = []
        self.rendered: dict = {}  # replies' tokens by their text: rollouts often get the same reply
        """Each rollout as chat messages: the user turn, then the model's turns (read back) and the replies."""

    def start(self, rows: list[dict], questions: list[str], template: str) -> list[str]:
        """A rollout per row (in order): its environment reset from the row, its prompt (the
        question by `template`, then what reset returned) rendered with the environment's tools;
        returns the prompts."""
        return self.start_conversations(rows, [[{"role": "user", "content": user_message(template, q)}] for q in questions])

    def start_conversations(self, rows: list[dict], conversations: list[list[dict]]) -> list[str]:
        """`start` for prompts that are already conversations: what reset returns joins the last
        message, as in TRL."""
        texts = []
        for row, messages in zip(rows, conversations, strict=True):
            spec = route(self.specs, row)
            guarded = Guarded(spec)
            reset_row = {k: v for k, v in row.items() if not (len(self.specs) > 1 and k == "environment")}
            observation = guarded.reset(reset_row)
            messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + (observation or "")}]
            tools = list(spec.tools.values()) or None
            text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
            self.guarded.append(guarded)
            self.conversations.append(messages)
            self.prompts.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            texts.append(text)
        return texts

    def stop(self, transcript, tokens: list[int]) -> bool:
        return False  # a turn ends at the end of the sequence

    def reply(self, turns):
        if not turns:
            return []
        if all(s.slowest is not None and s.slowest < QUICK for s in self.specs):  # threads would cost more than they save
            return [self._reply(*turn) for turn in turns]
        return list(_pool(self.concurrency).map(lambda turn: self._reply(*turn), turns))

    def _reply(self, transcript, tokens: list[int], how: str) -> list[int] | None:
        from trl.chat_template_utils import parse_response

        guarded, conversation = self.guarded[transcript.index], self.conversations[transcript.index]
        spec = guarded.spec
        if how != "eos":  # cut short: no whole turn to answer
            conversation.append({"role": "assistant", "content": self.tokenizer.decode(tokens, skip_special_tokens=True)})
            return None
        if spec.tools:
            before = self.prompts[transcript.index] + transcript.ids[: len(transcript.ids) - len(tokens)]
            message = parse_response(self.tokenizer, tokens, prefix=before, tools=list(spec.tools.values()))
        else:
            message = {"role": "assistant", "content": self.tokenizer.decode(tokens, skip_special_tokens=True)}
        conversation.append(message)
        if guarded.episode.failure or transcript.turns >= spec.config.max_turns:
            return None
        calls = message.get("tool_calls") or []
        if calls:
            replies = []
            for call in calls:
                function = call.get("function") or {}
                name = function.get("name", "")
                replies.append({"role": "tool", "name": name, "content": guarded.call(name, function.get("arguments", {}))})
                if guarded.episode.failure:
                    return None
            conversation.extend(replies)
            return _reply_ids(self.tokenizer, replies, self.rendered)
        if spec.has_step:
            answer = guarded.step(message["content"])
            if answer is None:
                return None
            conversation.append({"role": "user", "content": answer})
            return _reply_ids(self.tokenizer, [conversation[-1]], self.rendered)
        return None

    def finish(self, completions: list) -> list[dict]:
        """`records` of the rollouts' completions (r1kit.sampling.base.Completion, in order), each
        also set on its completion: ``episode``, and ``tool_calls`` counting the episode's calls."""
        records = self.records([c.turns or 0 for c in completions])
        for c, record in zip(completions, records):
            c.episode, c.tool_calls = record, sum(record["calls"].values())
        return records

    def records(self, turns: list[int]) -> list[dict]:
        """Each rollout's episode record (environment, calls per tool, tool errors, failure,
        reward, turns as `turns` gives them), the environment's reward taken now."""
        out = []
        for guarded, n in zip(self.guarded, turns, strict=True):
            guarded.reward()
            out.append(guarded.episode.record() | {"turns": n})
        return out


def episode_metrics(records: list[dict]) -> dict[str, float]:
    """`r1kit.environments.metrics` over journaled episode records."""
    from collections import Counter

    from r1kit.environments import Episode

    episodes = [Episode(r["environment"], Counter(r["calls"]), r["tool_errors"], r["failure"], r["reward"]) for r in records]
    return metrics(episodes, [r["turns"] for r in records])


# ---- TRL's environment_factory ---------------------------------------------------------------------


def trl_class(spec: Spec) -> type:
    """A class in TRL's protocol around `spec`'s: the same tools (name, signature and docstring,
    so TRL renders the same schema), each call through r1kit's guard; no ``get_reward`` (r1kit's
    `trl_reward` weighs it)."""
    def __init__(self):
        self.guarded = Guarded(spec)

    def reset(self, **row):
        return self.guarded.reset(row)

    namespace: dict[str, Any] = {"__init__": __init__, "reset": reset, "__doc__": spec.cls.__doc__, "__module__": spec.cls.__module__}
    for name in spec.tools:
        original = getattr(spec.cls, name)
        signature = inspect.signature(original)

        def tool(self, *args, _name=name, _signature=signature, **kwargs):
            bound = _signature.bind(self, *args, **kwargs)
            return self.guarded.call(_name, {k: v for k, v in bound.arguments.items() if k != "self"})

        namespace[name] = functools.wraps(original)(tool)
    return type(spec.cls.__name__, (), namespace)


def trl_factory(specs: list[Spec]):
    """TRL's ``environment_factory``: a class, or with several environments a dict by key."""
    classes = {spec.key: trl_class(spec) for spec in specs}
    return next(iter(classes.values())) if len(specs) == 1 else classes


def trl_reward(spec: Spec, figures: dict):
    """A TRL reward function named ``env_<label>``: the environment reward of each rollout of
    `spec`'s environment (0 where it failed; None, which TRL leaves out, for the other
    environments' rollouts), from TRL's environment instances (``environments``) or from the
    episode records of r1kit's rollout function (``env_records``, gym-style environments). Each
    call leaves the batch's environment figures in `figures` (in TRL's loop turns are counted
    from the conversation's assistant messages)."""
    def reward(environments=None, completions=None, env_records=None, **_):
        figures.clear()
        if env_records is not None:
            figures.update(episode_metrics(env_records))
            return [r["reward"] if r["environment"] == spec.label else None for r in env_records]
        mine = [e.guarded.spec is spec for e in environments]
        rewards = [e.guarded.reward() if m else None for e, m in zip(environments, mine)]
        turns = [sum(m.get("role") == "assistant" for m in c) if isinstance(c, list) else 1 for c in completions or []]
        figures.update(metrics([e.guarded.episode for e in environments], turns))
        return rewards

    reward.__name__ = reward.__qualname__ = f"env_{spec.label}"
    return reward
