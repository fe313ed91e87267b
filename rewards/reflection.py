"""Reflection: does a completion check or revise its own reasoning? A metric more than a reward.

The DeepSeek-R1 paper (Nature, 2025) tracks how often R1-Zero's responses use reflective words
during RL ("wait", "mistake", "however", "but", "retry", "error", "verify", "wrong", "evaluate",
"check": the default `phrases`) and shows it rising with response length: behaviours nobody
rewarded. Recipe use, with weight 0 so that it is logged each step and never optimised::

    rewards: [{name: reflection, weight: 0.0}]                         # share of reflective responses
    rewards: [{name: reflection, weight: 0.0, count: true, phrases: [wait, "let me check"]}]

TRL logs its batch mean as ``rewards/reflection/mean``: with ``count: false`` (the default) the
share of responses holding at least one phrase, with ``count: true`` the phrases per response.

A phrase matches as whole words, case-insensitively, any run of spaces between its words:
``check`` counts in "Let me check" and "CHECK:", never in "checkered" or "checks"; ``but`` never in
"butter"; a hyphen joins words ("wait-listed" is not "wait"). Tool output blocks (r1kit.execution.tools)
are left out: a traceback's "Error" is the sandbox's word, not the model's. The prompt is never
read.
"""

from __future__ import annotations

import re

from r1kit.errors import RewardError
from r1kit.text import without_tool_outputs

PHRASES = ["wait", "mistake", "however", "but", "retry", "error", "verify", "wrong", "evaluate", "check"]


def pattern(phrases: list[str]) -> re.Pattern:
    """One regular expression matching any of `phrases` as whole words, case-insensitively."""
    words = [str(p).split() for p in phrases]
    if not phrases or not all(words):
        raise RewardError(f"reflection: phrases must be a non-empty list of non-blank phrases, got {phrases!r}")
    alternatives = sorted((r"\s+".join(map(re.escape, w)) for w in words), key=len, reverse=True)
    return re.compile(r"(?<![\w-])(?:" + "|".join(alternatives) + r")(?![\w-])", re.IGNORECASE)


def reflection(completions: list[str], *, phrases: list = PHRASES, count: bool = False, **columns) -> list[float]:
    """1.0 when the completion uses a reflective phrase (R1's list by default), else 0.0; with
    `count`, how many times it does."""
    found = pattern(phrases)
    texts = [without_tool_outputs(c) for c in completions]
    return [float(len(found.findall(t))) if count else float(found.search(t) is not None) for t in texts]
