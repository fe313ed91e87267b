"""Unit-test rewards for code: run the program a completion wrote against the sample's tests.

    code_tests(completions, tests=[...], entry_point=[...])        # HumanEval / MBPP style
    code_tests(completions, test_cases=[[{"input": "1 2\\n", "output": "3\\n"}], ...])

The judging is r1kit.execution.judge's (the evaluator uses the same): which part of a completion is the
program (``extract``: ``last_block``, the default, drops the reasoning and reads the answer block
or the last fenced block; ``whole`` runs the text as it is), and how the dataset columns
``tests`` (+ ``entry_point``, ``prefix``) and ``test_cases`` are run. When the batch carries the
rendered prompts (a ``prompt`` column, as r1kit's GRPO stage passes them), a prompt that ends
with ``<think>`` means the completion starts inside the reasoning. The reward is 1.0 or 0.0
for ``tests``; for ``test_cases`` the fraction of cases passed (``mode="fraction"``) or
all-or-nothing (``"all"``). A sample with neither column (or an empty one) scores None.

Not here: the sandbox (r1kit.execution.sandbox) and the judging rules (r1kit.execution.judge).
"""

from __future__ import annotations

from typing import Annotated, Literal

from r1kit.errors import RewardError
from r1kit.execution.judge import CODE_FIELDS, Tests, judge
from r1kit.reward_registry import POSITIVE
from r1kit.execution.sandbox import Limits
from r1kit.text import opens_think

MODES = ("fraction", "all")


def code_tests(
    completions: list[str],
    *,
    extract: Literal["last_block", "whole"] = "last_block",
    mode: Literal["fraction", "all"] = "fraction",
    timeout: Annotated[float, POSITIVE] = 3.0,
    memory_mb: Annotated[int, POSITIVE] = 1024,
    **columns,
) -> list[float | None]:
    """Runs the completion's program against the sample's unit tests in a sandbox."""
    if mode not in MODES:
        raise RewardError(f"code_tests: mode must be one of {', '.join(MODES)}; got {mode!r}")
    n = len(completions)
    values = [columns.get(f) or [None] * n for f in CODE_FIELDS]
    tests = [Tests(**dict(zip(CODE_FIELDS, row))) for row in zip(*values)]
    # A prompt that opened <think> (GRPO passes the rendered prompts) leaves the completion inside it.
    prefilled = [opens_think(p) for p in columns.get("prompt") or [None] * n]
    limits = Limits(wall_s=timeout, cpu_s=timeout, memory_mb=memory_mb)
    verdicts = judge(completions, tests, extract=extract, limits=limits, prefilled=prefilled)
    if mode == "all":
        return [float(v.ok) if v.total else None for v in verdicts]
    return [v.passed / v.total if v.total else None for v in verdicts]


code_tests.bounds = (0.0, 1.0)
