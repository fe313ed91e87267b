"""Evaluation with the DeepSeek-R1 protocol: k samples per problem; pass@1, cons@k and pass@k.

    r1kit eval --model runs/demo/rl/model --benchmark aime24 --samples 64 --output evals/aime24
    r1kit eval --benchmark math500 --completions gen.jsonl --output evals/gen   # score given generations
    r1kit eval compare evals/base evals/rl                                      # summaries side by side

    from r1kit.evaluate import Settings, evaluate, load_benchmark
    summary = evaluate(load_benchmark("aime24"), "evals/aime24", Settings(samples=64), model="runs/demo/rl/model")
    summary["pass@1"], summary["cons@64"]

The ``eval`` stage (r1kit.stages.evaluate) runs the same code on a recipe's previous model.

The protocol is the paper's (arXiv:2501.12948, section 3.1): temperature 0.6, top-p 0.95, up to
32,768 new tokens, k samples per problem. The paper uses k from 4 to 64 (64 for AIME); the
default here is 16, a quarter of the cost; pass ``--samples 64`` to match the paper on AIME.

- pass@1: the share of correct samples of each problem, averaged over problems.
- cons@k: majority vote over the k extracted answers of a problem; answers that the verifier
  judges equal (``0.5``, ``\\frac12``, ``1/2``) form one cluster, whose first answer speaks for
  it; samples without an answer do not vote; a tie goes to the cluster that appeared first.
- pass@j (j = 1, 2, 4, ... and k): Chen et al. (2021)'s unbiased estimator 1 - C(n-c, j) / C(n, j).
- mean completion length in tokens, the share of completions cut at ``max_tokens``, the share
  without an answer, and pass@1 by subject and by level when the benchmark has those fields.

A sample is correct when the registered ``math_accuracy`` reward says so (answer extraction and verifier,
so ``025`` equals ``25`` and ``\\frac43`` equals ``4/3``). A problem whose reference answer the
verifier cannot parse is left out of the metrics and counted as ``unscorable``.

Benchmarks: a built-in name (`BENCHMARKS`: hub dataset, split and field names; loading needs
the network), ``task:NAME`` (r1kit.tasks, test split), or a local .jsonl / .json / .parquet file
with ``id``, ``problem`` and ``answer`` fields (other names by ``--id-field`` etc.).

The output folder holds ``settings.json`` (what was asked), ``samples.jsonl`` (one row per
sample: id, sample, completion, answer, correct, tokens, truncated) and ``summary.json``
(written atomically at the end). Each finished problem's samples are appended and synced, so a
killed run resumes: finished problems are kept, a half-written tail is cut off, the rest runs.

Not here: code or multiple-choice benchmarks, LLM judges, proofs. A resumed run samples the
remaining problems with other random streams than an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from r1kit.errors import RecipeError
from r1kit.text import FALLBACKS

log = logging.getLogger("r1kit")


class EvalError(RecipeError):
    """Bad evaluation input; the message is one line for the user."""


# ---------------------------------------------------------------------------------------------
# Benchmarks


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


# ---------------------------------------------------------------------------------------------
# The protocol and its metrics


@dataclass(frozen=True)
class Settings:
    """The sampling protocol; defaults are the DeepSeek-R1 paper's, except k (16, not 64)."""

    samples: int = 16
    """k: samples per problem."""
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 32768
    """Most new tokens per sample."""
    template: str = "r1_zero"
    """Prompt template (r1kit.templates): r1_zero, chat, plain, or a string containing {prompt}."""
    think_prefill: bool = False
    """Start the model's turn with '<think>\\n'."""
    seed: int = 0
    answer_fallback: str = "none"
    """Where the answer is when a completion has no <answer> block or \\boxed{}: none (wrong), or
    last_number (its last number; for models that do not follow the answer format)."""


