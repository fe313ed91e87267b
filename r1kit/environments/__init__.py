"""Environments: what a rollout talks to turn after turn, and what scores it.

An environment is a class in TRL's ``environment_factory`` shape (TRL 1.16), plus one optional
method of r1kit's::

    class Guess:
        def reset(self, **row) -> str | None:
            '''A new episode from a dataset row; text returned is appended to the prompt's last message.'''
        def guess(self, number: int) -> str:
            '''Guess the secret number.

            Args:
                number: the guess
            '''
        def get_reward(self) -> float:
            '''Optional: the finished rollout's score, from the environment's own state.'''
        def step(self, text: str) -> str | None:
            '''Optional (gym-style): answer a turn of free text; None ends the episode.'''

Its public methods other than ``reset``, ``get_reward`` and ``step`` are the tools: each needs type
hints and a Google-style docstring with its arguments (transformers' ``get_json_schema`` turns
them into the schema the chat template renders). The model calls them through its chat template's
function calling; the replies come back as ``tool`` messages.

A recipe names an environment in ``environment:`` (grpo, rejection and eval stages; ``r1kit eval
--env``): a registered name (an entry point of the ``r1kit.environments`` group: ``guess``,
``skyrl_gym``), a ``module:Class`` string, or a mapping with bounds::

    environment: {name: guess, args: {high: 8}, max_turns: 6, turn_tokens: 64, timeout: 10, weight: 1.0}

A list of them routes each row by its ``environment`` field (each entry's ``key``, by default its
name), as TRL's dict of factories does.

Bounds, checked when the recipe is read: ``max_turns`` model turns per rollout, ``turn_tokens``
per turn (the stage's completion budget bounds the rollout, the environment's text included),
``timeout`` seconds per environment call. A tool that raises answers the model with the error
(as TRL does) and counts as a tool error; a call that times out, or a ``reset``, ``step`` or
``get_reward`` that raises, fails the rollout: it ends there, its environment reward is 0 and the
reason is counted. The stage goes on.

Not here: the turn loop (r1kit.sampling.tool_loop, with r1kit.environments.episodes as its world),
the built-in environments (r1kit.environments.guess, r1kit.environments.gym), reasoning-gym's
tasks (r1kit.environments.reasoning_gym).
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from r1kit.errors import RecipeError

ENTRY_POINT_GROUP = "r1kit.environments"
PROTOCOL = ("reset", "get_reward", "step")
"""The methods that are not tools."""


@dataclass(kw_only=True)
class EnvironmentConfig:
    """An environment a stage's rollouts talk to, and its bounds."""

    name: str
    """A registered environment (``r1kit.environments`` entry point) or ``module:Class``."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the class."""
    key: str | None = None
    """With several environments: the value of a row's ``environment`` field that routes it here (default: the name)."""
    max_turns: int = 8
    """Model turns per rollout (TRL: ``max_tool_calling_iterations`` is one less)."""
    turn_tokens: int | None = None
    """Most tokens the model writes in one turn; None: the rollout's room."""
    timeout: float = 30.0
    """Seconds per environment call (reset, a tool, step, get_reward); past it the rollout fails."""
    weight: float = 1.0
    """Weight of the environment's ``get_reward`` among the stage's rewards."""

    def problem(self) -> str | None:
        """What is wrong with these bounds, in one line, or None."""
        for key in ("max_turns", "timeout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not value > 0:
                return f"{key} must be above 0; got {value!r}"
        if self.turn_tokens is not None and (isinstance(self.turn_tokens, bool) or self.turn_tokens < 1):
            return f"turn_tokens must be a number of tokens, 1 or more, or null; got {self.turn_tokens!r}"
        return None


@dataclass
class Spec:
    """A loaded environment: its config, class, tools (name -> JSON schema) and what it defines."""

    config: EnvironmentConfig
    cls: type
    tools: dict[str, dict]
    has_reward: bool
    has_step: bool
    slowest: float | None = None
    """The longest tool or ``step`` call to an instance so far (the call's own seconds, not the wait
    for its thread); None: no call yet."""

    @property
    def key(self) -> str:
        return self.config.key or self.config.name

    @property
    def label(self) -> str:
        """The name its figures are logged under."""
        return self.key.rpartition(":")[2]

    def new(self) -> Any:
        return self.cls(**self.config.args)


def tool_methods(cls: type) -> list[str]:
    """The tools of an environment class: its public callables other than the protocol's."""
    return [name for name, value in inspect.getmembers(cls) if not name.startswith("_") and callable(value) and name not in PROTOCOL]


def load_class(name: str, where: str) -> type:
    """The environment class `name` names (an entry point of ``r1kit.environments`` or ``module:Class``)."""
    from r1kit.errors import RewardError
    from r1kit.reward_registry import load_plugin

    try:
        cls = load_plugin(name, ENTRY_POINT_GROUP, "environment")
    except RewardError as exc:
        raise RecipeError(f"{where}: {exc}") from None
    if not isinstance(cls, type):
        raise RecipeError(f"{where}: environment {name!r} is {type(cls).__name__} {cls!r}, not a class")
    return cls


def load(config: EnvironmentConfig, where: str) -> Spec:
    """The environment `config` names, checked against the protocol (one line naming `where`)."""
    from transformers.utils import get_json_schema

    problem = config.problem()
    if problem:
        raise RecipeError(f"{where}.{problem}")
    cls = load_class(config.name, f"{where}.name")
    if not callable(getattr(cls, "reset", None)):
        raise RecipeError(f"{where}.name: environment {config.name!r} ({cls.__name__}) has no reset method; "
                          "an environment defines reset(**row) -> str | None")
    tools = {}
    for name in tool_methods(cls):
        try:
            tools[name] = get_json_schema(getattr(cls, name))
        except Exception as exc:  # transformers' DocstringParsingException / TypeHintParsingException
            raise RecipeError(f"{where}.name: tool {cls.__name__}.{name} cannot be described to the model ({exc}); a tool needs type "
                              "hints on every argument and a docstring with an Args section") from None
    has_step = callable(getattr(cls, "step", None))
    if not tools and not has_step and not callable(getattr(cls, "get_reward", None)):
        raise RecipeError(f"{where}.name: environment {config.name!r} ({cls.__name__}) has no tools, no step and no get_reward: "
                          "nothing for a rollout to talk to or be scored by")
    try:
        inspect.signature(cls).bind(**config.args)
    except TypeError as exc:
        raise RecipeError(f"{where}.args: {cls.__name__}{inspect.signature(cls)} does not take {config.args}: {exc}") from None
    return Spec(config, cls, tools, callable(getattr(cls, "get_reward", None)), has_step)


def from_recipe(value: Any, where: str) -> list[Spec]:
    """The environments of a recipe's ``environment:`` (a name, a mapping, or a list of them)."""
    from r1kit.config import from_dict, parse_yaml

    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    specs = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]" if isinstance(value, list) else where
        if isinstance(item, str) and item.lstrip().startswith("{"):
            item = parse_yaml(item)
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict):
            raise RecipeError(f"{at}: an environment is a name, 'module:Class' or a mapping with name; got {item!r}")
        specs.append(load(from_dict(EnvironmentConfig, item, at), at))
    keys = Counter(s.key for s in specs)
    twice = [k for k, n in keys.items() if n > 1]
    if twice:
        raise RecipeError(f"{where}: two environments answer to {twice[0]!r}; give each a key of its own")
    return specs


