"""The reward contract and the reward registry.

A reward is a plain batch function::

    def my_reward(completions: list[str], *, my_param: float = 1.0, **columns) -> list[float | None]

`completions` are the texts the model wrote (without the prompt). Dataset columns of the batch
(``answer``, ``tests``, ``task``, ...) arrive as keyword arguments, one list per column, aligned
with `completions`. Keyword-only arguments with defaults are the reward's *parameters*: a recipe
sets them next to the reward's name (``{name: math_accuracy, weight: 1.0, fallback: last_number}``);
one annotated ``Literal[...]`` takes only those values, one annotated
``Annotated[..., REQUIRED]`` must be set, and one annotated ``Annotated[..., POSITIVE]`` must be
above 0 (a timeout, a length); all are checked when the recipe is validated.
``None`` in the result means "not applicable to this sample": trainers skip it instead of
teaching it as wrong. A column named like one of the reward's parameters does not reach it: the
parameter keeps its configured value.

Any reward can be routed to part of the batch by dataset columns: ``when: {task: math}`` (or
``{task: [math, code]}``) beside its name and weight scores only the samples whose ``task`` column
holds one of the listed values and gives ``None`` to the others, so a mixed dataset can send math
rows to ``math_accuracy`` and general rows to ``reward_model``. The function itself never sees the
rows routed away. ``when`` is reserved next to ``name`` and ``weight``: no reward has a parameter of
that name.

Rewards are found by name through the ``r1kit.rewards`` entry-point group (the built-ins, the
repository's ``rewards/`` folder installed as the package ``r1kit.rewards``, register there too,
see pyproject.toml), or by a ``"package.module:function"`` string for code that is not installed
as a package: a module in the current directory or beside the recipe file is found, once the
command has put those folders on ``sys.path`` (`add_plugin_folders`, called by r1kit.cli and by a
stage's own process; loading a plug-in changes no process-wide state).

A reward may declare the range of its scores as a function attribute, ``my_reward.bounds = (0.0,
1.0)``: a rejection stage whose ``min_total`` its rewards can never reach is then refused at
validate time.

A reward may also check its settings together, ``my_reward.check = fn(params) -> str | None``
(all its parameters, defaults filled in; a one-line problem or None), run when the reward is
built, so validate refuses them; and name the dataset columns it reads, ``my_reward.columns =
fn(params) -> list[str]``, which validate compares with a stage's data where that is known
without loading it (local .jsonl files: r1kit.data.columns_lacking).

A reward that computes on a GPU of the process that calls it (a model loaded in process) says so,
``my_reward.gpu = fn(params) -> bool``: a stage whose rewards run where no GPU is seen (TRL's
asynchronous rollout worker) warns at validate time.

A reward that keeps files between runs (a judge's cache) keeps them in `folder()`: the running
stage's folder in a run (``R1KIT_STAGE_DIR``, set while a stage runs, in its process and the
processes it starts), else r1kit's cache folder (``R1KIT_CACHE``, else ``$XDG_CACHE_HOME/r1kit``,
else ``~/.cache/r1kit``).

A reward that raises, or returns anything but one number or None per completion, stops the run
with a one-line RewardError naming the reward, the error and where it was raised (the traceback
is logged at debug level).

This module does not know any particular reward and never imports one by name.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import inspect
import logging
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from importlib.metadata import entry_points
from typing import Any, Callable

from r1kit.errors import RecipeError, RewardError, suggest

ENTRY_POINT_GROUP = "r1kit.rewards"
log = logging.getLogger("r1kit")

RewardFn = Callable[..., list]

STAGE_DIR = "R1KIT_STAGE_DIR"
"""Holds the running stage's folder while a stage runs (`in_stage`)."""


