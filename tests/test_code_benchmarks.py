"""Code benchmarks: hub-schema rows of MBPP and LiveCodeBench (tests/data) become problems whose
tests, run by the code_tests reward, pass right programs and fail wrong ones; the date window,
the compressed private tests and one-line errors for bad rows."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from r1kit.evaluation.code_benchmarks import (
    PROBLEM_KEYS,
    livecodebench_problems,
    load_livecodebench_rows,
    load_mbpp_rows,
    mbpp_problems,
)
from r1kit.evaluation.benchmarks import load_benchmark
from r1kit.data import read_jsonl
from r1kit.errors import EvalError
from r1kit.rewards.code import code_tests

DATA = Path(__file__).parent / "data"
MBPP_ROWS = read_jsonl(DATA / "mbpp_sanitized.jsonl")
LCB_ROWS = read_jsonl(DATA / "livecodebench.jsonl")

# Programs for the LiveCodeBench fixture rows, by question_id: right ones, then wrong ones.
RIGHT = {
    "abc999_a": "n = int(input())\nprint(2 * sum(map(int, input().split())))\n",
    "1999_A": "for _ in range(int(input())):\n    print(input()[::-1])\n",
    "9001": (
        "from typing import List\n\nclass Solution:\n"
        "    def topK(self, nums: List[int], k: int) -> List[int]:\n        return sorted(nums, reverse=True)[:k]\n"
    ),
    "9002": (
        "class Solution:\n    def longestVowelRun(self, s: str) -> int:\n        best = run = 0\n"
        "        for ch in s:\n            run = run + 1 if ch in 'aeiou' else 0\n            best = max(best, run)\n"
        "        return best\n"
    ),
}
WRONG = {
    "abc999_a": "n = int(input())\nprint(sum(map(int, input().split())))\n",
    "1999_A": "for _ in range(int(input())):\n    print(input())\n",
    "9001": RIGHT["9001"].replace("reverse=True", "reverse=False"),
    "9002": RIGHT["9002"].replace("max(best, run)", "max(best, run - 1)"),
}


def fenced(program: str) -> str:
    return f"Here it is:\n```python\n{program}```\n"


def grade(problems: list[dict], programs: list[str]) -> list[float | None]:
    """code_tests over one program per problem, the columns as the evaluator passes them."""
    return code_tests(
        [fenced(p) for p in programs],
        tests=[p["tests"] for p in problems],
        entry_point=[p["entry_point"] for p in problems],
        prefix=[p["prefix"] for p in problems],
        test_cases=[p["test_cases"] for p in problems],
        timeout=5.0,
    )


def compress(cases: list[dict]) -> str:
    """LiveCodeBench's encoding of large private tests: base64 of zlib of the pickled JSON text."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def by_id(problems: list[dict]) -> dict[str, dict]:
    return {p["id"]: p for p in problems}


# ---- MBPP ---------------------------------------------------------------------------------------


def test_mbpp_rows_become_problems_with_the_asserts_in_prompt_and_tests():
    digits, hypot = mbpp_problems(MBPP_ROWS)
    assert all(tuple(p) == PROBLEM_KEYS for p in (digits, hypot))
    assert digits["id"] == "901" and digits["groups"] == {} and digits["date"] is None
    assert digits["test_cases"] is None and digits["entry_point"] is None
    assert digits["problem"].startswith("Write a function to find the product of the digits")
    assert "Your code should pass these tests:\nassert digit_product(234) == 24\n" in digits["problem"]
    assert hypot["tests"].splitlines() == ["import math", *MBPP_ROWS[1]["test_list"]]
    assert "import math" not in hypot["problem"]


def test_mbpp_reference_code_passes_and_wrong_code_fails():
    digits, hypot = mbpp_problems(MBPP_ROWS)
    programs = [
        MBPP_ROWS[0]["code"] + "\n",
        MBPP_ROWS[1]["code"] + "\n",
        "def hypotenuse(a, b):\n    return (a * a + b * b) ** 0.5\n",  # needs the tests' own `import math`
        "def digit_product(n):\n    return sum(int(d) for d in str(n))\n",
        "def product_of_digits(n):\n    return 0\n",  # not the name the asserts call
    ]
    assert grade([digits, hypot, hypot, digits, digits], programs) == [1.0, 1.0, 1.0, 0.0, 0.0]


