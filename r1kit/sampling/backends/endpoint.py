"""``backend: endpoint``: a model served behind an OpenAI-compatible API at ``endpoint.url``
(r1kit.sampling.endpoint); the weights stay on the server. Each process of a run samples its shard."""

from __future__ import annotations

from r1kit.sampling.backends import Backend, Engine


def load(model: str, engine: Engine):
    from r1kit.sampling.endpoint import EndpointSampler

    return EndpointSampler(model, engine.endpoint)


def problem(endpoint, prefill: bool, tools: bool) -> str | None:
    if not endpoint.url:
        return "endpoint.url: backend endpoint needs the server's URL (http://host:port/v1)"
    if endpoint.chat and prefill:
        return "endpoint.chat: the server writes the assistant's turn, so r1kit cannot prefill <think>; set think_prefill: false or chat: false"
    if endpoint.chat and tools:
        return "endpoint.chat: tool rollouts continue r1kit's own prompt; use the completions endpoint (chat: false)"
    return None


def server_problem(endpoint, name: str) -> str | None:
    """Every URL is asked which models it serves (r1kit.pipeline.preflight)."""
    from r1kit.sampling.endpoint import EndpointError, probe

    if endpoint.machine_problem():
        return None  # said by machine_problem
    try:
        probe(endpoint, name)
    except EndpointError as exc:
        return f"endpoint: {exc}"
    return None


BACKEND = Backend(name="endpoint", load=load, served=True, loads_weights=False, problem=problem,
                  machine_problem=lambda endpoint: endpoint.machine_problem(), server_problem=server_problem)
