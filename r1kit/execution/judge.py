"""Judging code: does the program a completion wrote pass a problem's unit tests, and if not, why.

    from r1kit.execution.judge import Tests, judge
    verdicts = judge(["def add(a, b):\\n    return a + b\\n"], [Tests(tests="assert add(2, 3) == 5\\n")])
    verdicts[0].passed, verdicts[0].reason          # True, None

The `code_tests` reward (rewards/code.py) scores with it during training and the evaluator
(r1kit.evaluation.evaluate) records its verdicts for code benchmarks, so both judge a program the same way.

**The program** (`extract_program`) is, by default (``"last_block"``): the text after the last
``</think>`` (reasoning is not the program; a ``<think>`` never closed, by the completion or by
a prompt that opened it, leaves no program), then the
content of its ``<answer>`` block if it has one, then the last fenced ```python (or bare ```)
block in that, or all of it when it has no such block. ``"whole"`` takes the completion as it
is. Unless it is a function body continuing a prefix (below), a program indented as a whole
(``<answer> def f...``) is dedented. The program must compile on its own before any test is
appended to it (so it cannot swallow the tests with a trailing decorator or an open string).

**The tests** (`Tests`, the dataset columns of the same names):

- ``tests``: Python source run after the program in the same module, assert style; with an
  ``entry_point``, ``check(<entry_point>)`` is appended, as HumanEval's tests expect. With a
  ``prefix`` (HumanEval's prompt: imports, helpers and the signature), the program is the
  prefix followed by the completion, as HumanEval's harness builds it; a completion that
  defines the entry point itself (chat and reasoning models rewrite the signature) follows the
  prefix as a definition of its own, which replaces the prefix's stub while its imports and
  helpers stay. Passed when every statement ran to its end; exiting early fails. The module runs
  with ``__name__`` set to ``"__solution__"``, as HumanEval's harness runs a solution other than
  as ``__main__``, so an ``if __name__ == "__main__":`` block does not run.
  A ``prefix`` without an ``entry_point`` is code every program follows (LiveCodeBench's imports).
- ``test_cases``: ``{"input": stdin, "output": expected stdout}`` objects (or their list as JSON
  text) for whole programs (after the ``prefix``, if any). A case passes when the program exits with status 0 and its output
  equals the expected one line by line, with runs of spaces collapsed and blank lines at either
  end ignored (programs run as ``__main__``). The verdict counts the cases passed. A program may
  write twice the largest expected output of the batch, when that is above the sandbox's bound.
- ``time_limit`` / ``memory_limit``: the problem's own limits per run (Codeforces gives them),
  in place of the judge's CPU seconds and address space (the wall clock then allows twice the
  time plus a second, so a run is not failed for waiting on a busy machine). They are the limits
  set for C++; Python gets no extra time, as on Codeforces itself.
- ``checker``: Python source that judges a ``test_cases`` output where several are right. It runs
  in the sandbox (under the judge's limits) as ``checker.py input.txt correct_output.txt
  solution_output.txt``, those three files in its working directory, after a program that exited
  with status 0 and whose output differs from the expected one (an equal output passes without
  it). The case passes when the checker exits with status 0 and prints a number of at least 1
  first (``1``: accepted; ``0``, anything else or a non-zero exit: wrong answer).

**Why a run failed** (`Verdict.reason`): ``no program`` (none extracted, or text that does not
compile and has no line a program would: prose), ``syntax error``, ``timeout``, ``output
limit exceeded``, ``cpu time limit``, ``exited early`` (``sys.exit(0)`` before the last line), ``exit status N``,
``wrong answer`` (a stdin/stdout case), ``checker error`` (the checker itself failed), ``killed by signal N``, or the name of the exception that
ended it (``AssertionError`` for a failed assertion, ``NameError``, ``MemoryError``, ...). For
stdin/stdout problems it is the first failing case's reason.

Every run is its own r1kit.execution.sandbox subprocess, all of a batch's runs in parallel; read that module
for what the sandbox does and does not contain. Not here: languages other than Python, special
judges (problems with several right outputs), interactive problems, guarding against programs
that game the asserts (an object whose ``__eq__`` is always true passes ``assert f(x) == y``).
"""

