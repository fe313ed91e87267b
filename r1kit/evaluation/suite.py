"""Suites: several benchmarks evaluated in one command, written as one table beside published
figures.

    r1kit eval --suite r1 --model runs/r1/rl/model --output evals/r1
    r1kit eval --suite my_suite.yaml --model M --output evals/mine --data gpqa_diamond=gpqa.jsonl

A suite is a YAML file (the built-in ``r1`` is r1kit/evaluation/suites/r1.yaml, the DeepSeek-R1 paper's
table: AIME 2024 with 64 samples and cons@64, MATH-500, GPQA Diamond, LiveCodeBench in the
paper's date window, Codeforces with its rating)::

    name: my_suite
    protocol: {temperature: 0.6, top_p: 0.95, max_tokens: 32768}    # any r1kit.evaluation.evaluate.Protocol field
    benchmarks:
      - {benchmark: aime24, samples: 64, report: [pass@1, cons@64]}
      - {benchmark: my_set.jsonl, samples: 4, report: [pass@1]}
    published:                                # optional: figures to print beside, never measured here
      source: "where they come from"
      models: {Some-Model: {aime24 pass@1: 79.8}}

Each benchmark is evaluated by r1kit.evaluation.evaluate into ``OUTPUT/<name>/`` (resumable, as a single
evaluation is); protocol flags given on the command line override the suite's for all of them;
``--data NAME=FILE`` reads a built-in benchmark from a local copy in its hub schema. At the end
``OUTPUT/suite.json`` and ``OUTPUT/suite.md`` hold the table (both in its units): a row for the measured model, then a
row per published model marked "published". Rates are in percent; a rating is a rating.

The model is loaded once, on the first benchmark with problems left to sample. Not here: the
benchmarks' own rules (r1kit.evaluation.benchmarks, r1kit.evaluation.evaluate).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from r1kit.errors import EvalError, RecipeError

BUILT_IN = Path(__file__).with_name("suites")
NOT_RATES = ("rating", "percentile", "mean_tokens")
"""Figures printed as they are; every other figure of a summary is a rate, printed in percent."""


@dataclass
class Entry:
    benchmark: str
    """A benchmark as `r1kit eval --benchmark` takes it."""
    samples: int = 16
    """k: samples per problem."""
    report: list[str] = field(default_factory=lambda: ["pass@1"])
    """The summary figures that make the table's columns (pass@1, cons@64, rating, ...)."""
    since: str | None = None
    """Keep problems dated on or after this day, YYYY-MM-DD."""
    until: str | None = None
    """Keep problems dated on or before this day, YYYY-MM-DD."""
    data_file: str | None = None
    """Read this built-in benchmark from a local copy in its hub schema."""
    task: dict = field(default_factory=dict)
    """Arguments of a ``task:NAME`` benchmark (r1kit.offline.tasks), as ``--task-arg KEY=VALUE`` gives them."""


@dataclass
class Published:
    source: str
    """Where the figures come from (paper and table)."""
    models: dict[str, dict[str, float]] = field(default_factory=dict)
    """Model name -> {"<benchmark> <figure>": value}, rates in percent."""