def check_settings(s: Settings) -> None:
    from r1kit import templates

    if s.samples < 1:
        raise EvalError(f"samples must be at least 1, got {s.samples}")
    if s.temperature < 0 or not 0 < s.top_p <= 1 or s.max_tokens < 1:
        raise EvalError(f"need temperature >= 0, 0 < top_p <= 1 and max_tokens >= 1; got {s.temperature}, {s.top_p}, {s.max_tokens}")
    problem = templates.check(s.template)
    if problem:
        raise EvalError(problem)
    if s.answer_fallback not in FALLBACKS:
        raise EvalError(f"answer_fallback must be one of {', '.join(FALLBACKS)}, got {s.answer_fallback!r}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021), k <= n."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_votes(answer_lists: list[list[str | None]]) -> list[int | None]:
    """For each problem's answers, the index of the answer that wins the vote (None: no answers).

    Distinct answers are taken in order of first appearance; each joins the first earlier
    cluster whose leading answer the verifier judges equal to it, else leads a new one. Every
    round compares the next distinct answer of all problems in one verifier batch.
    """
    verify = math_verifier()

    distinct = [list(dict.fromkeys(a for a in answers if a is not None)) for answers in answer_lists]
    leaders: list[list[int]] = [[] for _ in distinct]
    cluster: list[dict[int, int]] = [{} for _ in distinct]  # distinct answer -> its cluster's leader
    for y in range(max(map(len, distinct), default=0)):
        pairs, keys = [], []
        for i, d in enumerate(distinct):
            if y < len(d):
                pairs += [(d[x], d[y]) for x in leaders[i]]
                keys += [(i, x) for x in leaders[i]]
        joined: dict[int, int] = {}
        # An extracted answer written back as an <answer> block extracts to itself.
        same_as = verify([f"<answer>{b}</answer>" for _, b in pairs], answer=[a for a, _ in pairs]) if pairs else []
        for (i, x), same in zip(keys, (v == 1.0 for v in same_as)):
            if same and i not in joined:  # keys are in leader order: the earliest match wins
                joined[i] = x
        for i, d in enumerate(distinct):
            if y < len(d):
                cluster[i][y] = joined.get(i, y)
                if i not in joined:
                    leaders[i].append(y)
    out: list[int | None] = []
    for answers, d, of in zip(answer_lists, distinct, cluster):
        votes = Counter(of[d.index(a)] for a in answers if a is not None)
        best = min(votes, key=lambda leader: (-votes[leader], leader), default=None)  # ties: first cluster
        out.append(None if best is None else answers.index(d[best]))
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(bench: Benchmark, rows: list[dict], k: int) -> dict[str, Any]:
    """Metrics over `rows` (samples.jsonl rows of every problem of `bench`), k samples each."""
    by_id: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_id[row["id"]].append(row)
    scored = []
    for p in bench.problems:
        samples = sorted(by_id[p.id], key=lambda r: r["sample"])
        if all(r["correct"] is not None for r in samples):
            scored.append((p, samples))
    ks = sorted({2**e for e in range(k.bit_length()) if 2**e <= k} | {k})
    out: dict[str, Any] = {"problems": len(scored), "unscorable": len(bench.problems) - len(scored)}
    per_problem = [sum(r["correct"] for r in s) / len(s) for _, s in scored]
    out["pass@1"] = _mean(per_problem)
    winners = majority_votes([[r["answer"] for r in s[:k]] for _, s in scored])
    out[f"cons@{k}"] = _mean([float(w is not None and s[w]["correct"]) for (_, s), w in zip(scored, winners)])
    for j in ks[1:]:
        out[f"pass@{j}"] = _mean([pass_at_k(len(s), sum(r["correct"] for r in s), j) for _, s in scored])
    all_rows = [r for _, s in scored for r in s]
    out["mean_tokens"] = _mean([r["tokens"] for r in all_rows if r["tokens"] is not None])
    out["truncated"] = _mean([float(r["truncated"]) for r in all_rows if r["truncated"] is not None])
    out["no_answer"] = _mean([float(r["answer"] is None) for r in all_rows])
    breakdown: dict[str, dict] = {}
    for g in BREAKDOWNS:
        groups: dict[str, list[float]] = defaultdict(list)
        for (p, _), value in zip(scored, per_problem):
            if g in p.groups:
                groups[p.groups[g]].append(value)
        if groups:
            breakdown[g] = {v: {"problems": len(x), "pass@1": _mean(x)} for v, x in sorted(groups.items())}
    out["breakdown"] = breakdown
    return out


def math_verifier(fallback: str = "none"):
    """The registered ``math_accuracy`` reward: the evaluator asks the registry, as a recipe does."""
    from r1kit import reward_registry

    return reward_registry.build("math_accuracy", {"fallback": fallback})


def score(problems: list[Problem], completions: list[list[Any]], fallback: str = "none") -> list[dict]:
    """samples.jsonl rows for each problem's completions (objects with text, tokens, truncated)."""
    from r1kit.text import extract_answer

    flat = [(p, j, c) for p, cs in zip(problems, completions) for j, c in enumerate(cs)]
    verdicts = math_verifier(fallback)([c.text for _, _, c in flat], answer=[p.answer for p, _, _ in flat])
    return [
        {"id": p.id, "sample": j, "completion": c.text, "answer": extract_answer(c.text, fallback),
         "correct": None if v is None else v == 1.0, "tokens": c.tokens, "truncated": c.truncated}
        for (p, j, c), v in zip(flat, verdicts)
    ]


# ---------------------------------------------------------------------------------------------
# Output folder: settings, resumable samples, summary


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _claim(out: Path, settings: dict) -> None:
    """Record what this folder evaluates; refuse a folder that holds another evaluation."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "settings.json"
    if path.exists():
        old = json.loads(path.read_text())
        changed = [key for key in sorted(set(old) | set(settings)) if old.get(key) != settings.get(key)]
        if changed:
            raise EvalError(f"{out} holds an evaluation with other settings (changed: {', '.join(changed)}); use another folder")
    _write_atomic(path, json.dumps(settings, indent=2) + "\n")


def read_samples(path: Path, bench: Benchmark, k: int) -> list[dict]:
    """Rows of problems with all k samples in `path`; a partial last line and the rows of an
    unfinished problem are removed from the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    rows = [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines() if line.strip()]
    counts = Counter(r["id"] for r in rows)
    keep = [r for r in rows if counts[r["id"]] == k]
    partial = not data.endswith(b"\n") and len(data) > 0
    if partial or len(keep) != len(rows):
        log.info("%s: dropped %d rows of unfinished problems", path, len(rows) - len(keep) + partial)
        _write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
    ids = {p.id for p in bench.problems}
    return [r for r in keep if r["id"] in ids]


def _finish(out: Path, bench: Benchmark, rows: list[dict], k: int, head: dict) -> dict:
    summary = {"benchmark": bench.name, "source": bench.source, **head, **summarize(bench, rows, k)}
    _write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


SEQUENCES_PER_CALL = 512
"""Samples per generate call: each call's problems are written when it returns."""


def evaluate(
    bench: Benchmark,
    out_dir: str | Path,
    settings: Settings = Settings(),
    *,
    model: str,
    backend: str = "auto",
    sampler: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Sample, score and summarize `bench` for `model` into `out_dir`, resuming what is there.

    `sampler` returns the sampler to use (default: `load_sampler(model, backend)`); it is called
    only when problems are left to generate. Returns the summary (also in summary.json).
    """
    from r1kit import templates
    from r1kit.sampling import SamplingParams

    check_settings(settings)
    out = Path(out_dir)
    head = {"model": model, "completions": None, **dataclasses.asdict(settings)}
    _claim(out, {"benchmark": bench.config, **head})
    path = out / "samples.jsonl"
    rows = read_samples(path, bench, settings.samples)
    done = {r["id"] for r in rows}
    todo = [(i, p) for i, p in enumerate(bench.problems) if p.id not in done]
    if todo:
        if sampler is None:
            from r1kit.sampling import load_sampler

            sampler = lambda: load_sampler(model, backend)  # noqa: E731
        engine = sampler()
        log.info("%s: %d problems to generate (%d done), %s backend", bench.name, len(todo), len(done), engine.backend)
        per_call = max(1, SEQUENCES_PER_CALL // settings.samples)
        with open(path, "a") as f:
            for start in range(0, len(todo), per_call):
                chunk = [p for _, p in todo[start : start + per_call]]
                prompts = [templates.render(settings.template, p.problem, engine.tokenizer, settings.think_prefill) for p in chunk]
                # Seeded by the first problem's position, so a rerun of the same chunk samples the same.
                params = SamplingParams(settings.temperature, settings.top_p, settings.max_tokens, settings.seed + todo[start][0])
                new = score(chunk, engine.generate_full(prompts, settings.samples, params), settings.answer_fallback)
                for p in chunk:
                    f.write("".join(json.dumps(r) + "\n" for r in new if r["id"] == p.id))
                    f.flush()
                    os.fsync(f.fileno())
                rows += new
                log.info("%s: %d/%d problems", bench.name, len(done) + start + len(chunk), len(bench.problems))
    return _finish(out, bench, rows, settings.samples, head)


def score_completions(bench: Benchmark, completions: str | Path, out_dir: str | Path, fallback: str = "none") -> dict[str, Any]:
    """Score existing generations: rows {"id", "completion"} (optionally "tokens", "truncated"),
    several rows per id for several samples. k is the fewest samples any problem has."""
    from r1kit.data import read_jsonl
    from r1kit.sampling import Completion

    path = Path(completions)
    if not path.is_file():
        raise EvalError(f"{path}: no such completions file")
    given: dict[str, list[Completion]] = defaultdict(list)
    for lineno, row in enumerate(read_jsonl(path), 1):
        if "id" not in row or not isinstance(row.get("completion"), str):
            raise EvalError(f"{path}: row {lineno} needs an 'id' and a string 'completion'")
        given[str(row["id"])].append(Completion(row["completion"], row.get("tokens"), row.get("truncated")))
    ids = [p.id for p in bench.problems]
    unknown = sorted(set(given) - set(ids))
    if unknown:
        raise EvalError(f"{path}: {len(unknown)} ids are not in benchmark {bench.name}: {', '.join(unknown[:10])}")
    missing = [i for i in ids if i not in given]
    if missing:
        raise EvalError(
            f"{path}: {len(missing)} of {len(ids)} problems of {bench.name} have no completions: "
            f"{', '.join(missing[:10])} (--limit N evaluates the first N problems only)"
        )
    k = min(len(v) for v in given.values())
    out = Path(out_dir)
    head = {"model": None, "completions": str(path), "samples": k, "answer_fallback": fallback}
    _claim(out, {"benchmark": bench.config, **head})
    rows = score(bench.problems, [given[i] for i in ids], fallback)
    _write_atomic(out / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return _finish(out, bench, rows, k, head)


# ---------------------------------------------------------------------------------------------
# Tables and the command line


def table(summaries: list[dict], labels: list[str] | None = None) -> str:
    """A markdown table of summaries: one row each; rates in percent."""
    labels = labels or [s["model"] or s["completions"] for s in summaries]

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}"

    lines = ["| run | benchmark | problems | k | pass@1 | cons@k | pass@k | mean tokens | truncated % |", "|---|---|" + "---:|" * 7]
    for label, s in zip(labels, summaries):
        k = s["samples"]
        tokens = "-" if s["mean_tokens"] is None else f"{s['mean_tokens']:.0f}"
        cells = [label, s["benchmark"], s["problems"], k, pct(s["pass@1"]), pct(s[f"cons@{k}"]), pct(s[f"pass@{k}"]), tokens, pct(s["truncated"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def add_cli(subparsers) -> None:
    """Register ``r1kit eval`` and ``r1kit eval compare DIR...``."""
    from r1kit.sampling import BACKENDS

    d = Settings()
    ev = subparsers.add_parser(
        "eval",
        usage="r1kit eval --model M --benchmark B --output DIR [options]\n       r1kit eval compare DIR [DIR ...]",
        help="evaluate a model on a benchmark (DeepSeek-R1 protocol)",
        description="Sample k completions per problem and report pass@1, cons@k and pass@k (see r1kit.evaluate).",
    )
    ev.add_argument("--model", help="model folder or hub id")
    ev.add_argument("--benchmark", help=f"{', '.join(BENCHMARKS)}, task:NAME, or a .jsonl/.json/.parquet file")
    ev.add_argument("--output", metavar="DIR")
    ev.add_argument("--samples", type=int, default=d.samples, metavar="K")
    ev.add_argument("--temperature", type=float, default=d.temperature)
    ev.add_argument("--top-p", type=float, default=d.top_p)
    ev.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ev.add_argument("--template", default=d.template, help="r1_zero, chat, plain, or a string containing {prompt}")
    ev.add_argument("--think-prefill", action="store_true", help="start the model's turn with '<think>\\n'")
    ev.add_argument("--backend", choices=BACKENDS, default="auto")
    ev.add_argument("--limit", type=int, help="first N problems only")
    ev.add_argument("--seed", type=int, default=d.seed)
    ev.add_argument("--answer-fallback", choices=FALLBACKS, default=d.answer_fallback, help="last_number: a completion without <answer> or \\boxed{} answers with its last number")
    ev.add_argument("--completions", metavar="GEN.jsonl", help="score these generations instead of sampling a model")
    ev.add_argument("--id-field")
    ev.add_argument("--problem-field")
    ev.add_argument("--answer-field")
    ev.add_argument("--task-arg", action="append", default=[], metavar="KEY=VALUE", help="argument of a task:NAME benchmark")
    ev.set_defaults(handler=_cmd_eval)
    esub = ev.add_subparsers(dest="eval_command", metavar="compare")
    cmp = esub.add_parser("compare", help="side-by-side table of evaluations", description="One row per summary.json; a DIR without one contributes each DIR/*/summary.json.")
    cmp.add_argument("dirs", nargs="+", metavar="DIR")
    cmp.set_defaults(handler=_cmd_compare)


def _cmd_eval(args) -> None:
    from r1kit.config import parse_override

    if not args.benchmark or not args.output or bool(args.model) == bool(args.completions):
        raise EvalError("eval needs --benchmark, --output, and either --model or --completions")
    task_args = {}
    for text in args.task_arg:
        key, value = parse_override(text)
        task_args[".".join(key)] = value
    fields = {"id_field": args.id_field, "problem_field": args.problem_field, "answer_field": args.answer_field}
    bench = load_benchmark(args.benchmark, **fields, limit=args.limit, task_args=task_args, seed=args.seed)
    if args.completions:
        summary = score_completions(bench, args.completions, args.output, args.answer_fallback)
    else:
        fields = ("samples", "temperature", "top_p", "max_tokens", "template", "think_prefill", "seed", "answer_fallback")
        settings = Settings(**{f: getattr(args, f) for f in fields})
        summary = evaluate(bench, args.output, settings, model=args.model, backend=args.backend)
    print(table([summary]), end="")
    print(f"samples and summary: {args.output}")


def _cmd_compare(args) -> None:
    summaries, labels = [], []
    for d in map(Path, args.dirs):
        found = [d / "summary.json"] if (d / "summary.json").is_file() else sorted(d.glob("*/summary.json"))
        if not found:
            raise EvalError(f"{d}: no summary.json here or in its subfolders")
        for path in found:
            summaries.append(json.loads(path.read_text()))
            labels.append(str(path.parent))
    print(table(summaries, labels), end="")