from __future__ import annotations

import ast
import io
import json
import re
import signal
import textwrap
from dataclasses import dataclass, fields, replace
from typing import Any

from r1kit.errors import RewardError
from r1kit.execution.sandbox import Limits, RunResult, run_many

EXTRACT = ("last_block", "whole")
PYTHON_TAGS = ("", "python", "py", "python3")

# A fenced block: ``` plus an optional info string, a newline, the code, and the closing ```.
FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
# The last line of a traceback, or of a syntax error report: `NameError: name 'x' is not defined`.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Iteration))(?::|$)")


# A line a program would start: a definition, an import, a statement keyword, a call or an assignment.
_CODE_LINE = re.compile(r"^\s*(?:(?:async\s+)?def\s|class\s|import\s|from\s+\S+\s+import\s|return\b|print\(|for\s|while\s|if\s|"
                        r"elif\s|else\s*:|try\s*:|except\b|with\s|@\w|[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*(?:[-+*/%]|//)?=(?!=)|"
                        r"[A-Za-z_][\w.]*\([^)]*\)\s*$)", re.M)


def looks_like_code(program: str) -> bool:
    """Whether text that does not compile has a line a program would (a broken program: ``syntax
    error``), or none (prose, with no program in it: ``no program``)."""
    return bool(_CODE_LINE.search(program))


def extract_program(completion: str, extract: str = "last_block", prefilled: bool = False) -> str:
    """The program a completion wrote (see the module docstring); "" when there is none.
    `prefilled`: the prompt opened ``<think>``, so the completion starts inside the reasoning."""
    if extract == "whole":
        return completion
    text = completion
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text or prefilled:
        return ""  # still reasoning when it stopped
    if "<answer>" in text:
        text = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
    blocks = [code for tag, code in FENCE.findall(text) if tag.strip().lower() in PYTHON_TAGS]
    program = blocks[-1] if blocks else text
    return program.strip("\n") + "\n" if program.strip() else ""


def _dedent(program: str) -> str:
    """A program indented as a whole (``<answer> def f...``), dedented; others as they are."""
    return textwrap.dedent(program) if program[:1] in (" ", "\t") else program


def normalise_output(text: str) -> str:
    """Output as compared: runs of spaces collapsed per line, blank lines at either end dropped."""
    return "\n".join(" ".join(line.split()) for line in text.strip().splitlines())


@dataclass(frozen=True)
class Tests:
    """A problem's unit tests: the dataset columns `tests` (+ `entry_point`, `prefix`) or `test_cases`."""

    tests: str | None = None
    entry_point: str | None = None
    prefix: str | None = None
    test_cases: Any = None
    """A list of {"input", "output"} objects, or its JSON text."""
    time_limit: float | None = None
    """Seconds (wall and CPU) per run, the problem's own (Codeforces); None: the judge's limits."""
    memory_limit: float | None = None
    """MiB of address space per run, the problem's own; None: the judge's limits."""
    checker: str | None = None
    """A Python checker that accepts or rejects a test_cases output (problems with several right
    outputs); None: outputs are compared with the expected ones."""

    def cases(self, sample: int | str) -> list[tuple[str, str]]:
        value = self.test_cases
        cases = json.loads(value) if isinstance(value, str) else value
        if not isinstance(cases, list) or not all(isinstance(c, dict) and {"input", "output"} <= c.keys() for c in cases):
            raise RewardError(
                f"code_tests: test_cases of sample {sample} must be a list of "
                f'{{"input": ..., "output": ...}} objects (or its JSON text), got {value!r:.200}'
            )
        return [(str(c["input"]), str(c["output"])) for c in cases]


CODE_FIELDS = tuple(f.name for f in fields(Tests))
"""The dataset columns a code problem's tests come from."""


@dataclass(frozen=True)
class Verdict:
    """How a program did on a problem's tests."""

    passed: int
    """Tests passed: 0 or 1 for `tests`, cases passed for `test_cases`."""
    total: int
    """Tests run; 0 when the problem has none (nothing to judge)."""
    reason: str | None
    """Why it failed (see the module docstring); None when everything passed or nothing ran."""

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


