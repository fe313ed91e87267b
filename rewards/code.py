"""Unit-test rewards for code: run the program a completion wrote against the sample's tests.

    code_tests(completions, tests=[...], entry_point=[...])        # HumanEval / MBPP style
    code_tests(completions, test_cases=[[{"input": "1 2\\n", "output": "3\\n"}], ...])

The program is the last fenced ```python (or bare ```) block of the completion, or the whole
completion when it has no such block (``extract="last_block"``); ``extract="whole"`` always runs
the whole text. The tests come from one of two dataset columns:

- ``tests``: Python source run after the program in the same module, assert style. With an
  ``entry_point`` column, ``check(<entry_point>)`` is appended, as HumanEval's tests expect.
  1.0 when every statement ran to its end, else 0.0; exiting early (``sys.exit(0)``,
  ``os._exit(0)``) is a failure.
- ``test_cases``: a list of ``{"input": stdin, "output": expected stdout}`` (or that list as JSON
  text) for whole programs. A case passes when the program exits with status 0 (so ending with
  ``sys.exit()`` is fine, as on programming-contest judges) and its output equals the expected
  one, line by line, with runs of spaces collapsed and blank lines at either end ignored. The
  reward is the fraction of cases passed (``mode="fraction"``) or all-or-nothing (``"all"``).

A sample with neither column (or an empty one) scores None. Every program runs in its own
r1kit.sandbox subprocess, all of a batch's runs in parallel over the CPU cores; read that
module for what the sandbox does and does not contain.

Not here: languages other than Python; removing reasoning (``<think>``) from an unfenced
completion; guarding against programs that game the asserts (an object whose ``__eq__`` is
always true passes an ``assert f(x) == y``).
"""

from __future__ import annotations

import json
import re

from r1kit.errors import RewardError
from r1kit.sandbox import Limits, run_many

EXTRACT = ("last_block", "whole")
MODES = ("fraction", "all")
PYTHON_TAGS = ("", "python", "py", "python3")

# A fenced block: ``` plus an optional info string, a newline, the code, and the closing ```.
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)


def extract_program(completion: str, extract: str = "last_block") -> str:
    """The program a completion wrote (see the module docstring)."""
    if extract == "whole":
        return completion
    blocks = [code for tag, code in _FENCE.findall(completion) if tag.strip().lower() in PYTHON_TAGS]
    return blocks[-1] if blocks else completion


def normalise_output(text: str) -> str:
    """Output as compared: runs of spaces collapsed per line, blank lines at either end dropped."""
    return "\n".join(" ".join(line.split()) for line in text.strip().splitlines())


def _cases(value, index: int) -> list[tuple[str, str]]:
    cases = json.loads(value) if isinstance(value, str) else value
    if not isinstance(cases, list) or not all(isinstance(c, dict) and {"input", "output"} <= c.keys() for c in cases):
        raise RewardError(
            f"code_tests: test_cases of sample {index} must be a list of "
            f'{{"input": ..., "output": ...}} objects (or its JSON text), got {value!r:.200}'
        )
    return [(str(c["input"]), str(c["output"])) for c in cases]


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
    if extract not in EXTRACT:
        raise RewardError(f"code_tests: extract must be one of {', '.join(EXTRACT)}; got {extract!r}")
    if mode not in MODES:
        raise RewardError(f"code_tests: mode must be one of {', '.join(MODES)}; got {mode!r}")
    n = len(completions)
    tests = columns.get("tests") or [None] * n
    entry_points = columns.get("entry_point") or [None] * n
    test_cases = columns.get("test_cases") or [None] * n

    # One sandbox job per `tests` sample and per stdin/stdout case; `owner[j]` is job j's sample.
    jobs: list[tuple[str, str]] = []
    owner: list[int] = []
    expected: list[str | None] = []
    for i, completion in enumerate(completions):
        program = extract_program(completion, extract)
        if tests[i]:
            check = f"\n\ncheck({entry_points[i]})\n" if entry_points[i] else "\n"
            jobs.append((f"{program}\n\n{tests[i]}{check}", ""))
            owner.append(i)
            expected.append(None)
        elif test_cases[i]:
            for stdin, stdout in _cases(test_cases[i], i):
                jobs.append((program, stdin))
                owner.append(i)
                expected.append(stdout)

    results = run_many(jobs, Limits(wall_s=timeout, cpu_s=timeout, memory_mb=memory_mb))
    passed: list[list[bool]] = [[] for _ in completions]
    for i, want, r in zip(owner, expected, results):
        if want is None:
            passed[i].append(r.ok)
        else:
            ran = not r.timed_out and r.returncode == 0
            passed[i].append(ran and normalise_output(r.stdout) == normalise_output(want))

    scores: list[float | None] = []
    for p in passed:
        if not p:
            scores.append(None)
        elif mode == "all":
            scores.append(float(all(p)))
        else:
            scores.append(sum(p) / len(p))
    return scores