# ---- LiveCodeBench ------------------------------------------------------------------------------


def test_stdin_problem_has_its_public_then_private_cases():
    problem = by_id(livecodebench_problems(LCB_ROWS))["abc999_a"]
    assert tuple(problem) == PROBLEM_KEYS and problem["tests"] is None and problem["entry_point"] is None
    assert problem["test_cases"] == [
        {"input": "3\n1 2 3\n", "output": "12\n"},
        {"input": "1\n100\n", "output": "200\n"},
        {"input": "4\n5 5 5 6\n", "output": "42\n"},
    ]
    assert problem["date"] == "2024-08-01"
    assert problem["groups"] == {"difficulty": "easy", "platform": "atcoder"}
    assert problem["problem"].startswith("You are given N integers") and "stdin" in problem["problem"]
    assert "```python\n" not in problem["problem"]


def test_functional_problem_shows_the_starter_code_and_asks_for_imports():
    problem = by_id(livecodebench_problems(LCB_ROWS))["9001"]
    assert problem["test_cases"] is None and problem["date"] == "2025-01-31"
    assert problem["groups"] == {"difficulty": "medium", "platform": "leetcode"}
    assert "```python\nclass Solution:\n    def topK(self, nums: List[int], k: int) -> List[int]:\n```" in problem["problem"]
    assert "imports" in problem["problem"]


def test_compressed_private_cases_read_like_plain_json():
    row = LCB_ROWS[1]
    assert not row["private_test_cases"].startswith("[")  # the fixture holds the compressed form
    cases = [
        {"input": "[-1, -1, -2]\n3", "output": "[-1, -1, -2]", "testtype": "functional"},
        {"input": "[7]\n1", "output": "[7]", "testtype": "functional"},
        {"input": "[2, 9, 9, 4]\n3", "output": "[9, 9, 4]", "testtype": "functional"},
    ]
    plain = {**row, "private_test_cases": json.dumps(cases)}
    rebuilt = {**row, "private_test_cases": compress(cases)}
    assert livecodebench_problems([row]) == livecodebench_problems([plain]) == livecodebench_problems([rebuilt])


def test_livecodebench_right_programs_pass_and_wrong_ones_fail():
    problems = livecodebench_problems(LCB_ROWS)
    ids = [p["id"] for p in problems]
    tuple_answer = RIGHT["9001"].replace("return sorted(nums, reverse=True)[:k]", "return tuple(sorted(nums)[::-1][:k])")
    assert grade(problems, [RIGHT[i] for i in ids]) == [1.0] * 4
    assert grade(problems, [WRONG[i] for i in ids]) == [0.0] * 4
    assert grade([by_id(problems)["9001"]], [tuple_answer]) == [1.0]  # a tuple counts as a list


@pytest.fixture
def lcb_offline(monkeypatch):
    """`livecodebench` served from the fixture rows instead of the hub."""
    from r1kit.evaluation import code_benchmarks

    monkeypatch.setattr(code_benchmarks, "load_livecodebench_rows", lambda: LCB_ROWS)


def test_date_window_is_inclusive_and_either_bound_may_be_open(lcb_offline):
    def window(since, until):
        return [p.id for p in load_benchmark("livecodebench", since=since, until=until).problems]

    # Fixture contest days: abc999_a 2024-08-01, 9001 2025-01-31, 1999_A 2024-07-31, 9002 2025-02-01.
    assert window("2024-08-01", "2025-01-31") == ["abc999_a", "9001"]
    assert window(None, "2024-08-01") == ["abc999_a", "1999_A"]
    assert window("2025-02-01", None) == ["9002"]
    assert window(None, None) == ["abc999_a", "9001", "1999_A", "9002"]
    with pytest.raises(EvalError, match=r"livecodebench: no problems dated 2025-02-02 to \.\.\. to evaluate"):
        window("2025-02-02", None)
    assert load_benchmark("livecodebench", since="2024-08-01").config["dates"] == ["2024-08-01", None]


