"""Benchmarks for evaluation: the problems of a built-in hub set, an offline task or a local file.

    from r1kit.benchmarks import load_benchmark
    bench = load_benchmark("math500")                 # HuggingFaceH4/MATH-500 (needs the hub)
    bench = load_benchmark("task:last_digit", task_args={"n": 200})   # offline, test split
    bench = load_benchmark("my_set.jsonl", answer_field="solution")

Built-in names are the `BENCHMARKS` table (hub dataset, split and field names). A local
.jsonl / .json / .parquet file has ``id``, ``problem`` and ``answer`` fields (other names by
``id_field`` etc.). Ids must be unique; ``subject`` and ``level`` fields, when present, give the
evaluator its breakdowns. A new benchmark is one row of `BENCHMARKS`.

Loading only: sampling and scoring are r1kit.evaluate's, metrics r1kit.metrics'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from r1kit.errors import EvalError


def gsm8k_answer(solution: str) -> str:
    """GSM8K's reference: the number after the solution's final ``####``."""
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


@dataclass(frozen=True)
class HubBenchmark:
    dataset: str
    split: str
    problem: str
    answer: str
    id: str | None = None
    """Column of problem ids; None: the row number."""
    subset: str | None = None
    answer_from: Callable[[str], str] | None = None
    """Turns the answer column into the reference answer."""


BENCHMARKS = {
    "aime24": HubBenchmark("HuggingFaceH4/aime_2024", "train", "problem", "answer", id="id"),
    "aime25": HubBenchmark("math-ai/aime25", "test", "problem", "answer", id="id"),
    "math500": HubBenchmark("HuggingFaceH4/MATH-500", "test", "problem", "answer", id="unique_id"),
    "amc23": HubBenchmark("math-ai/amc23", "test", "question", "answer", id="id"),
    "gsm8k": HubBenchmark("openai/gsm8k", "test", "question", "answer", subset="main", answer_from=gsm8k_answer),
}
BREAKDOWNS = ("subject", "level")


@dataclass
class Problem:
    id: str
    problem: str
    answer: str
    groups: dict[str, str] = field(default_factory=dict)
    """Values of the breakdown fields (subject, level) the row has."""


@dataclass
class Benchmark:
    name: str
    """Short name: the built-in name, the task name, or the file's stem."""
    source: str
    problems: list[Problem]
    config: dict = field(default_factory=dict)
    """How the problems were read (source, field names, task arguments): a resumed run must match."""


@dataclass(kw_only=True)
class BenchmarkFields:
    """Which rows and fields of a benchmark file are read."""

    limit: int | None = None
    """Evaluate only the first `limit` problems of each benchmark."""
    id_field: str | None = None
    """Field of problem ids in benchmark files (default: id)."""
    problem_field: str | None = None
    """Field of the problem text (default: problem)."""
    answer_field: str | None = None
    """Field of the reference answer (default: answer)."""


def _answer_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():  # some hub copies store 27 as 27.0
        value = int(value)
    return str(value)


def benchmark_name(source: str) -> str:
    """The name `source` goes by in folders and tables; an unknown benchmark is an EvalError."""
    from r1kit.data import is_local

    if source in BENCHMARKS:
        return source
    if source.startswith("task:"):
        return source[5:]
    if is_local(source):
        return Path(source).stem
    raise EvalError(f"unknown benchmark {source!r}; use one of {', '.join(BENCHMARKS)}, task:NAME, or a .jsonl/.json/.parquet file")


def load_benchmark(
    source: str,
    *,
    id_field: str | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    task_args: dict | None = None,
    seed: int = 0,
) -> Benchmark:
    """The problems of `source`: a name of `BENCHMARKS`, ``task:NAME`` or a local file."""
    from r1kit import data

    name, hub = benchmark_name(source), BENCHMARKS.get(source)
    if hub is not None:
        rows = data.load_source(hub.dataset, hub.split, hub.subset).to_list()
        fields = (hub.id, hub.problem, hub.answer)
    elif source.startswith("task:"):
        from r1kit.tasks import generate

        rows = generate(name, "test", {"seed": seed, **(task_args or {})})
        fields = ("id", "prompt", "answer")
    else:
        rows = data.load_source(source).to_list()
        fields = ("id", "problem", "answer")
    id_field, problem_field, answer_field = (given or default for given, default in zip((id_field, problem_field, answer_field), fields))
    rows = rows[:limit] if limit is not None else rows
    problems, seen = [], set()
    for i, row in enumerate(rows):
        for flag, key in (("id", id_field), ("problem", problem_field), ("answer", answer_field)):
            if key is not None and key not in row:
                raise EvalError(
                    f"{source}: row {i + 1} has no field {key!r} (fields: {', '.join(row)}); "
                    f"name the {flag} field with --{flag}-field / {flag}_field"
                )
        pid = str(row[id_field]) if id_field else str(i)
        if pid in seen:
            raise EvalError(f"{source}: id {pid!r} appears twice; ids must be unique")
        seen.add(pid)
        answer = _answer_text(row[answer_field])
        if hub is not None and hub.answer_from is not None:
            answer = hub.answer_from(answer)
        groups = {g: str(row[g]) for g in BREAKDOWNS if row.get(g) is not None}
        problems.append(Problem(pid, str(row[problem_field]), answer, groups))
    if not problems:
        raise EvalError(f"{source}: no problems to evaluate")
    config = {"source": source, "fields": [id_field, problem_field, answer_field], "task_args": task_args or {}}
    return Benchmark(name, source, problems, config)