def folder() -> Path:
    """Where a reward keeps files between runs: the running stage's folder, else r1kit's cache folder."""
    if os.environ.get(STAGE_DIR):
        return Path(os.environ[STAGE_DIR])
    if os.environ.get("R1KIT_CACHE"):
        return Path(os.environ["R1KIT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "r1kit"


@contextlib.contextmanager
def in_stage(stage_dir: Path):
    """Inside: `folder()` is `stage_dir` (an environment variable, so that processes the stage
    starts, such as TRL's rollout worker, find it too)."""
    saved = os.environ.get(STAGE_DIR)
    os.environ[STAGE_DIR] = str(stage_dir)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(STAGE_DIR, None)
        else:
            os.environ[STAGE_DIR] = saved


def available() -> dict[str, str]:
    """Registered reward names mapped to their ``module:function`` targets."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load(name: str) -> RewardFn:
    """The function registered as `name`, or imported from a ``module:function`` string."""
    return load_plugin(name, ENTRY_POINT_GROUP, "reward")


def load_plugin(name: str, group: str, kind: str) -> Callable:
    """The function registered as `name` in entry-point `group`, or imported from a
    ``module:function`` string; errors name the `kind` of plug-in (reward, tool)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not all(part.isidentifier() for part in module_name.split(".")):
            raise RewardError(
                f"{kind} {name!r}: {module_name!r} is not a module name (dotted Python names, not a path); "
                "put the file beside the recipe or in the current folder and write FILE:FUNCTION"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RewardError(f"{kind} {name!r}: cannot import module {module_name!r}: {exc}") from exc
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise RewardError(f"{kind} {name!r}: module {module_name!r} has no function {attr!r}")
        return fn
    registered = {ep.name: ep for ep in entry_points(group=group)}
    if name not in registered:
        names = sorted(registered)
        raise RewardError(
            f"unknown {kind} {name!r}{suggest(name, names)}; registered {kind}s: {', '.join(names)}; "
            "or give a 'module:function' path"
        )
    return registered[name].load()


def add_plugin_folders(recipe_file: str | Path | None = None) -> None:
    """Append the current directory and the folder of `recipe_file` to ``sys.path`` (each unless
    there already), so that ``module:function`` plug-ins there import. Process-wide: for a
    command's entry (r1kit.cli, r1kit.stage_process), not for a library call."""
    folders = [str(Path(recipe_file).resolve().parent)] if recipe_file is not None else []
    if "" not in sys.path:  # `r1kit` as a command does not put the current directory there, `python -m` does
        folders.append(str(Path.cwd()))
    sys.path.extend(f for f in dict.fromkeys(folders) if f not in sys.path)


def parameters(fn: RewardFn) -> dict[str, Any]:
    """The reward's parameters (keyword-only arguments with defaults) and their defaults."""
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty
    }


REQUIRED = "required"
"""Marks a parameter a recipe must set: ``model: Annotated[str, REQUIRED] = ""``. (A keyword-only
argument without a default is a column the reward reads, not a parameter.)"""


POSITIVE = "positive"
"""Marks a number parameter that must be above 0: ``timeout: Annotated[float, POSITIVE] = 5.0``."""


def marked(fn: RewardFn, mark: str) -> list[str]:
    """The reward's parameters marked ``Annotated[..., mark]``."""
    hints = typing.get_type_hints(fn, include_extras=True)
    return [k for k, tp in hints.items() if typing.get_origin(tp) is typing.Annotated and mark in tp.__metadata__]


def required(fn: RewardFn) -> list[str]:
    """The reward's parameters marked ``Annotated[..., REQUIRED]``."""
    return marked(fn, REQUIRED)


def choices(fn: RewardFn) -> dict[str, tuple]:
    """The allowed values of parameters annotated ``Literal[...]``."""
    hints = typing.get_type_hints(fn)
    return {k: typing.get_args(tp) for k, tp in hints.items() if typing.get_origin(tp) is typing.Literal}


def summary(fn: RewardFn) -> str:
    """The first line of the reward's docstring."""
    return (inspect.getdoc(fn) or "").strip().split("\n")[0]


def _check_type(name: str, key: str, value: Any, default: Any) -> Any:
    """Parameters take the type of their default; ints are accepted where floats are expected."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise RewardError(
            f"reward {name!r}: parameter {key!r} must be {type(default).__name__}, got {value!r}"
        )
    return value


@dataclass
class Reward:
    """A configured reward: a registered function bound to its parameters, with a weight."""

    name: str
    fn: RewardFn
    params: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    when: dict[str, list] = field(default_factory=dict)
    """Routing: score only samples whose column values are listed here; None for the rest."""

    def columns(self) -> list[str]:
        """The dataset columns the reward reads, where its function names them (``fn.columns``)."""
        named = getattr(self.fn, "columns", None)
        return list(named({**parameters(self.fn), **self.params})) if named else []

    def gpu(self) -> bool:
        """Whether the reward computes on a GPU of the process that calls it (``fn.gpu``)."""
        uses = getattr(self.fn, "gpu", None)
        return bool(uses({**parameters(self.fn), **self.params})) if uses else False

    def __call__(self, completions: list[str], **columns) -> list[float | None]:
        if not self.when:
            return self._score(completions, columns)
        missing = [c for c in self.when if c not in columns]
        if missing:
            raise RewardError(
                f"reward {self.name!r}: `when` routes on column {missing[0]!r}, which the batch lacks; "
                f"columns: {', '.join(sorted(columns))}"
            )
        rows = [i for i in range(len(completions)) if all(columns[c][i] in v for c, v in self.when.items())]
        scores: list[float | None] = [None] * len(completions)
        if rows:
            # Columns are lists aligned with `completions`; other keyword arguments (None, TRL's
            # log_metric and log_extra callbacks) pass unchanged.
            sub = {k: [v[i] for i in rows] if isinstance(v, list) else v for k, v in columns.items()}
            for i, s in zip(rows, self._score([completions[i] for i in rows], sub)):
                scores[i] = s
        return scores

    def _score(self, completions: list[str], columns: dict) -> list[float | None]:
        # A column that shares a parameter's name never overrides the parameter.
        names = parameters(self.fn)
        columns = {k: v for k, v in columns.items() if k not in names}
        try:
            scores = self.fn(completions, **self.params, **columns)
        except RewardError:
            raise
        except Exception as exc:
            # One line for the recipe's author; the traceback stays in the log for the reward's.
            log.debug("reward %r failed", self.name, exc_info=True)
            where = _origin(exc)
            raise RewardError(
                f"reward {self.name!r} raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}{where}; "
                f"the batch had columns: {', '.join(sorted(columns)) or 'none'}"
            ) from exc
        if not isinstance(scores, list) or len(scores) != len(completions):
            got = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise RewardError(
                f"reward {self.name!r} returned {got} for {len(completions)} completions; "
                "a reward returns one float or None per completion"
            )
        bad = next(((i, s) for i, s in enumerate(scores) if s is not None and not (_is_number(s) and math.isfinite(float(s)))), None)
        if bad is not None:
            raise RewardError(
                f"reward {self.name!r} returned {bad[1]!r} for completion {bad[0]}; a reward returns one finite float, "
                "or None where it does not apply, per completion"
            )
        return [None if s is None else float(s) for s in scores]


def _is_number(value: Any) -> bool:
    """Converts to float as a number does (ints, floats, bools, numpy and torch scalars; not text)."""
    return hasattr(type(value), "__float__")


def _origin(exc: BaseException) -> str:
    """`` (at file:line)`` of the innermost frame of the exception's traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" (at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})" if tb is not None else ""


def _check_when(name: str, when: Any) -> dict[str, list]:
    """`when` as {column: [values]}; a single value stands for a list of one."""
    if not isinstance(when, dict) or not all(isinstance(k, str) for k in when):
        raise RewardError(f"reward {name!r}: `when` maps column names to a value or a list of values, e.g. {{task: math}}; got {when!r}")
    return {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in when.items()}


def build(name: str, params: dict[str, Any] | None = None, weight: float = 1.0) -> Reward:
    """Find reward `name` and bind `params`, checking names and types against its signature.

    ``params["when"]``, if present, is the routing (see the module docstring), not a parameter.
    """
    fn = load(name)
    allowed, needed, literal, positive = parameters(fn), required(fn), choices(fn), marked(fn, POSITIVE)
    params = dict(params or {})
    when = _check_when(name, params.pop("when", {}))
    for key, value in params.items():
        if key not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            raise RewardError(
                f"reward {name!r} has no parameter {key!r}{suggest(key, list(allowed))}; "
                f"its parameters: {listed}"
            )
        if key in literal and value not in literal[key]:
            raise RewardError(
                f"reward {name!r}: parameter {key!r} must be one of {', '.join(map(repr, literal[key]))}; "
                f"got {value!r}{suggest(str(value), [str(c) for c in literal[key]])}"
            )
        params[key] = _check_type(name, key, value, allowed[key])
        if key in positive and not params[key] > 0:
            raise RewardError(f"reward {name!r}: parameter {key!r} must be above 0; got {value!r}")
    missing = [k for k in needed if not params.get(k)]
    if missing:
        raise RewardError(f"reward {name!r} needs parameter {missing[0]!r} (set it beside the reward's name)")
    check = getattr(fn, "check", None)
    if check is not None and (problem := check({**allowed, **params})):
        raise RewardError(f"reward {name!r}: {problem}")
    return Reward(name=name, fn=fn, params=params, weight=float(weight), when=when)


def from_recipe(specs: list[dict[str, Any]], where: str) -> list[Reward]:
    """Configured rewards from recipe entries; errors name the entry."""
    out = []
    for i, spec in enumerate(specs):
        spec = dict(spec)
        name = spec.pop("name", None)
        if not isinstance(name, str):
            raise RecipeError(f"{where}[{i}]: each reward needs a 'name' (see `r1kit rewards list`)")
        weight = spec.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RecipeError(f"{where}[{i}].weight: expected a finite number, got {weight!r}")
        try:
            out.append(build(name, spec, weight))
        except RewardError as exc:
            raise RecipeError(f"{where}[{i}]: {exc}") from None
    if len({r.name for r in out}) != len(out):
        raise RecipeError(f"{where}: a reward is listed twice")
    return out


def for_trl(reward: Reward, scale: float = 1.0) -> "TRLReward":
    """Adapt a reward to TRL's ``reward_funcs`` calling convention (`TRLReward`); its scores times
    `scale` (for a trainer without ``reward_weights``)."""
    return TRLReward(reward, scale)


class TRLReward:
    """A reward in TRL's ``reward_funcs`` convention.

    TRL calls ``f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)``
    and names the logged metrics after ``f.__name__``. Conversational completions (lists of
    messages) are reduced to the assistant's text. The rendered prompts reach the reward as the
    ``prompt`` column (the format reward sees a prefilled ``<think>`` there) and ``completion_ids``
    as a column too (length rewards count tokens with it). An object rather than a closure, so a
    spawned process (TRL's asynchronous rollout worker) can take it.
    """

    def __init__(self, reward: Reward, scale: float = 1.0):
        self.reward, self.scale = reward, scale
        self.__name__ = reward.name.replace(":", "_").replace(".", "_")

    def __call__(self, prompts=None, completions=None, completion_ids=None, trainer_state=None, **columns):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        prompt_texts = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
        scores = self.reward(texts, prompt=prompt_texts, completion_ids=completion_ids, **columns)
        return scores if self.scale == 1.0 else [None if s is None else s * self.scale for s in scores]


def score(rewards: list[Reward], completions: list[str], **columns) -> dict[str, list[float | None]]:
    """Every reward's scores for one batch, by reward name."""
    return {r.name: r(completions, **columns) for r in rewards}


def best_total(rewards: list[Reward]) -> float | None:
    """The highest weighted total a sample can reach, when every reward declares its range (a
    ``bounds = (low, high)`` attribute on the function, as the built-ins do); else None."""
    best = 0.0
    for r in rewards:
        bounds = getattr(r.fn, "bounds", None)
        if bounds is None:
            return None
        best += max(0.0, r.weight * bounds[0], r.weight * bounds[1])  # a None score adds nothing
    return best


def weighted_total(scores: dict[str, list[float | None]], rewards: list[Reward]) -> list[float]:
    """Sum of weighted scores per sample; a None score contributes nothing (as in TRL's nansum)."""
    n = len(next(iter(scores.values()))) if scores else 0
    totals = [0.0] * n
    for r in rewards:
        for i, s in enumerate(scores[r.name]):
            if s is not None:
                totals[i] += r.weight * s
    return totals