@dataclass
class Suite:
    name: str
    """The suite's name."""
    benchmarks: list[Entry]
    """The benchmarks, in the table's order."""
    protocol: dict = field(default_factory=dict)
    """r1kit.evaluation.evaluate.Protocol fields that differ from its defaults."""
    published: Published | None = None
    """Figures from elsewhere to print beside the measured ones."""


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, or a suite file; a bad file is a one-line EvalError naming it."""
    from r1kit.config import from_dict, parse_yaml
    from r1kit.evaluation.evaluate import Protocol

    path = BUILT_IN / f"{name_or_path}.yaml" if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")) else Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in BUILT_IN.glob("*.yaml")))
        raise EvalError(f"{name_or_path}: no such suite; use a built-in one ({known}) or a .yaml file")
    try:
        raw = parse_yaml(path.read_text())
        if not isinstance(raw, dict):
            raise RecipeError("a suite is a mapping with name, protocol and benchmarks")
        suite = from_dict(Suite, raw, "")  # keys as `benchmarks[0].samples`, after the file's name: one form for every error
        from_dict(Protocol, suite.protocol, "protocol")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise EvalError(f"{path}: not valid YAML{f' at line {mark.line + 1}' if mark else ''}: {getattr(exc, 'problem', exc)}") from None
    except RecipeError as exc:
        raise EvalError(f"{path}: {exc}") from None
    names = [label(e) for e in suite.benchmarks]
    if not names or len(set(names)) != len(names):
        raise EvalError(f"{path}: benchmarks must list each benchmark once (by its name: {', '.join(names)}), and at least one")
    for i, e in enumerate(suite.benchmarks):
        if e.samples < 1:
            raise EvalError(f"{path}: benchmarks[{i}].samples must be at least 1, got {e.samples}")
        figures = figures_of(e.samples)
        odd = [f for f in e.report if f not in figures]
        if odd or not e.report:
            raise EvalError(f"{path}: benchmarks[{i}].report: {odd[0] if odd else 'nothing'!r} is not a figure; at k={e.samples}: {', '.join(figures)}")
        if e.task and not e.benchmark.startswith("task:"):
            raise EvalError(f"{path}: benchmarks[{i}].task: arguments of a task:NAME benchmark; {e.benchmark} is not one")
        if e.task:
            from r1kit.offline.tasks import arguments

            try:
                arguments(e.benchmark.removeprefix("task:"), e.task)
            except ValueError as exc:  # RecipeError and DataError among them
                raise EvalError(f"{path}: benchmarks[{i}].task: {exc}") from None
        never = next((why for f in e.report if (why := uncomputable(e.benchmark, f))), None)
        if never:
            raise EvalError(f"{path}: benchmarks[{i}].report: {never}")
    columns = {f"{label(e)} {figure}" for e in suite.benchmarks for figure in e.report}
    for model, figures in (suite.published.models if suite.published else {}).items():
        stray = sorted(set(figures) - columns)
        if stray:
            raise EvalError(f"{path}: published.models.{model}: {stray[0]!r} is no column of the table (columns: {', '.join(sorted(columns))})")
    return suite


def figures_of(k: int) -> list[str]:
    """The summary figures a table may show at k samples (a figure a benchmark lacks prints as -)."""
    ks = sorted({2**e for e in range(k.bit_length()) if 2**e <= k} | {k})
    return [*(f"pass@{j}" for j in ks), f"cons@{k}", "rating", "percentile", "mean_tokens", "truncated", "no_answer"]


def uncomputable(benchmark: str, figure: str) -> str | None:
    """Why a built-in `benchmark` never has `figure`, or None: cons@k is a vote over answers (no
    code benchmark has one), a rating needs problems with ratings (Codeforces). A benchmark
    file's domain is known once it is read: not checked here."""
    from r1kit.evaluation.benchmarks import BENCHMARKS, CHOICE_BENCHMARKS, CODE_BENCHMARKS

    if figure.startswith("cons@") and benchmark in CODE_BENCHMARKS:
        return f"{figure!r}: {benchmark} is a code benchmark, whose samples do not vote; report pass@k"
    if figure in ("rating", "percentile") and (benchmark in BENCHMARKS or benchmark in CHOICE_BENCHMARKS or
                                                benchmark in CODE_BENCHMARKS and benchmark != "codeforces"):
        return f"{figure!r}: {benchmark}'s problems carry no Codeforces ratings; only codeforces has a {figure}"
    return None


def measured(summary: dict, figure: str) -> tuple[object, str]:
    """The value of `figure` in `summary`, and a note when another k stood in: a suite asking for
    cons@64 of a run of 16 samples shows cons@16, saying so."""
    if figure in summary or "@" not in figure:
        return summary.get(figure), ""
    kind, k = figure.split("@")[0], summary.get("samples")
    if k is not None and int(figure.split("@")[1]) > k and f"{kind}@{k}" in summary:
        return summary[f"{kind}@{k}"], f" ({kind}@{k})"
    return None, ""


def label(entry: Entry) -> str:
    """The benchmark's folder name and column prefix."""
    from r1kit.evaluation.benchmarks import benchmark_name

    return benchmark_name(entry.benchmark)


def _cell(figure: str, value, published: bool = False) -> str:
    """A table cell: rates in percent (published ones are already), a rating in whole points."""
    if value is None:
        return "-"
    if figure == "rating":
        return f"{value:.0f}"
    return f"{value:.1f}" if figure in NOT_RATES or published else f"{100 * value:.1f}"


