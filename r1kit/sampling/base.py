"""What every sampling backend takes and returns: `SamplingParams`, `Completion`, and the
`Sampler` protocol that r1kit.sampling's backends implement; and the sampling settings of the
stages that generate (`SamplingConfig`, `EngineConfig`), declared once with the paper's defaults
for the eval and rejection stages and the ``r1kit eval`` command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(kw_only=True)
class SamplingConfig:
    """How a stage samples; defaults are the DeepSeek-R1 paper's (arXiv:2501.12948, section 3.1)."""

    temperature: float = 0.6
    """Sampling temperature (R1: 0.6); 0 is greedy decoding."""
    top_p: float = 0.95
    """Nucleus sampling (R1: 0.95)."""
    max_tokens: int = 32768
    """Most new tokens per sample (R1: 32768); a rejection stage drops samples cut there."""

    def sampling_problem(self) -> str | None:
        """What is wrong with these settings, in one line, or None."""
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_tokens < 1:
            return (
                "need temperature >= 0, 0 < top_p <= 1 and max_tokens >= 1; "
                f"got temperature {self.temperature}, top_p {self.top_p}, max_tokens {self.max_tokens}"
            )
        return None


@dataclass(kw_only=True)
class Endpoint:
    """Where a served model answers (``backend: endpoint``), or how r1kit talks to the servers it
    starts (``backend: vllm_server``): r1kit.sampling.endpoint."""

    url: list[str] = field(default_factory=list)
    """OpenAI-compatible base URLs (http://host:8000/v1); with several, requests go to the least busy."""
    name: str = ""
    """The model name the servers serve; default: the stage's model as written."""
    api_key_env: str = ""
    """The environment variable that holds the API key (its value is never written anywhere)."""
    concurrency: int = 16
    """Requests in flight at once, over all servers."""
    chat: bool = False
    """Send chat messages (/chat/completions, the server applies its chat template) instead of
    r1kit's rendered prompt (/completions): for an API without a completions endpoint."""
    timeout: float = 3600.0
    """Seconds one request may take (a long reasoning sample takes minutes)."""
    retries: int = 8
    """Retries of a request on 429, 5xx, timeouts and dropped connections, with doubling backoff."""
    start_timeout: float = 1800.0
    """backend vllm_server: seconds a starting server may take to answer /health."""

    def problem(self) -> str | None:
        """What is wrong with these settings, whatever the backend, in one line naming the key, or
        None (what a backend refuses of them: r1kit.sampling.backends.settings_problem)."""
        from urllib.parse import urlparse

        for i, url in enumerate(self.url):
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
                return f"endpoint.url[{i}]: {url!r} is not an http(s) URL like http://127.0.0.1:8000/v1"
        if self.concurrency < 1 or self.retries < 0 or self.timeout <= 0 or self.start_timeout <= 0:
            return (f"endpoint: need concurrency >= 1, retries >= 0, timeout > 0 and start_timeout > 0; got concurrency "
                    f"{self.concurrency}, retries {self.retries}, timeout {self.timeout}, start_timeout {self.start_timeout}")
        return None

    def machine_problem(self) -> str | None:
        """What this machine lacks to use these settings: the API key's variable, unset."""
        import os

        if self.api_key_env and not os.environ.get(self.api_key_env):
            return f"endpoint.api_key_env: the environment variable {self.api_key_env} is not set (it holds the API key)"
        return None


@dataclass(kw_only=True)
class EngineConfig:
    """Which sampling engine a stage starts, and with what."""

    backend: str = "auto"
    """Sampling backend (r1kit.sampling.backends): auto takes vLLM on a CUDA GPU when it imports, else
    transformers; vllm; endpoint samples a served model at endpoint.url; vllm_server starts vLLM
    servers for the model."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the backend: vllm.LLM's (gpu_memory_utilization, tensor_parallel_size, ...),
    the vLLM server's flags (vllm_server: max_model_len, tensor_parallel_size, ...) or batch_size."""
    endpoint: Endpoint = field(default_factory=Endpoint)
    """The served model (backend endpoint) or the started servers' client settings (vllm_server)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.6
    """0 means greedy decoding."""
    top_p: float = 0.95
    max_tokens: int = 512
    """Most new tokens per completion."""
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def engine_top_p(self) -> float:
        """The top-p an engine is asked for: 1 when greedy (no nucleus to cut)."""
        return 1.0 if self.greedy else self.top_p

    def draws(self, n: int) -> int:
        """Samples to ask an engine for, for `n` of one prompt: one when greedy (they would be equal;
        vLLM refuses n > 1 for greedy decoding), repeated n times by the caller."""
        return 1 if self.greedy else n


@dataclass
class Completion:
    text: str
    tokens: int | None
    """Number of generated tokens; None where the backend cannot tell (an API that reports no usage)."""
    truncated: bool
    """True when generation stopped at max_tokens rather than at an end-of-sequence token."""
    tool_calls: int | None = None
    """Tool calls the completion made (r1kit.execution.tools); None when it was sampled without tools."""
    turns: int | None = None
    """Turns the model generated in a multi-turn rollout (tools or an environment); None for a single completion."""
    episode: dict | None = None
    """A rollout in an environment: its episode's record (r1kit.environments.Episode.record, with turns)."""


class Sampler(Protocol):
    backend: str

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        ...

    def generate_full(self, prompts: list[str], n: int, params: SamplingParams, tools: list | None = None) -> list[list[Completion]]:
        """n completions of each prompt; with `tools` (r1kit.execution.tools.Tool), rollouts that run code
        as they go (r1kit.sampling.tool_loop), each completion the whole transcript."""
        ...
