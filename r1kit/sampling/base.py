"""What every sampling backend takes and returns: `SamplingParams`, `Completion`, and the
`Sampler` protocol that r1kit.sampling's backends implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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


class Sampler(Protocol):
    backend: str

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[str]]:
        ...

    def generate_full(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        ...