def table(suite: Suite, model: str, summaries: dict[str, dict]) -> tuple[str, dict]:
    """The markdown table and its JSON form: the measured row, then the published ones."""
    columns = [(label(e), figure) for e in suite.benchmarks for figure in e.report]
    heads = [f"{name} {figure}" for name, figure in columns]
    found = {h: measured(summaries[name], figure) for (name, figure), h in zip(columns, heads)}
    values = {h: value for h, (value, _) in found.items()}
    cells = [_cell(f, values[h]) + found[h][1] for (_, f), h in zip(columns, heads)]
    for i, (name, figure) in enumerate(columns):  # a rating at the end of the range is a bound
        if figure in ("rating", "percentile") and summaries[name].get("rating_clipped") and values[heads[i]] is not None:
            low = summaries[name].get("rating", 0) < 2000
            cells[i] = ("<= " if low else ">= ") + cells[i]
    lines = ["| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    lines.append(f"| {model} (measured) | " + " | ".join(cells) + " |")
    published = suite.published.models if suite.published else {}
    for name, figures in published.items():
        row = [_cell(f, figures.get(h), published=True) for (_, f), h in zip(columns, heads)]
        lines.append(f"| {name} (published) | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    from r1kit.evaluation.evaluate import figure_lines, protocol_line

    names = list(dict.fromkeys(n for n, _ in columns))
    text += "\nMeasured with:\n" + "".join(f"- {name}: {protocol_line(summaries[name])}\n" for name in names)
    more = [f"- {name}: {line}\n" for name in names for line in figure_lines(summaries[name])]
    text += "\nBeyond the columns:\n" + "".join(more) if more else ""
    if suite.published:
        text += f"\nPublished rows: {suite.published.source}; not measured here.\n"
    # suite.json in the table's units: rates in percent, as the published figures are.
    as_shown = {h: None if v is None else v if f in NOT_RATES else round(100 * v, 4) for ((_, f), h), v in zip(zip(columns, heads), values.values())}
    keys = ("problems", "limit", "samples", "temperature", "top_p", "max_tokens", "template", "think_prefill", "completions")
    data = {"suite": suite.name, "model": model, "units": "rates in percent; rating and percentile as they are",
            "measured": as_shown, "stand_ins": {h: note.strip(" ()") for h, (_, note) in found.items() if note},
            "protocol": {name: {k: summaries[name].get(k) for k in keys} for name in dict.fromkeys(n for n, _ in columns)},
            "published": dataclasses.asdict(suite.published) if suite.published else None}
    return text, data


def run_suite(suite: Suite, out_dir: str, *, model: str, backend: str, settings_overrides: dict, data: dict[str, str],
              limit: int | None = None, seed: int = 0, choice_seed: int = 0, rating_table: str | None = None, endpoint=None,
              only: list[str] | None = None, completions: str | None = None) -> str:
    """Evaluate every benchmark of `suite` (or those named in `only`) for `model` into `out_dir`;
    write and return the table. `endpoint`: the served model's settings
    (r1kit.sampling.base.Endpoint) with a served backend. `completions`: a folder of saved
    generations to score instead of sampling, a benchmark's in ``<name>.jsonl`` or
    ``<name>/samples.jsonl`` (a suite's own output folder); `model` then only names the table's row."""
    from r1kit.evaluation.benchmarks import load_benchmark
    from r1kit.evaluation.evaluate import Settings, check_settings, evaluate, limits, score_completions
    from r1kit.files import write_atomic

    names = [label(e) for e in suite.benchmarks]
    for given, flag in ((sorted(data), "--data names"), (only or [], "--only names")):
        unknown = [n for n in given if n not in names]
        if unknown:
            raise EvalError(f"{flag} {', '.join(unknown)}, not a benchmark of suite {suite.name} ({', '.join(names)})")
    if only:
        suite = dataclasses.replace(suite, benchmarks=[e for e in suite.benchmarks if label(e) in only])
    saved = {}
    if completions is not None:
        for e in suite.benchmarks:
            found = [p for p in (Path(completions) / f"{label(e)}.jsonl", Path(completions) / label(e) / "samples.jsonl") if p.is_file()]
            if not found:
                raise EvalError(f"--completions {completions}: no {label(e)}.jsonl or {label(e)}/samples.jsonl for benchmark {label(e)}")
            saved[label(e)] = found[0]
    plan = []
    for e in suite.benchmarks:  # every benchmark is read and checked before the first sample
        bench = load_benchmark(e.benchmark, since=e.since, until=e.until, limit=limit, data_file=data.get(label(e), e.data_file),
                               choice_seed=choice_seed, rating_table=rating_table, task_args=e.task)
        settings = Settings(**{**suite.protocol, "samples": e.samples, "seed": seed, **settings_overrides})
        check_settings(settings)
        plan.append((e, bench, settings))
    if saved:
        summaries = {label(e): score_completions(bench, saved[label(e)], Path(out_dir) / label(e), settings.answer_fallback, limits(settings),
                                                 settings.think_prefill, limited=limit is not None)
                     for e, bench, settings in plan}
    else:
        from r1kit.sampling import closing, load_sampler

        with closing(lambda: load_sampler(model, backend, endpoint=endpoint, log_dir=out_dir)) as sampler:  # one model load for the whole suite
            summaries = {label(e): evaluate(bench, Path(out_dir) / label(e), settings, model=model, backend=backend, endpoint=endpoint,
                                            sampler=sampler)
                         for e, bench, settings in plan}
    text, record = table(suite, model, summaries)
    write_atomic(Path(out_dir) / "suite.json", json.dumps(record, indent=2) + "\n")
    write_atomic(Path(out_dir) / "suite.md", text)
    return text