def program_of(completion: str, t: Tests, extract: str = "last_block", prefilled: bool = False) -> str:
    """The program that runs: the extracted program after the prefix, if any (without tests).

    With a prefix and an entry point, a program that does not define the entry point (once
    dedented) is a function body continuing the prefix's signature (HumanEval's completions)
    and keeps its indentation; any other program indented as a whole is dedented."""
    program = extract_program(completion, extract, prefilled)
    if not program.strip():
        return ""
    whole = _dedent(program)
    defines = t.entry_point and re.search(rf"^(?:async\s+)?def\s+{re.escape(t.entry_point)}\s*\(", whole, re.M)
    if not (t.prefix and t.entry_point) or defines:
        program = whole
    return f"{t.prefix}\n{program}" if t.prefix else program


def compiles(program: str) -> bool:
    """The program is valid Python on its own (compiled, never run). Checked before the tests are
    appended, so that a program cannot reach into them: a trailing decorator that swallows the
    tests' ``def check``, or an open bracket or string."""
    try:
        compile(program, "prog.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def assemble(program: str, t: Tests) -> str:
    """The module a `tests` problem runs: the program, the tests and the check call. It runs under
    another ``__name__`` than ``__main__``, as HumanEval's and LiveCodeBench's harnesses run
    solutions, so that a program's ``if __name__ == "__main__":`` block (reading stdin, a demo)
    stays out of the way."""
    check = f"\n\ncheck({t.entry_point})\n" if t.entry_point else "\n"
    lines, first = io.StringIO(program, newline="").readlines(), _first_lines(program)  # split where Python counts lines
    head, body = "".join(lines[:first]), "".join(lines[first:])
    if head and not head.endswith(("\n", "\r")):
        head += "\n"
    return f"{head}__name__ = '__solution__'\n{body}\n\n{t.tests}{check}"


def _first_lines(program: str) -> int:
    """Lines of the program's docstring and ``from __future__`` imports: they must come first in a
    module, so ``__name__`` is set after them."""
    try:
        nodes = ast.parse(program).body
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return 0
    end = 0
    for i, node in enumerate(nodes):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        if not (docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__")):
            break
        end = node.end_lineno
    return end


def failure(r: RunResult) -> str:
    """Why a sandbox run did not pass."""
    if r.timed_out:
        return "timeout"
    if r.output_exceeded:
        return "output limit exceeded"
    if r.returncode == -signal.SIGXCPU:
        return "cpu time limit"
    last = next((line.strip() for line in reversed(r.stderr.splitlines()) if line.strip()), "")
    m = _EXCEPTION.match(last)
    if m and m.group(1) != "SystemExit":
        name = m.group(1).rsplit(".", 1)[-1]
        return "syntax error" if name in ("SyntaxError", "IndentationError", "TabError") else name
    if r.returncode < 0:
        return f"killed by signal {-r.returncode}"
    return f"exit status {r.returncode}" if r.returncode else "exited early"


def judge(
    completions: list[str], tests: list[Tests], *, limits: Limits, extract: str = "last_block", prefilled: list[bool] | None = None
) -> list[Verdict]:
    """Each completion's verdict on the tests beside it; all runs of the batch in parallel.

    `prefilled[i]`: completion i's prompt opened ``<think>``. A program may write up to twice the
    largest expected output of the batch when that is more than ``limits.output_kb``."""
    if extract not in EXTRACT:
        raise RewardError(f"code_tests: extract must be one of {', '.join(EXTRACT)}; got {extract!r}")
    # One sandbox job per `tests` sample and per stdin/stdout case; `owner[j]` is job j's sample.
    jobs: list[tuple[str, str]] = []
    owner: list[int] = []
    expected: list[str | None] = []
    job_limits: list[Limits] = []
    totals = [0] * len(completions)
    reasons: list[str | None] = [None] * len(completions)
    prefilled = prefilled or [False] * len(completions)
    for i, (completion, t) in enumerate(zip(completions, tests, strict=True)):
        program = program_of(completion, t, extract, prefilled[i])
        cases = [] if t.tests or not t.test_cases else t.cases(i)
        totals[i] = 1 if t.tests else len(cases)
        if not totals[i]:
            continue
        if not program.strip():
            reasons[i] = "no program"
        elif not compiles(program):
            reasons[i] = "syntax error" if looks_like_code(program) else "no program"
        elif t.tests:
            jobs.append((assemble(program, t), ""))
            owner.append(i)
            expected.append(None)
            job_limits.append(_own_limits(t, limits))
        else:
            for stdin, stdout in cases:
                jobs.append((program, stdin))
                owner.append(i)
                expected.append(stdout)
                job_limits.append(_own_limits(t, limits))

    # Judges size the output bound to the expected output; a program may write twice that.
    needed = max((len(e.encode()) for e in expected if e), default=0) * 2 // 1024 + 1
    job_limits = [replace(lim, output_kb=max(lim.output_kb, needed)) for lim in job_limits]
    results = run_many(jobs, job_limits)
    checked = _check(jobs, owner, expected, results, tests, replace(limits, output_kb=max(limits.output_kb, needed)))
    passed = [0] * len(completions)
    for j, (i, want, r) in enumerate(zip(owner, expected, results)):
        if want is None:
            ok = r.ok
            why = None if ok else failure(r)
        elif r.timed_out or r.output_exceeded or r.returncode != 0:
            ok, why = False, failure(r)
        elif j in checked:
            ok, why = checked[j]
        else:
            ok = normalise_output(r.stdout) == normalise_output(want)
            why = None if ok else "wrong answer"
        passed[i] += ok
        reasons[i] = reasons[i] or why
    return [Verdict(p, n, reason) for p, n, reason in zip(passed, totals, reasons)]


def _own_limits(t: Tests, limits: Limits) -> Limits:
    """`limits` with the problem's own time and memory limits, where it gives them."""
    if t.time_limit is not None:  # CPU time, as judges count it; the wall clock only stops a stalled run
        limits = replace(limits, cpu_s=float(t.time_limit), wall_s=2 * float(t.time_limit) + 1)
    if t.memory_limit is not None:
        limits = replace(limits, memory_mb=int(t.memory_limit))
    return limits


_CHECKER_RUN = """import runpy, sys
for _name, _text in (("input.txt", {input!r}), ("correct_output.txt", {expected!r}), ("solution_output.txt", {output!r}), ("checker.py", {checker!r})):
    with open(_name, "w") as _f:
        _f.write(_text)
sys.argv = ["checker.py", "input.txt", "correct_output.txt", "solution_output.txt"]
try:
    runpy.run_path("checker.py", run_name="__main__")
except SystemExit as _exit:
    if _exit.code not in (0, None):
        raise
"""


def _check(jobs, owner, expected, results, tests: list[Tests], limits: Limits) -> dict[int, tuple[bool, str | None]]:
    """Verdicts of the checkers, by job, for the stdin/stdout runs of problems with a checker that
    exited with status 0 (the others are judged without one)."""
    todo = [j for j, (i, want, r) in enumerate(zip(owner, expected, results))
            if want is not None and tests[owner[j]].checker and not (r.timed_out or r.output_exceeded or r.returncode)
            and normalise_output(r.stdout) != normalise_output(want)]
    runs = [(_CHECKER_RUN.format(input=jobs[j][1], expected=expected[j], output=results[j].stdout, checker=tests[owner[j]].checker), "") for j in todo]
    verdicts = {}
    for j, r in zip(todo, run_many(runs, limits)):
        if not r.ok and not failure(r).startswith(("exit status", "exited early")):
            verdicts[j] = (False, "checker error")  # the checker crashed or ran out of its limits
            continue
        first = r.stdout.split()[0] if r.stdout.split() else ""
        try:
            accepted = float(first) >= 1
        except ValueError:
            accepted = False
        ok = r.ok and accepted
        verdicts[j] = (ok, None if ok else "wrong answer")
    return verdicts
