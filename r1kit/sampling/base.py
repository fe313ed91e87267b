"""What every sampling backend takes and returns: `SamplingParams`, `Completion`, and the
`Sampler` protocol that r1kit.sampling's backends implement; and the sampling settings of the
stages that generate (`SamplingConfig`, `EngineConfig`), declared once with the paper's defaults
for the eval and rejection stages and the ``r1kit eval`` command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

Backend = Literal["auto", "vllm", "transformers"]
BACKENDS: tuple[str, ...] = get_args(Backend)


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
class EngineConfig:
    """Which sampling engine a stage starts, and with what."""

    backend: Backend = "auto"
    """Sampling backend: auto takes vLLM on a CUDA GPU when it is installed, else transformers."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the backend: vllm.LLM's (gpu_memory_utilization, tensor_parallel_size, ...) or batch_size."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.6
    """0 means greedy decoding."""
    top_p: float = 0.95
    max_tokens: int = 512
    """Most new tokens per completion."""
    seed: int = 0


@dataclass
class Completion:
    text: str
    tokens: int
    """Number of generated tokens."""
    truncated: bool
    """True when generation stopped at max_tokens rather than at an end-of-sequence token."""
    tool_calls: int | None = None
    """Tool calls the completion made (r1kit.execution.tools); None when it was sampled without tools."""


class Sampler(Protocol):
    backend: str

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        ...

    def generate_full(self, prompts: list[str], n: int, params: SamplingParams, tools: list | None = None) -> list[list[Completion]]:
        """n completions of each prompt; with `tools` (r1kit.execution.tools.Tool), rollouts that run code
        as they go (r1kit.sampling.tool_loop), each completion the whole transcript."""
        ...
