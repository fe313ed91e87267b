"""r1kit's synthetic tasks: answers right, chains of thought consistent, splits disjoint."""

from __future__ import annotations

import re

import pytest

from r1kit.execution.judge import Tests as UnitTests
from r1kit.execution.judge import judge
from r1kit.execution.sandbox import Limits
from r1kit.offline.tasks import addition, chain, functions, generate, last_digit, mix


def judge_(completions, tests):
    return judge(completions, tests, limits=Limits(wall_s=5.0, cpu_s=5.0))


def _left_to_right(expr: str) -> int:
    value = None
    for token in re.findall(r"\d+|[+*]", expr):
        if token in "+*":
            op = token
        elif value is None:
            value = int(token)
        else:
            value = (value + int(token)) if op == "+" else (value * int(token))
            value %= 10
    return value


def test_last_digit_answers_and_working():
    rows = last_digit(300, terms=4)
    for r in rows:
        expr = r["prompt"].removeprefix("What is the last digit of ").removesuffix("?")
        assert r["answer"] == str(_left_to_right(expr))
        # Parenthesised left to right: Python's own evaluation agrees.
        assert r["answer"] == str(eval(expr) % 10)
        steps = re.search(r"<think> (.*) </think>", r["completion"]).group(1).split(" , ")
        assert len(steps) == 3
        for step in steps:
            left, result = step.split("=")
            assert eval(left) == int(result)
        assert int(steps[-1].split("=")[1]) % 10 == int(r["answer"])
        assert r["completion"].endswith(f"<answer> {r['answer']} </answer>")
    assert {"+", "*"} <= set("".join(r["prompt"] for r in rows))


def test_functions_demonstrations_pass_their_tests_and_the_working_is_right():
    rows = functions(400)
    assert all(v.ok for v in judge_([r["completion"] for r in rows], [UnitTests(tests=r["tests"]) for r in rows]))
    for r in rows[:100]:
        x1, y1, x2, y2 = map(int, re.findall(r"f\((\d+)\) == (\d+)", r["prompt"])[0] + re.findall(r"f\((\d+)\) == (\d+)", r["prompt"])[1])
        assert x2 == x1 + 1 and r["task"] == "code" and r["answer"] is None
        a, b = map(int, re.search(r"return \((\d)\*x\+(\d)\)%10", r["completion"]).groups())
        assert ((a * x1 + b) % 10, (a * x2 + b) % 10) == (y1, y2)
        for step in re.search(r"<think> (.*) </think>", r["completion"]).group(1).split(" , "):
            left, result = step.split("=")
            assert eval(left) == int(result)
        # The tests check f beyond the two values the prompt shows: a program that only
        # returns those fails.
        lookup = f"def f(x): return {{{x1}: {y1}, {x2}: {y2}}}.get(x, 0)"
        assert not judge_([lookup], [UnitTests(tests=r["tests"])])[0].ok
    wrong = [r["completion"].replace("return (", "return 1+(") for r in rows[:20]]  # off by one
    assert not any(v.ok for v in judge_(wrong, [UnitTests(tests=r["tests"]) for r in rows[:20]]))


def test_mix_shuffles_tasks_into_one_table_with_both_verifier_columns():
    rows = mix(last_digit={"n": 30, "terms": 4}, functions={"n": 20, "direct": 0.5}, split="test")
    assert len(rows) == 50 and {r["task"] for r in rows} == {"math", "code"}
    assert all(set(r) == {"id", "prompt", "task", "answer", "tests", "completion", "messages"} for r in rows)
    assert [r["task"] for r in rows[:10]] != ["math"] * 10  # shuffled, not one task after the other
    assert rows == mix(last_digit={"n": 30, "terms": 4}, functions={"n": 20, "direct": 0.5}, split="test")
    assert {r["id"] for r in rows if r["task"] == "code"} == {r["id"] for r in functions(20, split="test", direct=0.5)}
    from r1kit.errors import DataError

    with pytest.raises(DataError, match="task:mix: unknown task 'lastdigit' to mix; tasks: addition, chain, chain_sum, last_digit, multiply, functions"):
        generate("mix", "train", {"lastdigit": {"n": 3}})
    with pytest.raises(DataError, match="task:mix: the arguments of functions are a mapping"):
        generate("mix", "train", {"functions": 3})


def test_splits_are_disjoint_and_deterministic():
    code_train = {r["prompt"] for r in functions(3000, split="train")}
    assert not code_train & {r["prompt"] for r in functions(1000, split="test")}
    for make in (last_digit, chain):
        train = {r["prompt"] for r in make(2000, terms=4, split="train")}
        test = {r["prompt"] for r in make(200, terms=4, split="test")}
        assert len(test) == 200 and not train & test
        assert [r["prompt"] for r in make(50, split="test")] == [r["prompt"] for r in make(50, split="test")]


@pytest.mark.parametrize("make", [last_digit, chain, addition, functions])
def test_direct_share_of_demonstrations(make):
    rows = make(1000, direct=0.4, **({"terms": 4} if make is chain else {}))
    empty = sum(r["completion"].startswith("<think> </think> <answer>") for r in rows)
    assert 340 <= empty <= 460
    # The answer is the same whichever way the demonstration goes.
    if make is not functions:
        assert all(r["completion"].endswith(f"<answer> {r['answer']} </answer>") for r in rows)
    assert not any(r["completion"].startswith("<think> </think>") for r in make(200))


def test_bad_arguments_are_one_line_errors():
    from r1kit.errors import DataError

    with pytest.raises(DataError, match=r"task:last_digit: direct must be between 0 and 1, got 1.5"):
        generate("last_digit", "train", {"direct": 1.5})
    with pytest.raises(DataError, match="unknown task; tasks: addition, chain, chain_sum, last_digit, multiply, functions, guess, mix"):
        generate("countdown", "train", {})
