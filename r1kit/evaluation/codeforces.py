"""Codeforces as a benchmark: problems with their ratings, limits and checkers, and the rating a
model's solves estimate.

    from r1kit.evaluation.codeforces import estimate_rating, problems
    rows = problems(load_rows())                       # open-r1/codeforces, "verifiable", test split
    estimate_rating([800, 1200, 1900], [1.0, 0.5, 0.0])  # about 1200

**The problems** come from ``open-r1/codeforces`` (config ``verifiable``: problems whose official
tests are complete; split ``test``), or a local file in that schema. A problem's prompt is its statement (title, limits, description, input and output
format, examples, note) and the instruction to write a stdin/stdout Python program. It is judged
by r1kit.execution.judge on its ``official_tests`` under its own ``time_limit`` and ``memory_limit``, and
by its ``generated_checker`` where it has one (problems with several right outputs). Problems
that are interactive or read files instead of stdin are left out (logged). Each problem's
``date`` is its contest's start day (UTC), for a since/until window.

**The rating estimate.** Codeforces rates a problem so that a contestant of that rating solves it
with probability 1/2 under the Elo model its rating system uses: a contestant rated R solves a
problem rated r with probability ``1 / (1 + 10 ** ((r - R) / 400))``. Given each problem's rating
and the share of the model's k samples that passed (its pass@1 there; problems not yet rated are
left out), the estimate is the R at
which the expected number of solves equals the observed one: the maximum-likelihood rating of
that logistic model, found by bisection in [0, 4000] (clipped there: a model that solves all or
nothing has no finite estimate). CodeElo (Quan et al., 2025, arXiv:2501.01257) rates a model by
its standings in whole contests instead; the R1 paper's figure (2029 for DeepSeek-R1) comes from
its own set of 10 Div. 2 contests. The three are comparable in scale, not in detail.

**The percentile** of that rating is the share of rated contestants below it, from a table the
user gives (``--rating-table FILE``: JSON ``[[rating, contestants], ...]``, e.g. from Codeforces'
published rating distribution); r1kit ships no such table, so without one it is left out.

Not here: interactive problems, languages other than Python, partial scores.
"""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path

from r1kit.errors import EvalError

log = logging.getLogger("r1kit")

DATASET, SUBSET, SPLIT = "open-r1/codeforces", "verifiable", "test"
FIELDS = ("id", "title", "description", "time_limit", "memory_limit", "official_tests", "contest_start")
INSTRUCTION = (
    "Write a Python program that reads the input from stdin and writes the answer to stdout, "
    "within the time and memory limits. Put the whole program in one ```python block."
)
RANGE = (0.0, 4000.0)


def solve_probability(model: float, problem: float) -> float:
    """Elo: the chance a contestant rated `model` solves a problem rated `problem`."""
    return 1.0 / (1.0 + 10.0 ** ((problem - model) / 400.0))


def estimate_rating(ratings: list[float], solved: list[float]) -> float:
    """The rating at which the expected solves of problems rated `ratings` equal `solved` (each a
    share in [0, 1], e.g. pass@1 over k samples); see the module docstring."""
    if not ratings or len(ratings) != len(solved):
        raise ValueError("estimate_rating needs one solve share per rated problem")
    target = sum(solved)
    low, high = RANGE
    for _ in range(60):  # the expected solves rise with the rating: bisect
        mid = (low + high) / 2
        if sum(solve_probability(mid, r) for r in ratings) < target:
            low = mid
        else:
            high = mid
    return round((low + high) / 2, 1)


def read_rating_table(path: str) -> list[tuple[float, int]]:
    """A rating table: JSON ``[[rating, contestants], ...]``; anything else is an EvalError."""
    try:
        table = json.loads(Path(path).read_text())
    except OSError as exc:
        raise EvalError(f"{path}: cannot read the rating table ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise EvalError(f"{path}: the rating table is not JSON ({exc.msg})") from None
    ok = isinstance(table, list) and table and all(
        isinstance(row, list) and len(row) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row) and row[1] >= 0
        for row in table
    )
    if not ok or not sum(row[1] for row in table):
        raise EvalError(f"{path}: a rating table is a JSON list of [rating, contestants] pairs with some contestants")
    return [(float(r), int(n)) for r, n in table]