@pytest.mark.parametrize("bound", ["2024-8-1", "20240801", "2024-02-30", "August 2024", "2024-08-01T00:00:00"])
def test_bad_date_bound_names_the_value_and_the_format(bound, lcb_offline):
    with pytest.raises(EvalError, match=rf"since: '{bound}' is not a date; write YYYY-MM-DD"):
        load_benchmark("livecodebench", since=bound)
    with pytest.raises(EvalError, match="until"):
        load_benchmark("livecodebench", until=bound)


def test_a_window_needs_dated_problems():
    with pytest.raises(EvalError, match="humaneval: row 1 has no date; since/until need a date field on every problem"):
        load_benchmark("humaneval", since="2024-01-01")


# ---- bad rows -----------------------------------------------------------------------------------


def without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


@pytest.mark.parametrize(
    "convert, row, message",
    [
        (mbpp_problems, without(MBPP_ROWS[0], "test_list"), "mbpp: row 1 (task_id 901) has no field 'test_list'"),
        (mbpp_problems, without(MBPP_ROWS[0], "task_id"), "mbpp: row 1 has no field 'task_id'"),
        (
            livecodebench_problems,
            without(LCB_ROWS[0], "contest_date"),
            "livecodebench: row 1 (question_id 'abc999_a') has no field 'contest_date'",
        ),
        (
            livecodebench_problems,
            {**LCB_ROWS[0], "contest_date": "08/01/2024"},
            "livecodebench: row 1 (question_id 'abc999_a') contest_date: '08/01/2024' is not a date; write YYYY-MM-DD",
        ),
        (
            livecodebench_problems,
            {**LCB_ROWS[1], "metadata": "{}"},
            "livecodebench: row 1 (question_id '9001') is functional but its metadata has no func_name",
        ),
        (
            livecodebench_problems,
            {**LCB_ROWS[0], "private_test_cases": LCB_ROWS[1]["private_test_cases"]},
            "row 1 (question_id 'abc999_a') has test types ['functional', 'stdin']; expected one of stdin, functional",
        ),
        (
            livecodebench_problems,
            {**LCB_ROWS[0], "private_test_cases": "not-base64!"},
            "row 1 (question_id 'abc999_a') private_test_cases is neither JSON text nor base64 of zlib of pickled JSON",
        ),
    ],
)
def test_bad_rows_are_one_line_errors_naming_benchmark_row_and_field(convert, row, message):
    with pytest.raises(EvalError) as err:
        convert([row])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_pickle_that_names_a_function_is_refused():
    blob = base64.b64encode(zlib.compress(pickle.dumps(print))).decode()
    with pytest.raises(EvalError, match="refusing to load builtins.print"):
        livecodebench_problems([{**LCB_ROWS[0], "private_test_cases": blob}])


def test_unknown_version_is_refused_before_any_download():
    with pytest.raises(EvalError, match="unknown version 'release_v9'; use one of release_v1, .* release_latest"):
        load_livecodebench_rows("release_v9")


# ---- the hub ------------------------------------------------------------------------------------


@pytest.mark.network
def test_mbpp_from_the_hub_passes_its_own_reference_code():
    rows = load_mbpp_rows()
    assert len(rows) == 257  # the sanitized test split
    problems = mbpp_problems(rows[:8])
    assert grade(problems, [row["code"] + "\n" for row in rows[:8]]) == [1.0] * 8


@pytest.mark.network
def test_livecodebench_release_v5_from_the_hub():
    rows = load_livecodebench_rows("release_v5")
    assert len(rows) == 880
    problems = [p for p in livecodebench_problems(rows) if "2024-08-01" <= p["date"] <= "2025-01-31"]
    assert len(problems) == 279  # the window the DeepCoder report evaluates on
    assert all("2024-08-01" <= p["date"] <= "2025-01-31" for p in problems)
    stdin = [p for p in problems if p["test_cases"]]
    functional = [p for p in problems if p["tests"]]
    assert stdin and functional and len(stdin) + len(functional) == len(problems)
    for p in functional:
        compile(p["tests"], p["id"], "exec")
