"""The `rejection` stage: sample N completions per prompt, keep the verified, clean ones.

A stage of a recipe (``r1kit run recipes/r1.yaml`` runs it between the two RL rounds)::

    - name: rejection
      kind: rejection
      data: {source: open-r1/OpenR1-Math-220k, prompt: problem}    # `answer` reaches math_accuracy
      template: chat                     # as the next grpo / eval stage will show prompts
      think_prefill: true
      rewards: [{name: math_accuracy}]   # as in a grpo stage, `when:` routing included
      min_total: 1.0                     # keep a sample when its weighted reward total reaches this
      samples: 16                        # per prompt, at temperature 0.6, top_p 0.95, max_tokens 32768
      max_kept_per_prompt: 4
      filters: {language: en}            # r1kit.filters: truncated, mixed language, code, repetition, duplicates...
      mix: {source: HuggingFaceTB/smoltalk, subset: all, ratio: 0.33}    # non-reasoning conversations

For each prompt the stage samples ``samples`` completions from its input model (the
previous stage's model, or a teacher the stage's ``model`` names) through r1kit.sampling
(``backend``: auto, transformers, vllm, or a served model: endpoint, vllm_server), scores
them with the rewards, which see the same columns as in a grpo stage (the rendered ``prompt`` and
the row's other columns), and passes a sample when its weighted reward total reaches
``min_total``. The passing samples then meet the filters of r1kit.filters, and at most
``max_kept_per_prompt`` of the survivors are kept, in sampling order.

``mode: samples`` (the default) writes SFT rows to ``dataset.jsonl``; a following ``sft`` stage
with ``data.source: <this stage's name>`` trains on them. Every row has ``prompt`` (the text the
model continued, exactly as sampled, template and ``<think>`` prefill included) and
``completion``; with ``template: chat`` it also has ``messages``: the user turn the chat template
renders (the question with R1's guidance) and the assistant turn (prefill + completion), which the
same chat template renders back into the sampled text. So the SFT model learns on what the next
grpo or eval stage with the same template shows it: ``format: auto`` picks ``messages`` for chat
rows and prompt/completion otherwise (a chat wrapper around an ``r1_zero`` prompt would change
what the model sees). A chat template that strips reasoning from assistant turns (DeepSeek-R1's
distilled models do) would drop the chain of thought from ``messages``: train those with
``format: prompt_completion``. Provenance rides along: ``id`` (the prompt's ``id_column``, else
its row number), ``sample``, ``rewards``, ``reward_total``, ``tokens``, ``sampling`` (model,
backend, temperature, top_p, max_tokens, seed) and ``origin``. ``mix`` adds
``ratio`` × (kept samples) conversations from a non-reasoning dataset (R1: ~600k reasoning and
~200k non-reasoning samples), drawn at random with the recipe seed.

``mode: pass_rate_filter`` samples and verifies the same way, but writes the prompt rows
themselves (original columns plus ``pass_rate``) whose pass rate lies strictly between
``min_pass_rate`` and ``max_pass_rate``: with the defaults, the prompts the model always or never
solves, which give GRPO no signal, are dropped. A later grpo stage takes them as ``data.source``.

``stats.json`` holds the pass rate of every prompt, the samples dropped by each filter (the first
one that applies), and the totals; the stage's metrics repeat the totals.

Resume and sharding are r1kit.sampling.jobs': prompts go in chunks of ``chunk_prompts``, one
sampling call each; each finished chunk is one line appended to the journal (flushed and
fsynced), so a killed run loses at most the chunks in flight, and the next run (with the same or
another number of processes) samples only the unfinished ones. A chunk's sampling seed depends
only on the recipe seed and the chunk's first prompt (seed + position × samples), so a resumed or
sharded run samples what an uninterrupted one would (as far as the backend is deterministic). A
journal written with another config, model or seed is refused.

In a distributed run (``--accelerate-config``) every process loads an engine of its own (with
vLLM on GPUs, one per tensor-parallel group: r1kit.sampling.shard_of) and samples its shard of the
chunks into a journal of its own (``journal.jsonl`` for the main process, ``journal.shardN.jsonl``
for shard N). When every process has finished, the main one streams the journals in prompt order
into ``dataset.jsonl`` and ``stats.json`` (through a temporary file and a rename); memory holds
one chunk at a time, however many prompts the stage has.

With ``tools:`` (r1kit.execution.tools) each sample is a rollout that may run code as it reasons; a kept row
holds the whole transcript, tool outputs included, and its ``tool_calls``; what a tool printed
never counts as the sample's answer.

Not here: training on the rows (sft / grpo stages).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

from r1kit import data as data_lib
from r1kit import reward_registry
from r1kit import templates
from r1kit.config import PromptStageConfig, to_dict
from r1kit.errors import RecipeError
from r1kit.files import atomic_file
from r1kit.filters import LOOSEN, REASONS, FilterConfig, filter_group
from r1kit.sampling.base import Completion, EngineConfig, Sampler, SamplingConfig, SamplingParams
from r1kit.sampling.jobs import Chunk, Job, Request
from r1kit.sampling.endpoint import chat_problem
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult, check_prompting
from r1kit.execution.tools import ToolFields

log = logging.getLogger("r1kit")

DATASET, STATS = "dataset.jsonl", "stats.json"
DROPS = ("failed",) + REASONS + ("over_cap",)  # every reason a sample is not kept, in the order applied


@dataclass
class MixConfig:
    source: str | None = None
    """Non-reasoning conversations (rows with messages): hub id, local file or stage name; null: no mixing."""
    split: str = "train"
    """Split of a hub dataset."""
    subset: str | None = None
    """Hub dataset configuration name."""
    messages: str = "messages"
    """Column holding the conversations."""
    ratio: float = 0.33
    """Mixed conversations per kept sample (R1: ~200k non-reasoning for ~600k reasoning)."""


@dataclass(kw_only=True)
class RejectionStage(PromptStageConfig, SamplingConfig, EngineConfig, ToolFields):
    mode: Literal["samples", "pass_rate_filter"] = "samples"
    """samples: write SFT rows of kept samples; pass_rate_filter: write the prompts in the pass-rate band."""
    samples: int = 16
    """Completions sampled per prompt."""
    min_total: float = 1.0
    """A sample passes when its weighted reward total is at least this (1.0: a 0/1 verifier of weight 1 said yes)."""
    max_kept_per_prompt: int | None = 4
    """Cap on samples kept per prompt, so easy prompts do not dominate; null: no cap."""
    min_pass_rate: float = 0.0
    """pass_rate_filter: keep prompts whose pass rate is above this."""
    max_pass_rate: float = 1.0
    """pass_rate_filter: keep prompts whose pass rate is below this."""
    id_column: str = "id"
    """Column identifying a prompt in the rows written; its row number when the column is absent."""
    chunk_prompts: int = 64
    """Prompts per sampling call and per journal line: the most work a killed run loses (a
    served model answers ``endpoint.concurrency`` requests' worth of chunks at once)."""
    filters: FilterConfig = field(default_factory=FilterConfig)
    """Filters of the passing samples (r1kit.filters)."""
    mix: MixConfig = field(default_factory=MixConfig)
    """Non-reasoning conversations mixed into the SFT rows."""
    environment: Any = None
    """An environment each sample talks to (r1kit.environments); its reward counts, weighed, in the
    sample's total, and a kept row holds the whole conversation (``messages``, with ``tools``)."""


TOLERANCE = 1e-9
"""Weighted totals are float sums (0.7 + 0.1 < 0.8): a total this close to min_total passes."""


def check(stage: RejectionStage) -> None:
    from r1kit.text import SCRIPTS

    specs = environments(stage)
    owned = bool(specs) and all(s.has_reward for s in specs)  # the environment owns the reward
    check_prompting(stage, None if owned else "a rejection stage needs at least one reward to verify samples, or an environment with get_reward")
    hooks.check_engine(stage, prefill=stage.think_prefill, tools=bool(stage.tools) or bool(specs))
    if specs:
        from r1kit.environments.episodes import template_problem

        problem = "fenced-code tools and an environment do not mix" if stage.tools else template_problem(stage.template, stage.think_prefill)
        if problem:
            raise RecipeError(f"{stage.name}.{'tools' if stage.tools else 'template'}: {problem}")
        if stage.mix.source is not None:
            raise RecipeError(f"{stage.name}.mix: not with an environment (its rows are whole conversations with tools); leave mix out")
    if problem := chat_problem(stage.endpoint, stage.template):
        raise RecipeError(f"{stage.name}.{problem}")
    stage.check_tools(f"{stage.name}.tools")
    best = reward_registry.best_total(reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards"))
    if best is not None and not specs and stage.min_total > best + TOLERANCE:
        raise RecipeError(
            f"{stage.name}.min_total: {stage.min_total:g} can never be reached: with these weights a sample scores at most "
            f"{best:g}; lower min_total or raise a reward's weight"
        )
    problem = stage.sampling_problem()
    if problem:
        raise RecipeError(f"{stage.name}: {problem}")
    for key in ("samples", "chunk_prompts", "max_kept_per_prompt"):
        if getattr(stage, key) is not None and getattr(stage, key) < 1:
            raise RecipeError(f"{stage.name}.{key}: must be at least 1, got {getattr(stage, key)}")
    if not 0.0 <= stage.min_pass_rate < stage.max_pass_rate <= 1.0:
        raise RecipeError(
            f"{stage.name}: need 0 <= min_pass_rate < max_pass_rate <= 1, got {stage.min_pass_rate} and {stage.max_pass_rate}"
        )
    problem = stage.filters.problem()
    if problem:
        raise RecipeError(f"{stage.name}.filters.{problem}")
    if not 0.0 <= stage.mix.ratio < float("inf"):
        raise RecipeError(f"{stage.name}.mix.ratio: mixed conversations per kept sample, 0 or more, got {stage.mix.ratio}")
    if stage.filters.language not in SCRIPTS:
        raise RecipeError(f"{stage.name}.filters.language: {stage.filters.language!r} is not one of {', '.join(SCRIPTS)}")
    if stage.mix.source is not None and (stage.mode != "samples" or stage.template != "chat"):
        raise RecipeError(
            f"{stage.name}.mix: mixing conversations needs mode: samples and template: chat, so that sampled "
            "and mixed rows train through the same chat template"
        )


# ---------------------------------------------------------------------------------------------
# Which samples of one prompt are kept


def select(totals: list[float], samples: list, stage: RejectionStage) -> list[str | None]:
    """Why each sample of one prompt (a Completion) is dropped (a name from DROPS), or None to keep it."""
    reasons: list[str | None] = [None if t >= stage.min_total - TOLERANCE else "failed" for t in totals]
    passing = [samples[i] for i, r in enumerate(reasons) if r is None]
    verdicts = iter(filter_group([c.text for c in passing], [c.tokens for c in passing], [c.truncated for c in passing], stage.filters))
    reasons = [next(verdicts) if r is None else r for r in reasons]
    if stage.max_kept_per_prompt is not None:
        for i in [i for i, r in enumerate(reasons) if r is None][stage.max_kept_per_prompt :]:
            reasons[i] = "over_cap"
    return reasons


def row_keys(stage: RejectionStage) -> tuple[str, ...]:
    # Only chat rows carry `messages`: the sft stage's `format: auto` then picks the form that
    # reproduces the sampled text (messages for chat, prompt/completion otherwise).
    rest = ("prompt", "completion", "id", "sample", "rewards", "reward_total", "tokens", "sampling", "origin")
    if stage.environment is not None:  # a conversation with the environment: the messages are the row
        return ("messages", "tools") + rest + ("episode",)
    return (("messages",) if stage.template == "chat" else ()) + rest + (("tool_calls",) if stage.tools else ())


def environments(stage: RejectionStage) -> list:
    from r1kit.environments import from_recipe

    return from_recipe(stage.environment, f"{stage.name}.environment")


# ---------------------------------------------------------------------------------------------
# One chunk of prompts: the stage's side of its sampling job (r1kit.sampling.jobs)


class Prompts:
    """What a chunk of the stage's prompts asks of the backend, and one record per prompt of how
    its samples scored and which were kept."""

    def __init__(self, ctx: StageContext, rows, rewards):
        self.ctx, self.rows, self.rewards = ctx, rows, rewards
        self.specs = environments(ctx.stage)

    def request(self, chunk: Chunk, sampler: Sampler) -> Request:
        stage = self.ctx.stage
        questions = self.rows[chunk.start : chunk.stop][stage.data.prompt]
        if self.specs:  # each sample an episode: its environment reset from the row, its own prompt
            from r1kit.environments.episodes import Episodes

            episodes = Episodes(self.specs, sampler.tokenizer)
            batch = self.rows.select(range(chunk.start, chunk.stop)).to_list()
            prompts = episodes.start([r for r in batch for _ in range(stage.samples)], [q for q in questions for _ in range(stage.samples)],
                                     stage.template)
            params = SamplingParams(stage.temperature, stage.top_p, stage.max_tokens, seed=self.ctx.recipe.seed + chunk.start * stage.samples)
            return Request(prompts, 1, params, episodes)
        prompts = [templates.render(stage.template, q, sampler.tokenizer, stage.think_prefill) for q in questions]
        # Seeds partition by prompt position: a chunk samples the same whether or not a run resumed.
        params = SamplingParams(stage.temperature, stage.top_p, stage.max_tokens, seed=self.ctx.recipe.seed + chunk.start * stage.samples)
        return Request(prompts, stage.samples, params, stage.load_tools() or None)

    def records(self, chunk: Chunk, request: Request, samples: list[list[Completion]], sampler: Sampler) -> list[dict]:
        """Verify and filter the chunk's samples."""
        ctx, stage, cfg, n = self.ctx, self.ctx.stage, self.ctx.stage.data, self.ctx.stage.samples
        batch, prompts, params = self.rows[chunk.start : chunk.stop], request.prompts, request.params  # column -> list
        questions = batch[cfg.prompt]
        episodes = None
        if self.specs:  # one prompt per sample: regrouped by row, the episodes' records alongside
            flat = [c for group in samples for c in group]
            episodes = request.tools.finish(flat)
            samples, prompts = [flat[j * n : (j + 1) * n] for j in range(len(questions))], prompts[::n]
        ids = [str(x) for x in batch[stage.id_column]] if stage.id_column in batch else [str(i) for i in range(chunk.start, chunk.stop)]
        texts = [c.text for group in samples for c in group]
        # The rewards see what they see in a grpo stage: the rendered prompt and the other columns.
        hidden = {cfg.prompt, "prompt", "completion", "messages"}
        columns = {k: [v for v in vs for _ in range(n)] for k, vs in batch.items() if k not in hidden}
        columns["prompt"] = list(request.prompts) if episodes else [p for p in prompts for _ in range(n)]
        scores = reward_registry.score(self.rewards, texts, **columns)
        totals = reward_registry.weighted_total(scores, self.rewards) if self.rewards else [0.0] * len(texts)
        for spec in self.specs if episodes else []:  # each environment's reward, weighed, on its own episodes
            mine = [e["reward"] if e["environment"] == spec.label else None for e in episodes]
            scores[f"env_{spec.label}"] = mine
            totals = [t + (spec.config.weight * r if r is not None else 0.0) for t, r in zip(totals, mine)]
        provenance = {"model": ctx.model, "backend": sampler.backend, "temperature": params.temperature}
        provenance |= {"top_p": params.top_p, "max_tokens": params.max_tokens, "seed": params.seed}
        prefill = templates.THINK_PREFILL if stage.think_prefill else ""
        records = []
        for j, (question, prompt, group) in enumerate(zip(questions, prompts, samples)):
            group_totals = totals[j * n : (j + 1) * n]
            passed = sum(t >= stage.min_total - TOLERANCE for t in group_totals)
            record = {"index": chunk.start + j, "id": ids[j], "passed": passed, "dropped": {}, "rows": []}
            if stage.mode == "samples":
                reasons = select(group_totals, group, stage)
                record["dropped"] = dict(Counter(r for r in reasons if r is not None))
                for k, (c, reason) in enumerate(zip(group, reasons)):
                    if reason is not None:
                        continue
                    row = {
                        "messages": request.tools.conversations[j * n + k] if episodes else [
                            {"role": "user", "content": templates.chat_user_turn(question)},
                            {"role": "assistant", "content": prefill + c.text},
                        ],
                        "tools": list(request.tools.guarded[j * n + k].spec.tools.values()) or None if episodes else None,
                        "episode": episodes[j * n + k] if episodes else None,
                        "prompt": prompt,
                        "completion": c.text,
                        "id": ids[j],
                        "sample": k,
                        "rewards": {name: s[j * n + k] for name, s in scores.items()},
                        "reward_total": group_totals[k],
                        "tokens": c.tokens,
                        "tool_calls": c.tool_calls,
                        "sampling": provenance,
                        "origin": "sampled",
                    }
                    record["rows"].append({key: row[key] for key in row_keys(stage)})
            records.append(record)
        log.info(
            "%s: prompts %d-%d of %d, passed %d/%d samples, kept %d",
            stage.name, chunk.start, chunk.stop - 1, len(self.rows),
            sum(r["passed"] for r in records), len(records) * n, sum(len(r["rows"]) for r in records),
        )
        return records


# ---------------------------------------------------------------------------------------------
# The stage


def mixed_rows(ctx: StageContext, kept: int) -> Iterator[dict]:
    """round(ratio × kept) conversations drawn at random (recipe seed) from the mix source."""
    mix, stage = ctx.stage.mix, ctx.stage
    want = round(mix.ratio * kept)
    if mix.source is None or want == 0:
        return
    source = ctx.resolve_data_source(mix.source)
    ds = data_lib.load_source(source, mix.split, mix.subset)
    data_lib.require_columns(ds, [mix.messages], source, f"rejection stage {stage.name!r} (mix)")
    if want > len(ds):
        log.warning("%s: mix wants %d conversations, %s has %d: taking all", stage.name, want, mix.source, len(ds))
    picked = sorted(random.Random(ctx.recipe.seed).sample(range(len(ds)), min(want, len(ds))))
    for i, example in zip(picked, ds.select(picked)):
        # role and content only: other message fields (tool calls, names) would break the rows' schema
        messages = [{"role": m["role"], "content": m["content"]} for m in example[mix.messages]]
        row = {"messages": messages, "id": f"{mix.source}#{i}", "origin": mix.source}
        yield {key: row.get(key) for key in row_keys(stage)}


def run(ctx: StageContext) -> StageResult:
    from r1kit.sampling import closing, load_sampler, shard_of

    stage, cfg = ctx.stage, ctx.stage.data
    rewards = reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")
    rows = data_lib.load_rows(cfg, ctx)
    data_lib.require_columns(rows, [cfg.prompt], ctx.resolve_data_source(cfg.source), f"rejection stage {stage.name!r}")
    header = {"stage": to_dict(stage), "model": ctx.model, "seed": ctx.recipe.seed}
    job, work = Job(ctx.dir, header, len(rows), stage.chunk_prompts, stage.name), Prompts(ctx, rows, rewards)
    load = lambda: load_sampler(ctx.model, stage.backend, ctx.processes, stage.endpoint, ctx.dir, **stage.backend_options)  # noqa: E731
    shard, shards = shard_of(ctx.processes, stage.backend, stage.backend_options)
    with closing(load) as sampler:  # started servers stop at the end, on an error and on Ctrl-C
        if shard is not None:  # None: a process without an engine of its own (vLLM across several GPUs)
            job.sample(work, sampler, shard, shards)
        ctx.barrier()  # every shard is journaled
        if not ctx.is_main:
            return StageResult()
        # Nothing is left, unless another process's journal is not in this folder (the run folder
        # must be shared by all nodes) or a shard went missing: then this process samples it.
        job.sample(work, sampler, leftover=shards > 1)
    return publish(ctx, rows, job)


def kept_nothing(stage: RejectionStage, drops: dict[str, int]) -> str:
    """What dropped every sample (or prompt), largest first, and what to loosen."""
    if stage.mode != "samples":
        return f"no prompt's pass rate lies between min_pass_rate {stage.min_pass_rate} and max_pass_rate {stage.max_pass_rate}"
    by = ", ".join(f"{reason} {n}" for reason, n in sorted(drops.items(), key=lambda kv: -kv[1]) if n)
    first = max(drops, key=drops.get)
    fix = f"min_total {stage.min_total:g}" if first == "failed" else f"the {first} filter ({LOOSEN[first]})"
    return f"dropped by {by}; loosen {fix}"


def publish(ctx: StageContext, rows, job: Job) -> StageResult:
    """dataset.jsonl and stats.json, streamed from the journals in prompt order, each written
    atomically; memory holds one chunk's records at a time."""
    stage = ctx.stage
    totals = Counter(prompts=0, samples=0, passed=0, prompts_all_passed=0, prompts_none_passed=0, kept=0)
    dropped: Counter = Counter()
    rate_sum = 0.0
    dataset = ctx.dir / DATASET
    for stale in [*ctx.dir.glob(".*.tmp"), *ctx.dir.glob(".per_prompt.*")]:  # left by a publish that was killed
        stale.unlink()
    per_prompt = ctx.dir / f".per_prompt.{os.getpid()}.jsonl"
    try:
        with atomic_file(dataset) as out, open(per_prompt, "w") as pp:
            for p in job.records():
                rate = p["passed"] / stage.samples
                if stage.mode == "samples":
                    kept = len(p["rows"])
                    out.writelines(json.dumps(r, default=str) + "\n" for r in p["rows"])
                    dropped.update(p["dropped"])
                else:
                    kept = stage.min_pass_rate < rate < stage.max_pass_rate
                    if kept:
                        out.write(json.dumps({**rows[p["index"]], "pass_rate": rate}, default=str) + "\n")
                totals.update(prompts=1, samples=stage.samples, passed=p["passed"], kept=int(kept))
                totals.update(prompts_all_passed=int(rate == 1.0), prompts_none_passed=int(rate == 0.0))
                rate_sum += rate
                pp.write(json.dumps({"id": p["id"], "pass_rate": rate, "kept": kept}) + "\n")
            mixed = 0
            for row in mixed_rows(ctx, totals["kept"]):
                out.write(json.dumps(row, default=str) + "\n")
                mixed += 1
        figures = {
            "prompts": totals["prompts"],
            "samples": totals["samples"],
            "passed": totals["passed"],
            "pass_rate": rate_sum / totals["prompts"] if totals["prompts"] else 0.0,
            "prompts_all_passed": totals["prompts_all_passed"],
            "prompts_none_passed": totals["prompts_none_passed"],
            "kept": totals["kept"],
            "mixed": mixed,
        }
        drops = {k: dropped[k] for k in DROPS} if stage.mode == "samples" else {}
        with atomic_file(ctx.dir / STATS) as f, open(per_prompt) as pp:
            head = json.dumps({"mode": stage.mode, **figures, "dropped": drops}, indent=1)
            f.write(head[: -len("\n}")] + ',\n "per_prompt": [')
            for i, line in enumerate(pp):
                f.write(("," if i else "") + "\n  " + line.rstrip("\n"))
            f.write("\n ]\n}\n")
    finally:
        per_prompt.unlink(missing_ok=True)
    if not figures["kept"]:
        raise RecipeError(f"{stage.name}: kept nothing of {figures['samples']} samples of {figures['prompts']} prompts; "
                          f"{kept_nothing(stage, drops)}; {ctx.dir / STATS} has every prompt's pass rate")
    log.info("%s: wrote %d rows to %s", stage.name, figures["kept"] + mixed, dataset)
    return StageResult(dataset=str(dataset), metrics=figures | {f"dropped_{k}": v for k, v in drops.items() if v})


# Every process of a distributed run samples its own shard of the chunks; the main one merges them.
STAGE = StageKind(
    config=RejectionStage, run=run, check=check, data=hooks.data_sections, budgets=hooks.sampling_budgets,
    machine_problems=hooks.engine_problems, bf16=hooks.engine_bf16, servers=hooks.server_problems,
)
