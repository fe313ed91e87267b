"""Sampling backends, one record each (`Backend`): how a backend loads a sampler, how a
generation stage's work is sharded among a run's processes, and what it refuses in a recipe, on
a machine and in a server. Each backend is one module of this package, named as recipes and
``--backend`` name it, defining ``BACKEND``; `get` finds it and `names` lists them, so adding a
backend is adding a module here (docs/contributing.md). Stages, the pipeline's checks and the CLI
ask the record; none branches on a backend's name.

Not here: the samplers themselves (r1kit.sampling.hf_backend, vllm_backend, endpoint, serve).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from r1kit.errors import RecipeError, suggest
from r1kit.hardware import World
from r1kit.sampling.base import Endpoint


@dataclass
class Engine:
    """What a backend's `load` gets beside the model: the run's place, the served model's settings
    and where started servers log, and the backend's own keyword arguments."""

    world: World = World()
    endpoint: Endpoint = field(default_factory=Endpoint)
    log_dir: Path = Path(".")
    options: dict[str, Any] = field(default_factory=dict)


def every_process(world: World, options: dict) -> tuple[int | None, int]:
    """One shard per process: each runs an engine of its own."""
    return world.rank, world.world


@dataclass(frozen=True)
class Backend:
    name: str
    load: Callable[[str, Engine], Any]
    """The sampler for a model folder or hub id (r1kit.sampling.base.Sampler)."""
    served: bool = False
    """Samples through an OpenAI-compatible server: takes the ``endpoint:`` settings."""
    loads_weights: bool = True
    """Loads the model's weights on this machine (in process or in a server it starts), so r1kit
    picks their precision (r1kit.hardware.precision)."""
    shards: Callable[[World, dict], tuple[int | None, int]] = every_process
    """(this process's shard, the number of shards) of a generation stage's work; None: no shard."""
    problem: Callable[[Endpoint, bool, bool], str | None] = lambda endpoint, prefill, tools: None
    """What the recipe asks that this backend cannot do, from the recipe alone, one line naming the
    key: `endpoint` settings, a <think> prefill, tool rollouts."""
    machine_problem: Callable[[Endpoint], str | None] = lambda endpoint: None
    """What this machine lacks for the backend (a package, an API key's variable)."""
    server_problem: Callable[[Endpoint, str], str | None] = lambda endpoint, name: None
    """A served model that does not answer as the settings say (`name`: the name it must serve)."""


def names() -> list[str]:
    """Every backend, as recipes name them."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def get(name: str) -> Backend:
    """The backend named `name`; a RecipeError naming the allowed ones otherwise."""
    if name not in names():
        raise RecipeError(f"backend: {name!r} is not a sampling backend{suggest(name, names())}; allowed: {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def served(name: str) -> bool:
    """Whether backend `name` samples through a server (False for a name that is none, as an old
    summary may hold)."""
    return name in names() and get(name).served


def settings_problem(name: str, endpoint: Endpoint, prefill: bool = False, tools: bool = False) -> str | None:
    """What is wrong with a stage's (or ``r1kit eval``'s) engine settings, in one line naming the
    key, or None: an unknown backend, served-model settings it does not take, its own refusals,
    and the endpoint's own settings."""
    if name not in names():
        return f"backend: {name!r} is not a sampling backend{suggest(name, names())}; allowed: {', '.join(names())}"
    backend = get(name)
    if not backend.served and (endpoint.url or endpoint.name):
        return f"endpoint: settings of a served model, but backend is {name}; set backend: endpoint"
    return backend.problem(endpoint, prefill, tools) or endpoint.problem()