def template_problem(specs: list[Spec], tokenizer) -> str | None:
    """Why `tokenizer`'s chat template cannot run these environments' tools, or None."""
    from trl.chat_template_utils import supports_tool_calling

    if not any(s.tools for s in specs):
        return None
    if not supports_tool_calling(tokenizer):
        return "the model's chat template cannot render tool calls and tool replies, which the environment's tools need"
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        from trl.chat_template_utils import add_response_schema

        try:
            add_response_schema(tokenizer)
        except ValueError:
            return "the tokenizer has no response_template telling how to read tool calls back from its chat template"
    return None


# ---- one episode, guarded --------------------------------------------------------------------------


class Failed(Exception):
    """An environment call that raised or timed out: the rollout fails."""


def call_with_timeout(fn: Callable, timeout: float, *args, spec: Spec | None = None, **kwargs):
    """`fn(*args, **kwargs)` on a thread of its own; `Failed` when it raises or passes `timeout`
    seconds (the thread is left running, as a daemon: Python cannot stop it). With `spec`, its
    `slowest` is kept up to date (the call's own time; a timeout counts as its bound)."""
    with _IDLE_LOCK:
        caller = _IDLE.pop() if _IDLE else None
    caller = caller or _Caller()
    box: dict[str, Any] = {}
    done = threading.Event()
    caller.calls.put((fn, args, kwargs, box, done, spec))
    if not done.wait(timeout):
        if spec is not None:
            spec.slowest = max(spec.slowest or 0.0, timeout)
        raise Failed(f"timeout: {getattr(fn, '__name__', 'call')} took over {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _Caller:
    """A daemon thread that runs environment calls one after another, and waits among the idle
    ones between them: a thread started for every call cost more than a short environment's
    answer. A call past its timeout keeps its thread (another takes its place meanwhile)."""

    def __init__(self):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self.run, daemon=True, name="r1kit-environment").start()

    def run(self) -> None:
        while True:
            fn, args, kwargs, box, done, spec = self.calls.get()
            start = time.perf_counter()
            try:
                value = fn(*args, **kwargs)
                box["value"] = asyncio.run(value) if inspect.isawaitable(value) else value  # an async tool
            except BaseException as exc:  # noqa: BLE001 (reported to the caller)
                box["error"] = exc
            if spec is not None:  # the call's own time, not the wait for this thread
                spec.slowest = max(spec.slowest or 0.0, time.perf_counter() - start)
            done.set()
            with _IDLE_LOCK:
                _IDLE.append(self)


