"""Filters for rejection-sampled completions: pure functions on the text, one switch each.

DeepSeek-R1 (arXiv:2501.12948, section 2.3.3) kept only correct samples, then "filtered out
chain-of-thought with mixed languages, long paragraphs, and code blocks". The rejection stage's
``filters:`` section (`FilterConfig`) turns these on and off; `filter_group` applies them to the
verified samples of one prompt and says which filter dropped each, in this order:

- ``truncated``: the sample stopped at the sampling length limit instead of ending;
- ``overlong``: more than ``max_tokens`` tokens or ``max_chars`` characters (off by default);
- ``long_paragraph``: a paragraph of the chain of thought (text between blank lines) longer than
  ``max_paragraph_chars`` (the paper gives no number: off by default);
- ``mixed_language``: the chain of thought has words, and under ``min_language_share`` of them
  are in ``language``'s script (the script heuristic of ``r1kit.text``; a chain of thought
  of math alone has no words and passes);
- ``code_in_cot``: a fenced code block (three backticks or tildes) inside the chain of thought
  (blocks a tool ran, with their output, do not count: r1kit.execution.tools);
- ``repetition``: more than ``max_repetition`` of the word ``repetition_ngram``-grams of the
  completion repeat an earlier one (a sample stuck in a loop);
- ``exact_duplicate``: the same text as a sample kept before it, once case is folded and
  whitespace collapsed;
- ``near_duplicate``: Jaccard similarity of character 5-gram sets (of the normalised text) with a
  sample kept before it at least ``near_duplicate_threshold``. Exact Jaccard, not MinHash: a
  prompt has tens of samples, so comparing all pairs is cheap.

The chain of thought is what ``r1kit.text.chain_of_thought`` finds (inside
``<think>…</think>``, or before a ``</think>`` when the prompt prefilled ``<think>``).
Duplicates are looked for among one prompt's samples only: the same text answering two
different questions is two examples.

Not here: verification (the rewards) and the cap on samples per prompt (the rejection stage).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from r1kit.text import chain_of_thought, countable_words, target_share, without_tool_calls

REASONS = (
    "truncated",
    "overlong",
    "long_paragraph",
    "mixed_language",
    "code_in_cot",
    "repetition",
    "exact_duplicate",
    "near_duplicate",
)
LOOSEN = {
    "truncated": "filters.truncated: false, or a larger max_tokens",
    "overlong": "filters.max_tokens or filters.max_chars",
    "long_paragraph": "filters.max_paragraph_chars",
    "mixed_language": "filters.min_language_share, or filters.mixed_language: false",
    "code_in_cot": "filters.code_in_cot: false",
    "repetition": "filters.max_repetition, or filters.repetition: false",
    "exact_duplicate": "filters.exact_duplicates: false",
    "near_duplicate": "filters.near_duplicate_threshold, or filters.near_duplicates: false",
}
"""For each reason in REASONS, the `FilterConfig` keys that let more samples through."""
SHINGLE = 5
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


@dataclass
class FilterConfig:
    truncated: bool = True
    """Drop samples that stopped at the sampling length limit instead of ending."""
    max_tokens: int | None = None
    """overlong: drop samples of more generated tokens than this (null: off)."""
    max_chars: int | None = None
    """overlong: drop samples of more characters than this (null: off)."""
    max_paragraph_chars: int | None = None
    """long_paragraph: drop a chain of thought with a paragraph longer than this (null: off)."""
    mixed_language: bool = True
    """Drop chains of thought mixing scripts (R1's language filter)."""
    language: str = "en"
    """Target language of the chain of thought: en, zh, ja, ko, ru (as language_consistency)."""
    min_language_share: float = 0.95
    """Least share of the chain of thought's words in the target language's script."""
    code_in_cot: bool = True
    """Drop chains of thought holding a fenced code block."""
    repetition: bool = True
    """Drop completions that repeat themselves (see max_repetition)."""
    repetition_ngram: int = 10
    """Word n-gram length for the repetition filter."""
    max_repetition: float = 0.2
    """Most share of word n-grams that repeat an earlier one."""
    exact_duplicates: bool = True
    """Drop a sample equal to one kept before it for the same prompt (after normalisation)."""
    near_duplicates: bool = True
    """Drop a sample too similar to one kept before it for the same prompt."""
    near_duplicate_threshold: float = 0.9
    """Character 5-gram Jaccard similarity from which two samples are near duplicates."""

    def problem(self) -> str | None:
        """The first setting that would keep no sample or means nothing, as ``key: why``; None."""
        for key in ("max_tokens", "max_chars", "max_paragraph_chars"):
            value = getattr(self, key)
            if value is not None and value < 1:
                return f"{key}: must be at least 1 (or null: off), got {value}; at {value} every sample is overlong"
        shares = {"min_language_share": self.min_language_share, "max_repetition": self.max_repetition}
        for key, value in shares.items():
            if not 0.0 <= value <= 1.0:
                return f"{key}: a share, from 0 to 1, got {value}"
        if not 0.0 < self.near_duplicate_threshold <= 1.0:
            return f"near_duplicate_threshold: a similarity above 0 and at most 1, got {self.near_duplicate_threshold}"
        if self.repetition_ngram < 1:
            return f"repetition_ngram: a word n-gram length of at least 1, got {self.repetition_ngram}"
        return None


# ---------------------------------------------------------------------------------------------
# The measures, each on plain text


def is_mixed_language(cot: str, language: str, min_share: float) -> bool:
    """True when `cot` has words and under `min_share` of them are in `language`'s script."""
    if not countable_words(cot):
        return False  # no countable word in any script: math or numbers alone
    return target_share(cot, language) < min_share


def has_code_block(text: str) -> bool:
    return "```" in text or "~~~" in text


def longest_paragraph(text: str) -> int:
    """Characters in the longest paragraph (paragraphs are separated by blank lines)."""
    return max(len(p.strip()) for p in _PARAGRAPH_BREAK.split(text))


def repeated_ngram_share(text: str, n: int) -> float:
    """Share of the word n-grams of `text` that occurred earlier in it; 0.0 with fewer than n words."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def normalize(text: str) -> str:
    return " ".join(text.casefold().split())


def shingles(text: str, k: int = SHINGLE) -> set[str]:
    """Character k-grams of the normalised text (the whole text when it is shorter than k)."""
    t = normalize(text)
    return {t[i : i + k] for i in range(max(1, len(t) - k + 1))}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


# ---------------------------------------------------------------------------------------------
# Applying them


def sample_reason(text: str, tokens: int | None, truncated: bool, cfg: FilterConfig) -> str | None:
    """The first filter that drops this sample on its own (duplicates aside), or None."""
    cot = chain_of_thought(text)
    if cfg.truncated and truncated:
        return "truncated"
    if (cfg.max_tokens is not None and tokens is not None and tokens > cfg.max_tokens) or (cfg.max_chars is not None and len(text) > cfg.max_chars):
        return "overlong"
    if cfg.max_paragraph_chars is not None and longest_paragraph(cot) > cfg.max_paragraph_chars:
        return "long_paragraph"
    if cfg.mixed_language and is_mixed_language(cot, cfg.language, cfg.min_language_share):
        return "mixed_language"
    if cfg.code_in_cot and has_code_block(without_tool_calls(cot)):  # a tool call is not code written into the reasoning
        return "code_in_cot"
    if cfg.repetition and repeated_ngram_share(text, cfg.repetition_ngram) > cfg.max_repetition:
        return "repetition"
    return None


def filter_group(texts: list[str], tokens: list[int | None], truncated: list[bool], cfg: FilterConfig) -> list[str | None]:
    """Why each of one prompt's samples is dropped (a name from REASONS), or None to keep it.

    Samples are taken in order: a duplicate is dropped when it repeats a sample kept before it.
    """
    out: list[str | None] = []
    seen: set[str] = set()
    kept_shingles: list[set[str]] = []
    for text, n, cut in zip(texts, tokens, truncated):
        norm = normalize(text)
        sh = shingles(norm) if cfg.near_duplicates else set()
        reason = sample_reason(text, n, cut, cfg)
        if reason is None and cfg.exact_duplicates and norm in seen:
            reason = "exact_duplicate"
        if reason is None and cfg.near_duplicates and any(jaccard(sh, o) >= cfg.near_duplicate_threshold for o in kept_shingles):
            reason = "near_duplicate"
        if reason is None:
            seen.add(norm)
            kept_shingles.append(sh)
        out.append(reason)
    return out
