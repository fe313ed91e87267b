"""r1kit's synthetic tasks: answers right, chains of thought consistent, splits disjoint."""

from __future__ import annotations

import re

import pytest

from r1kit.tasks import addition, chain, generate, last_digit


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


def test_splits_are_disjoint_and_deterministic():
    for make in (last_digit, chain):
        train = {r["prompt"] for r in make(2000, terms=4, split="train")}
        test = {r["prompt"] for r in make(200, terms=4, split="test")}
        assert len(test) == 200 and not train & test
        assert [r["prompt"] for r in make(50, split="test")] == [r["prompt"] for r in make(50, split="test")]


@pytest.mark.parametrize("make", [last_digit, chain, addition])
def test_direct_share_of_demonstrations(make):
    rows = make(1000, direct=0.4, **({"terms": 4} if make is chain else {}))
    empty = sum(r["completion"].startswith("<think> </think> <answer>") for r in rows)
    assert 340 <= empty <= 460
    # The answer is the same whichever way the demonstration goes.
    assert all(r["completion"].endswith(f"<answer> {r['answer']} </answer>") for r in rows)
    assert not any(r["completion"].startswith("<think> </think>") for r in make(200))


def test_bad_arguments_are_one_line_errors():
    from r1kit.errors import DataError

    with pytest.raises(DataError, match=r"task:last_digit: direct must be between 0 and 1, got 1.5"):
        generate("last_digit", "train", {"direct": 1.5})
    with pytest.raises(DataError, match="unknown task; tasks: addition, chain, last_digit"):
        generate("countdown", "train", {})
