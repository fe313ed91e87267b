"""The code_tests reward on literal completions: extraction, both test forms, None, and its config."""

from __future__ import annotations

import json

import pytest

from r1kit import reward_registry as rewards
from r1kit.execution.judge import extract_program, normalise_output
from r1kit.rewards.code import code_tests

# A HumanEval-style sample: tests define check(candidate), the entry point names the function.
TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG_ANSWER = "def add(a, b):\n    return a * b\n"


def fenced(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}```"


def score_tests(completions: list[str], **params) -> list[float | None]:
    n = len(completions)
    return code_tests(completions, tests=[TESTS] * n, entry_point=["add"] * n, timeout=2.0, **params)


# ---- extraction -----------------------------------------------------------------------------------


def test_extracts_the_last_python_or_bare_block():
    draft, shell, final = fenced("x = 1\n"), fenced("ls\n", "bash"), fenced("x = 2\n", "")
    assert extract_program(f"Draft:\n{draft}\nShell:\n{shell}\nFinal:\n{final}\nDone.") == "x = 2\n"
    assert extract_program(fenced("a = 1\n", "py") + " then " + fenced("echo\n", "sh")) == "a = 1\n"


def test_unfenced_completion_is_the_program_and_whole_takes_everything():
    assert extract_program(RIGHT) == RIGHT
    text = f"Here:\n{fenced(RIGHT)}"
    assert extract_program(text, "whole") == text


def test_normalise_output_ignores_spacing_but_not_content():
    assert normalise_output("  1   2 \n3\t\n\n") == normalise_output("1 2\n3")
    assert normalise_output("1 2\n3") != normalise_output("1\n2 3")


# ---- the `tests` column ----------------------------------------------------------------------------


def test_tests_column_scores_one_or_zero():
    completions = [
        f"<think>add them</think>\n{fenced(RIGHT)}",
        RIGHT,  # unfenced
        fenced(WRONG_ANSWER),
        fenced("def add(a, b):\n    raise RuntimeError\n"),
        fenced("def add(a, b:\n"),
        fenced(RIGHT + "import sys\nsys.exit(0)\n"),  # leaves before the tests run
        fenced(RIGHT + "import os\nos._exit(0)\n"),
        fenced(RIGHT + "while True:\n    pass\n"),
        fenced(RIGHT + "print('ALL TESTS PASSED')\nraise SystemExit(0)\n"),
        f"{fenced(RIGHT)}\nor maybe\n{fenced(WRONG_ANSWER)}",  # the last block counts
    ]
    assert score_tests(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_extract_whole_runs_the_raw_text():
    assert score_tests([fenced(RIGHT)], extract="whole") == [0.0]  # the fences are not Python
    assert score_tests([RIGHT], extract="whole") == [1.0]


def test_tests_without_entry_point_are_plain_asserts():
    assert code_tests([RIGHT, WRONG_ANSWER], tests=["assert add(2, 3) == 5\n"] * 2) == [1.0, 0.0]


# ---- the `test_cases` column -------------------------------------------------------------------

SUM_CASES = [
    {"input": "1 2\n", "output": "3\n"},
    {"input": "10 20\n", "output": "  30  \n\n"},  # spacing differs from what print gives
    {"input": "2 2\n", "output": "5\n"},  # no correct program passes this one
]
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_test_cases_give_partial_credit_or_all_or_nothing():
    completions = [fenced(SUM), fenced("print(3)\n"), fenced("raise ValueError\n")]
    cases = [SUM_CASES] * 3
    assert code_tests(completions, test_cases=cases, timeout=2.0) == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert code_tests(completions, test_cases=cases, mode="all", timeout=2.0) == [0.0, 0.0, 0.0]
    assert code_tests([SUM], test_cases=[SUM_CASES[:2]], mode="all") == [1.0]


def test_test_cases_as_json_text_and_a_clean_exit():
    ends_with_exit = SUM + "import sys\nsys.exit()\n"  # as contest programs often do
    crashes_after = SUM + "raise SystemExit(1)\n"
    loops_after = SUM + "while True:\n    pass\n"
    text = json.dumps(SUM_CASES[:2])
    scores = code_tests([ends_with_exit, crashes_after, loops_after], test_cases=[text] * 3, timeout=1.0)
    assert scores == [1.0, 0.0, 0.0]


def test_samples_without_tests_are_not_applicable():
    completions = [fenced(RIGHT), fenced(SUM), "no code at all"]
    scores = code_tests(
        completions,
        tests=[TESTS, None, None],
        entry_point=["add", None, None],
        test_cases=[None, SUM_CASES[:1], []],
    )
    assert scores == [1.0, 1.0, None]
    assert code_tests(["anything"], answer=["42"]) == [None]


# ---- configuration ----------------------------------------------------------------------------------


def test_registered_and_configured_from_a_recipe():
    reward = rewards.build("code_tests", {"mode": "all", "timeout": 2, "memory_mb": 512})
    assert reward.params == {"mode": "all", "timeout": 2.0, "memory_mb": 512}
    assert rewards.parameters(reward.fn) == {"extract": "last_block", "mode": "fraction", "timeout": 3.0, "memory_mb": 1024}
    assert reward([fenced(SUM)], test_cases=[SUM_CASES]) == [0.0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "some"}, "mode must be one of fraction, all; got 'some'"),
        ({"extract": "first_block"}, "extract must be one of last_block, whole; got 'first_block'"),
        ({"test_cases": [[{"in": "1", "out": "2"}]]}, "test_cases of sample 0 must be a list of"),
        ({"test_cases": ['{"input": "1"}']}, "test_cases of sample 0 must be a list of"),
    ],
)
def test_bad_configuration_or_data_says_what_is_wrong(kwargs, message):
    with pytest.raises(rewards.RewardError, match=message.replace("(", r"\(")):
        code_tests(["print(1)"], **kwargs)
