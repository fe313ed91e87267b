"""Codeforces: problems from the open-r1/codeforces schema (interactive ones left out, a date
window), judging under each problem's own time limit and with its checker, and the rating
estimate against a synthetic model whose solves follow a known rating."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from r1kit.evaluation import codeforces
from r1kit.evaluation.benchmarks import load_benchmark
from r1kit.errors import EvalError
from r1kit.evaluation.evaluate import score_completions
from r1kit.execution.judge import Tests as UnitTests, judge
from r1kit.execution.sandbox import Limits

DATA = Path(__file__).parent / "data"
CF = str(DATA / "codeforces.jsonl")


def program(source: str) -> str:
    return f"<think>...</think>\n```python\n{source}```\n"


def test_problems_keep_limits_checkers_ratings_and_dates():
    bench = load_benchmark("codeforces", data_file=CF)
    assert [p.id for p in bench.problems] == ["2050/A", "2050/B", "2050/D"]  # 2050/C is interactive
    a, b, d = bench.problems
    assert (a.rating, b.rating, d.rating) == (800, 1200, 1900)
    assert a.tests.time_limit == 1.0 and a.tests.memory_limit == 256.0 and a.tests.checker is None and b.tests.checker
    assert "Time limit per test: 1 seconds" in a.problem and "## Example 1\nInput:\n```\n1 2\n```" in a.problem
    assert [p.id for p in load_benchmark("codeforces", data_file=CF, since="2025-01-01").problems] == ["2050/A", "2050/B"]


def test_time_limit_is_the_problems_own_cpu_time():
    # About 1.5 s of CPU: over a 1 s limit, within a 4 s one; the judge's own 10 s does not apply.
    busy = program("import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end:\n    pass\nprint(3)\n")
    cases = [{"input": "", "output": "3\n"}]
    tight, loose = UnitTests(test_cases=cases, time_limit=1.0), UnitTests(test_cases=cases, time_limit=4.0)
    verdicts = judge([busy, busy], [tight, loose], limits=Limits(wall_s=10, cpu_s=10))
    assert not verdicts[0].ok and verdicts[0].reason in ("cpu time limit", "killed by signal 9")  # RLIMIT_CPU, soft or hard
    assert verdicts[1].ok
    # Waiting is not computing: a run that sleeps past its 1 s of CPU time passes within the wall clock.
    sleepy = program("import time\ntime.sleep(1.2)\nprint(3)\n")
    assert judge([sleepy], [tight], limits=Limits())[0].ok


def test_memory_limit_is_the_problems_own():
    big = program("x = bytearray(200 * 1024 * 1024)\nprint(3)\n")
    cases = [{"input": "", "output": "3\n"}]
    verdicts = judge([big, big], [UnitTests(test_cases=cases, memory_limit=128), UnitTests(test_cases=cases, memory_limit=512)], limits=Limits())
    assert (verdicts[0].ok, verdicts[0].reason) == (False, "MemoryError") and verdicts[1].ok


def test_checker_accepts_any_right_output_and_rejects_wrong_ones():
    divisor = next(p for p in load_benchmark("codeforces", data_file=CF).problems if p.id == "2050/B").tests
    smallest = program("n = int(input())\nd = 2\nwhile n % d:\n    d += 1\nprint(d)\n")
    itself = program("print(int(input()))\n")  # n divides n: right, though not the listed output
    one = program("input()\nprint(1)\n")
    crash = program("print(int(input()) // 0)\n")
    verdicts = judge([smallest, itself, one, crash], [divisor] * 4, limits=Limits())
    assert [v.passed for v in verdicts] == [2, 2, 0, 0]
    assert [v.reason for v in verdicts] == [None, None, "wrong answer", "ZeroDivisionError"]
    # Without the checker the same right output is a wrong answer: the checker decided.
    plain = UnitTests(test_cases=divisor.test_cases)
    assert judge([itself], [plain], limits=Limits())[0].reason == "wrong answer"


@pytest.mark.parametrize("script, reason", [("raise ValueError('broken checker')\n", "checker error"), ("import sys\nsys.exit(1)\n", "wrong answer")])
def test_a_checker_that_fails_is_not_a_pass(script, reason):
    tests = UnitTests(test_cases=[{"input": "4\n", "output": "2\n"}], checker=script)
    verdict = judge([program("print(3)\n")], [tests], limits=Limits())[0]  # 3 is not the listed 2: the checker decides
    assert (verdict.ok, verdict.reason) == (False, reason)


@pytest.mark.parametrize("true_rating", [1100, 1600, 2100])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rating_estimate_recovers_a_known_rating(true_rating, seed):
    # A synthetic model rated `true_rating` samples 8 attempts at each of 400 problems rated 800-3000.
    rng = random.Random(seed)
    ratings = [rng.randrange(800, 3001, 100) for _ in range(400)]
    solved = [sum(rng.random() < codeforces.solve_probability(true_rating, r) for _ in range(8)) / 8 for r in ratings]
    assert abs(codeforces.estimate_rating(ratings, solved) - true_rating) <= 50


def test_rating_estimate_is_clipped_and_said_so():
    assert codeforces.rating_figures([800, 1200], [1.0, 1.0], None) == {"rating": 4000.0, "rating_clipped": True}
    assert codeforces.rating_figures([800, 1200], [0.0, 0.0], None)["rating_clipped"]
    assert codeforces.estimate_rating([1500], [0.5]) == pytest.approx(1500, abs=0.5)  # the problem's rating: a 50% solve


def test_percentile_comes_from_a_given_table(tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps([[1000, 50], [1500, 30], [2000, 15], [2500, 5]]))
    assert codeforces.percentile(1600, codeforces.read_rating_table(str(table))) == 80.0
    table.write_text(json.dumps({"1000": 5}))
    with pytest.raises(EvalError, match=r"table.json: a rating table is a JSON list of \[rating, contestants\] pairs"):
        codeforces.read_rating_table(str(table))


def test_summary_has_pass_rate_rating_and_percentile(tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps([[700, 10], [1000, 60], [1400, 30]]))
    bench = load_benchmark("codeforces", data_file=CF, rating_table=str(table))
    right = {"2050/A": "print(sum(map(int, input().split())))\n", "2050/B": "print(int(input()))\n"}
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": program(right.get(p.id, "print(0)\n"))}) + "\n" for p in bench.problems for _ in range(2)))
    summary = score_completions(bench, gen, tmp_path / "eval")
    assert summary["pass@1"] == pytest.approx(2 / 3)
    expected = codeforces.estimate_rating([800, 1200, 1900], [1.0, 1.0, 0.0])
    assert summary["rating"] == expected and 1200 < expected < 1900 and not summary["rating_clipped"]
    assert summary["percentile"] == codeforces.percentile(expected, codeforces.read_rating_table(str(table)))


def test_bad_rows_are_one_line_errors(tmp_path):
    row = json.loads(Path(CF).read_text().splitlines()[0])
    del row["time_limit"]
    bad = tmp_path / "cf.jsonl"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(EvalError, match=r"codeforces: row 1 \(id .2050/A.\) has no field .time_limit."):
        load_benchmark("codeforces", data_file=str(bad))


@pytest.mark.network
def test_codeforces_loads_from_the_hub():
    bench = load_benchmark("codeforces", limit=5)
    assert bench.domain == "code" and all(p.rating for p in bench.problems)


def test_own_limits_and_ratings_are_checked_and_unrated_problems_left_out(tmp_path):
    rows = [json.loads(line) for line in Path(CF).read_text().splitlines()]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**rows[0], "time_limit": "2 seconds"}) + "\n")
    with pytest.raises(EvalError, match=r"codeforces: row 1 \(id '2050/A'\) time_limit must be a positive number, got '2 seconds'"):
        load_benchmark("codeforces", data_file=str(bad))
    code = tmp_path / "code.jsonl"
    code.write_text(json.dumps({"id": "p", "problem": "x", "test_cases": [{"input": "", "output": "1"}], "memory_limit": -5}) + "\n")
    with pytest.raises(EvalError, match=r"code.jsonl: row 1: memory_limit must be a positive number of MiB, got -5"):
        load_benchmark(str(code))
    with pytest.raises(EvalError, match="cannot read the rating table"):  # before any sampling
        load_benchmark("codeforces", data_file=CF, rating_table=str(tmp_path / "missing.json"))
    unrated = tmp_path / "unrated.jsonl"
    unrated.write_text("".join(json.dumps({**r, "rating": None} if r["id"] == "2050/D" else r) + "\n" for r in rows))
    bench = load_benchmark("codeforces", data_file=str(unrated))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": program("print(0)\n")}) + "\n" for p in bench.problems))
    summary = score_completions(bench, gen, tmp_path / "eval")
    assert summary["problems"] == 3 and summary["rating"] == codeforces.estimate_rating([800, 1200], [0.0, 0.0])
