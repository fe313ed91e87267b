"""Unit-test rewards for code: run the program a completion wrote against the sample's tests.

    code_tests(completions, tests=[...], entry_point=[...])        # HumanEval / MBPP style
    code_tests(completions, test_cases=[[{"input": "1 2\\n", "output": "3\\n"}], ...])

The judging is r1kit.judge's (the evaluator uses the same): which part of a completion is the
program (``extract``: ``last_block``, the default, drops the reasoning and reads the answer block
or the last fenced block; ``whole`` runs the text as it is), and how the dataset columns
``tests`` (+ ``entry_point``, ``prefix``) and ``test_cases`` are run. The reward is 1.0 or 0.0
for ``tests``; for ``test_cases`` the fraction of cases passed (``mode="fraction"``) or
all-or-nothing (``"all"``). A sample with neither column (or an empty one) scores None.

Not here: the sandbox (r1kit.sandbox) and the judging rules (r1kit.judge).
"""

from __future__ import annotations

from r1kit.errors import RewardError
from r1kit.judge import Tests, judge
from r1kit.sandbox import Limits

MODES = ("fraction", "all")


def code_tests(
    completions: list[str],
    *,
    extract: str = "last_block",
    mode: str = "fraction",
    timeout: float = 3.0,
    memory_mb: int = 1024,
    **columns,
) -> list[float | None]:
    """Runs the completion's program against the sample's unit tests in a sandbox."""
    if mode not in MODES:
        raise RewardError(f"code_tests: mode must be one of {', '.join(MODES)}; got {mode!r}")
    n = len(completions)
    fields = ("tests", "entry_point", "prefix", "test_cases")
    values = [columns.get(f) or [None] * n for f in fields]
    tests = [Tests(**dict(zip(fields, row))) for row in zip(*values)]
    verdicts = judge(completions, tests, extract=extract, limits=Limits(wall_s=timeout, cpu_s=timeout, memory_mb=memory_mb))
    if mode == "all":
        return [float(v.ok) if v.total else None for v in verdicts]
    return [v.passed / v.total if v.total else None for v in verdicts]