def percentile(rating: float, table: list[tuple[float, int]]) -> float:
    """The percentage of the table's contestants rated below `rating`."""
    below = sum(n for r, n in table if r < rating)
    return round(100.0 * below / sum(n for _, n in table), 1)


def _day(start, where: str) -> str:
    if not isinstance(start, (int, float)) or isinstance(start, bool):
        raise EvalError(f"codeforces: {where} contest_start must be a Unix time in seconds, got {start!r}")
    return datetime.datetime.fromtimestamp(start, datetime.timezone.utc).date().isoformat()


def _statement(row: dict) -> str:
    parts = [f"# {row['title']}", f"Time limit per test: {row['time_limit']:g} seconds\nMemory limit per test: {row['memory_limit']:g} megabytes", row["description"].strip()]
    for head, key in (("Input", "input_format"), ("Output", "output_format")):
        if row.get(key):
            parts.append(f"## {head}\n{row[key].strip()}")
    for n, example in enumerate(row.get("examples") or [], 1):
        parts.append(f"## Example {n}\nInput:\n```\n{example['input'].rstrip()}\n```\nOutput:\n```\n{example['output'].rstrip()}\n```")
    if row.get("note"):
        parts.append(f"## Note\n{row['note'].strip()}")
    return "\n\n".join(parts) + "\n\n" + INSTRUCTION


def problems(rows: list[dict]) -> list[dict]:
    """Rows of the open-r1/codeforces schema as code problems (r1kit.evaluation.code_benchmarks' dict form)."""
    from r1kit.evaluation.code_benchmarks import _problem

    out, skipped = [], 0
    for i, row in enumerate(rows, 1):
        where = f"row {i} (id {row['id']!r})" if "id" in row else f"row {i}"
        missing = [k for k in FIELDS if row.get(k) is None]
        if missing:
            raise EvalError(f"codeforces: {where} has no field {missing[0]!r}")
        if row.get("interaction_format") or row.get("input_mode", "stdio") != "stdio":
            skipped += 1
            continue
        for key in ("time_limit", "memory_limit", "rating"):
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise EvalError(f"codeforces: {where} {key} must be a positive number, got {value!r}")
        tests = [{"input": t["input"], "output": t["output"]} for t in row["official_tests"]]
        if not tests:
            raise EvalError(f"codeforces: {where} has no official_tests")
        problem = _problem(str(row["id"]), _statement(row), test_cases=tests, date=_day(row["contest_start"], where))
        problem.update(time_limit=float(row["time_limit"]), memory_limit=float(row["memory_limit"]),
                       checker=row.get("generated_checker") or None, rating=None if row.get("rating") is None else int(row["rating"]))
        out.append(problem)
    if skipped:
        log.info("codeforces: left out %d interactive or file-input problems of %d", skipped, len(rows))
    return out


def load_rows() -> list[dict]:
    """The test split of open-r1/codeforces' verifiable config, from the hub."""
    from r1kit.data import load_source

    return load_source(DATASET, SPLIT, SUBSET).to_list()


def rating_figures(ratings: list[float], solved: list[float], table_path: str | None) -> dict:
    """The summary's ``rating`` (and ``percentile``, given a table) of problems with ratings."""
    rating = estimate_rating(ratings, solved)
    # At either end of the range the estimate is a bound, not a rating: say so.
    out = {"rating": rating, "rating_clipped": not RANGE[0] + 0.1 < rating < RANGE[1] - 0.1}
    if table_path:
        out["percentile"] = percentile(rating, read_rating_table(table_path))
    return out
