"""The `eval` stage: evaluate the model the previous stage produced, with the DeepSeek-R1 protocol.

    - name: eval
      kind: eval
      benchmarks: [aime24, math500, task:addition, data/my_bench.jsonl]
      samples: 16                     # k per problem; the paper uses up to 64 (AIME)
      max_tokens: 32768
      template: r1_zero               # as the grpo stage's default, so a trained model sees its prompt

Each benchmark is evaluated by `r1kit.evaluate.evaluate` (the code behind ``r1kit eval``) into
``<stage>/<benchmark>/`` (settings.json, samples.jsonl, summary.json); an interrupted stage
resumes problem by problem. ``<stage>/results.md`` holds one markdown table of all benchmarks,
and the stage's metrics carry ``<benchmark>/pass@1``, ``cons@k`` and ``pass@k`` for the run
report. The model is loaded once, on the first benchmark that has problems left. The stage hands
on no model: the next stage starts from the model this one evaluated.

Not here: metrics and benchmark definitions (r1kit.evaluate); evaluation spread over several
processes (the non-main processes of a distributed run do nothing).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from r1kit import evaluate as ev
from r1kit.config import StageConfig
from r1kit.errors import RecipeError
from r1kit.stages.base import StageContext, StageKind, StageResult

log = logging.getLogger("r1kit")
_D = ev.Settings()


@dataclass(kw_only=True)
class EvalStage(StageConfig):
    benchmarks: list[str]
    """Built-in names (aime24, aime25, math500, amc23, gsm8k), task:NAME, or .jsonl/.json/.parquet files."""
    samples: int = _D.samples
    """k: samples per problem."""
    temperature: float = _D.temperature
    """Sampling temperature (R1: 0.6)."""
    top_p: float = _D.top_p
    """Nucleus sampling (R1: 0.95)."""
    max_tokens: int = _D.max_tokens
    """Most new tokens per sample (R1: 32768)."""
    template: str = _D.template
    """Prompt template: r1_zero, chat, plain, or a string containing {prompt}."""
    think_prefill: bool = _D.think_prefill
    """Start the model's turn with '<think>\\n'."""
    answer_fallback: str = _D.answer_fallback
    """none (R1: the answer is the <answer> block or the last \\boxed{}), or last_number: a
    completion without either answers with its last number."""
    backend: Literal["auto", "vllm", "transformers"] = "auto"
    """Sampling backend; auto takes vLLM when it is installed."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the backend: vllm.LLM's (gpu_memory_utilization, ...) or batch_size."""
    limit: int | None = None
    """Evaluate only the first `limit` problems of each benchmark."""
    id_field: str | None = None
    """Field of problem ids in benchmark files (default: id)."""
    problem_field: str | None = None
    """Field of the problem text (default: problem)."""
    answer_field: str | None = None
    """Field of the reference answer (default: answer)."""
    task: dict[str, Any] = field(default_factory=dict)
    """Arguments of task:NAME benchmarks (see r1kit.tasks)."""


def settings(stage: EvalStage, seed: int) -> ev.Settings:
    fields = ("samples", "temperature", "top_p", "max_tokens", "template", "think_prefill", "answer_fallback")
    return ev.Settings(seed=seed, **{f: getattr(stage, f) for f in fields})


def check(stage: EvalStage) -> None:
    try:
        ev.check_settings(settings(stage, 0))
    except ev.EvalError as exc:
        raise RecipeError(f"{stage.name}: {exc}") from None
    if not stage.benchmarks:
        raise RecipeError(f"{stage.name}.benchmarks: list at least one benchmark")
    names = []
    for i, source in enumerate(stage.benchmarks):
        try:
            names.append(ev.benchmark_name(source))
        except ev.EvalError as exc:
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: {exc}") from None
        if names.count(names[-1]) > 1:
            raise RecipeError(f"{stage.name}.benchmarks[{i}]: a second benchmark named {names[-1]!r} (each gets the folder <stage>/<name>)")


def run(ctx: StageContext) -> StageResult:
    from r1kit.sampling import load_sampler

    stage = ctx.stage
    if not ctx.is_main:
        return StageResult()
    sampler = functools.cache(lambda: load_sampler(ctx.model, stage.backend, **stage.backend_options))
    summaries, metrics = [], {}
    for source in stage.benchmarks:
        bench = ev.load_benchmark(
            source,
            id_field=stage.id_field,
            problem_field=stage.problem_field,
            answer_field=stage.answer_field,
            limit=stage.limit,
            task_args=stage.task,
            seed=ctx.recipe.seed,
        )
        summary = ev.evaluate(bench, ctx.dir / bench.name, settings(stage, ctx.recipe.seed), model=ctx.model, sampler=sampler)
        summaries.append(summary)
        k = stage.samples
        for key in ("pass@1", f"cons@{k}", f"pass@{k}", "mean_tokens", "truncated"):
            metrics[f"{bench.name}/{key}"] = summary[key]
    text = ev.table(summaries, [stage.name] * len(summaries))
    (ctx.dir / "results.md").write_text(f"# {stage.name}: {ctx.model}\n\n{text}")
    log.info("%s results:\n%s", stage.name, text)
    return StageResult(metrics=metrics)


STAGE = StageKind(config=EvalStage, run=run, check=check, distributed=False)
