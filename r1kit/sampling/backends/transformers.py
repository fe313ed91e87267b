"""``backend: transformers``: a transformers model driven by r1kit's decoding loop, on any machine
(r1kit.sampling.hf_backend). Every process of a run samples its own shard."""

from __future__ import annotations

from r1kit.sampling.backends import Backend, Engine


def load(model: str, engine: Engine):
    from r1kit.sampling.hf_backend import HFSampler

    return HFSampler(model, **engine.options)


BACKEND = Backend(name="transformers", load=load)