_IDLE: list[_Caller] = []
_IDLE_LOCK = threading.Lock()


@dataclass
class Episode:
    """One rollout's dealings with its environment."""

    environment: str
    calls: Counter = field(default_factory=Counter)
    """Tool calls by tool name."""
    tool_errors: int = 0
    """Tool calls that raised or named no tool (answered with the error)."""
    failure: str | None = None
    """Why the rollout failed (a timeout, or reset, step or get_reward raising); None: it did not."""
    reward: float | None = None

    def record(self) -> dict:
        return {"environment": self.environment, "calls": dict(self.calls), "tool_errors": self.tool_errors,
                "failure": self.failure, "reward": self.reward}


class Guarded:
    """One environment instance with r1kit's bounds: every call timed, failures recorded in `episode`."""

    def __init__(self, spec: Spec, instance: Any = None):
        self.spec = spec
        self.env = spec.new() if instance is None else instance
        self.episode = Episode(spec.label)

    def _fail(self, what: str, exc: BaseException) -> None:
        if self.episode.failure is None:
            self.episode.failure = str(exc) if isinstance(exc, Failed) else f"{what} raised {type(exc).__name__}: {exc}"

    def reset(self, row: dict) -> str | None:
        self.episode = Episode(self.spec.label)
        try:
            text = call_with_timeout(self.env.reset, self.spec.config.timeout, **row)
        except BaseException as exc:  # noqa: BLE001
            self._fail("reset", exc)
            return None
        return None if text is None else str(text)

    def call(self, name: str, arguments: Any) -> str:
        """A tool call's reply text; an error text where the tool raised or is unknown."""
        self.episode.calls[name] += 1
        if name not in self.spec.tools:
            self.episode.tool_errors += 1
            return str({"error": f"no tool named {name!r}; the tools are {', '.join(self.spec.tools) or 'none'}"})
        if not isinstance(arguments, dict):
            self.episode.tool_errors += 1
            return str({"error": f"arguments must be a JSON object, not {arguments!r}"})
        try:
            return str(call_with_timeout(getattr(self.env, name), self.spec.config.timeout, spec=self.spec, **arguments))
        except Failed as exc:
            self._fail(name, exc)
            return str({"error": str(exc)})
        except Exception as exc:  # the model's call was wrong, or the tool failed on it: the model reads why
            self.episode.tool_errors += 1
            return str({"error": str(exc)})

    def step(self, text: str) -> str | None:
        try:
            reply = call_with_timeout(self.env.step, self.spec.config.timeout, text, spec=self.spec)
        except BaseException as exc:  # noqa: BLE001
            self._fail("step", exc)
            return None
        return None if reply is None else str(reply)

    def reward(self) -> float | None:
        """The environment's score of the rollout: 0 where it failed, None where it owns no reward."""
        if not self.spec.has_reward:
            return None
        if self.episode.failure is None:
            try:
                self.episode.reward = float(call_with_timeout(self.env.get_reward, self.spec.config.timeout))
            except BaseException as exc:  # noqa: BLE001
                self._fail("get_reward", exc)
        if self.episode.failure is not None:
            self.episode.reward = 0.0
        return self.episode.reward


def metrics(episodes: list[Episode], turns: list[int]) -> dict[str, float]:
    """Per-batch figures of rollouts in environments: turns per rollout, calls per tool per
    rollout, tool errors per call, failures and timeouts per rollout, mean reward per environment."""
    n = max(1, len(episodes))
    calls = Counter()
    for e in episodes:
        calls.update(e.calls)
    out = {"env/turns_per_rollout": sum(turns) / max(1, len(turns)),
           "env/tool_error_share": sum(e.tool_errors for e in episodes) / max(1, sum(calls.values())),
           "env/failure_share": sum(e.failure is not None for e in episodes) / n,
           "env/timeout_share": sum((e.failure or "").startswith("timeout") for e in episodes) / n}
    out |= {f"env/calls/{name}": count / n for name, count in sorted(calls.items())}
    for name in sorted({e.environment for e in episodes}):
        rewards = [e.reward for e in episodes if e.environment == name and e.reward is not None]
        if rewards:
            out[f"env/reward/{name}"] = sum(rewards) / len(rewards)
    return out
