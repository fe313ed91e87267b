"""The `grpo` stage: reasoning RL with verifiable rewards on `trl.GRPOTrainer`.

    - name: rl
      kind: grpo
      data: {source: open-r1/DAPO-Math-17k-Processed, prompt: prompt}   # other columns reach the rewards
      template: r1_zero                                # see r1kit.templates
      rewards:
        - {name: math_accuracy, weight: 1.0}
        - {name: format, weight: 0.5, mode: strict}    # reward parameters sit beside name and weight
      dynamic_sampling: false                          # DAPO: drop zero-signal groups and refill
      tools: [python]                                  # rollouts may run code as they reason (r1kit.execution.tools)
      trainer: {learning_rate: 3.0e-6, num_generations: 16}    # trl.GRPOConfig fields, as they are

Rewards come from the reward registry (r1kit.reward_registry) and map onto TRL's ``reward_funcs`` and
``reward_weights``; TRL logs each one's mean and std under its name, and every logged figure
(rewards, completion lengths and clipped share, zero-std group share, entropy, KL) also lands in
``<stage>/metrics.jsonl``.

What the rewards cost: each reward function call is timed (wall clock, on each process for its
own share of the batch; the main process's figures are the ones logged). ``reward_seconds/<name>``
in the logs is the seconds a reward took *per optimizer step*: summed over every call within the
step (one per generation batch, so several when ``steps_per_generation`` is below
``gradient_accumulation_steps``, plus each dynamic-sampling refill round; none in a step that
reuses an earlier generation), then averaged over the steps of the logging window like TRL's
``step_time``, which it can be read against. The totals over all calls go to the stage's metrics
as ``reward_seconds`` (all rewards) and ``reward_seconds/<name>``; the report sets them against
the stage's wall time (a resumed stage counts both from the resume). TRL's own reward timer
reports only to W&B, MLflow and Trackio, not to the trainer's logs.

Defaults follow the DeepSeek-R1 paper rather than TRL: ``loss_type: grpo`` and ``beta: 0.001``
(a reference model, KL by the k3 estimator). The DAPO and Dr. GRPO variants are opt-in through
``loss_type`` / ``beta`` / ``epsilon_high`` / ``scale_rewards`` and ``dynamic_sampling`` (see the
variant recipes). On a GPU, ``use_vllm: true`` generates with vLLM (colocated, or ``vllm_mode:
server``); without it TRL generates with transformers. With ``peft:`` the stage trains a LoRA
adapter (TRL syncs the merged weights into vLLM) and hands on the merged model (r1kit.trainers.lora).

The trainer is r1kit's subclass of TRL's (r1kit.trainers.trl_overrides), checked against the
installed TRL before any model loads. Where they hold, it takes r1kit's paths: on a CPU r1kit's
decoding loop generates the rollouts, from the same distribution (r1kit.trainers.rollouts); at
``beta: 0`` completions with zero advantage skip the forward and backward pass
(r1kit.trainers.zero_advantage); ``share_prompts: true`` scores each group's prompt once
(r1kit.trainers.shared_prompts); ``dynamic_sampling`` refills zero-signal groups
(r1kit.trainers.dynamic_sampling). Which paths were taken, and why not where not, is recorded in
the stage's ``DONE.json`` (``metrics.trainer_paths``) and the run report. While training, TRL's
log-probabilities go through r1kit.hardware.cpu's whole-vocabulary products on a CPU
(r1kit.trainers.trl_patches).

With ``tools:`` a rollout may run code while it reasons (r1kit.execution.tools: a python block, its output
appended, generation going on): the trainer hands TRL the turns as its ``rollout_func``, with
the tools' output tokens masked out of the loss and the KL (TRL's tool mask); the rewards read the
whole transcript, and answer extraction skips output blocks. On a CPU r1kit's decoding loop does
the turns; with ``use_vllm`` vLLM does (one process; the closing fence is its stop string). Each
step logs ``tools/calls_per_rollout``, ``tools/call_share``, ``tools/error_share``,
``tools/timeout_share`` and ``tools/sandbox_seconds``.

With ``environment:`` the rollouts talk to an environment turn after turn through function calls
(r1kit.environments): TRL's ``environment_factory`` plays the turns, each environment call bounded
by r1kit's guard, and the environment's ``get_reward`` is weighed with the recipe's rewards (which
may be left out where the environment owns the reward); each step logs ``env/turns_per_rollout``,
``env/calls/<tool>``, ``env/tool_error_share``, ``env/failure_share``, ``env/timeout_share`` and
``env/reward/<environment>``.

With ``max_staleness: N`` the rollouts come from a generator process drawing at most N optimizer
steps ahead of training, with new weights after every step, and PPO's ratio taken to the policy
that drew them (or TRL's importance-sampling correction, opt-in): asynchronous GRPO on a CPU
(r1kit.trainers.async_generation). Settings it cannot honour are refused at validate time. On
GPUs, asynchronous GRPO is a stage kind of its own, ``async_grpo``: TRL's asynchronous trainer
against a vLLM server (r1kit.stages.async_grpo).

Not here: the reward functions themselves (rewards/), or any loss of r1kit's own: TRL computes it.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from r1kit import data as data_lib
from r1kit import reward_registry, templates
from r1kit.config import PromptStageConfig
from r1kit.environments import episodes
from r1kit.errors import RecipeError
from r1kit.execution import tools as tools_lib
from r1kit.hardware import Machine
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult, check_prompting
from r1kit.trainers import lora
from r1kit.trainers.training import checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, train_and_save, trainer_args

log = logging.getLogger(__name__)

# The DeepSeek-R1 paper's GRPO (arXiv:2501.12948, section 2.2): KL coefficient 0.001, and the
# sequence-level GRPO loss. TRL defaults to beta 0 and the DAPO token-level loss.
PAPER_DEFAULTS = {"loss_type": "grpo", "beta": 0.001, "logging_steps": 1}


@dataclass(kw_only=True)
class GRPOStage(PromptStageConfig, lora.LoraFields, tools_lib.ToolFields):
    REFUSED: ClassVar[dict[str, str]] = dict.fromkeys(
        ("async_engine", "server_gpus", "server_options"),
        "TRL's asynchronous trainer is a stage kind of its own: kind: async_grpo (r1kit.stages.async_grpo)")
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch."""
    dynamic_sampling_max_rounds: int = 3
    """Cap on extra generation rounds per batch for dynamic sampling."""
    max_staleness: int | None = None
    """Asynchronous GRPO: rollouts drawn by a generator process at most this many optimizer steps
    ahead of training, the loss corrected for the gap (r1kit.trainers.async_generation); 0 keeps them
    in step (the synchronous stage's samples). None: generation inside the trainer's step. On
    GPUs: kind async_grpo."""
    share_prompts: bool = False
    """Score each group's prompt once, not once per completion (r1kit.trainers.shared_prompts): the same
    log-probabilities and gradients up to rounding, fewer tokens through the model."""
    environment: Any = None
    """An environment the rollouts talk to, turn after turn (r1kit.environments: a name, module:Class,
    a mapping with bounds, or a list routed by the rows' ``environment`` field); TRL's environment_factory."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.GRPOConfig, passed through."""


def check(stage: GRPOStage) -> None:
    specs = environments(stage)
    owned = bool(specs) and all(s.has_reward for s in specs)  # the environment owns the reward (as in TRL)
    check_prompting(stage, None if owned else "a grpo stage needs at least one reward, or an environment with get_reward")
    check_environment(stage, specs)
    if "reward_weights" in stage.trainer:
        raise RecipeError(f"{stage.name}.trainer.reward_weights: set weights in the rewards list instead")
    lora.check(stage)
    stage.check_tools(f"{stage.name}.tools")
    check_async(stage)
    if stage.tools and stage.trainer.get("vllm_importance_sampling_correction"):
        raise RecipeError(f"{stage.name}.trainer.vllm_importance_sampling_correction: not with tools (a rollout's turns carry no "
                          "sampling log-probabilities); leave it out")


# GRPOConfig's sampling fields beyond temperature and top-p, with the values that ask for nothing
# more: r1kit's decoding loop, the generator's, applies none of them (r1kit.trainers.rollouts).
LOOP_ONLY = {"top_k": (0, None), "min_p": (None, 0, 0.0), "repetition_penalty": (1, 1.0, None), "generation_kwargs": (None, {})}


def environments(stage) -> list:
    """The environments a stage names (r1kit.environments.Spec), checked; one line naming the key."""
    from r1kit import environments as env_lib

    return env_lib.from_recipe(stage.environment, f"{stage.name}.environment")


def check_environment(stage: GRPOStage, specs: list) -> None:
    """What TRL's environment_factory cannot run, in one line."""
    if not specs:
        return
    from r1kit.environments.episodes import template_problem

    problem = template_problem(stage.template, stage.think_prefill)
    if problem:
        raise RecipeError(f"{stage.name}.template: {problem}")
    if stage.tools:
        raise RecipeError(f"{stage.name}.tools: fenced-code tools and an environment do not mix; the environment's methods are its tools")
    gym_style = [not s.tools for s in specs]
    if any(gym_style) and not all(gym_style):
        raise RecipeError(f"{stage.name}.environment: function-calling environments (TRL's environment loop) and gym-style ones "
                          "(step, no tools: r1kit's rollout function) do not mix in one stage")
    for i, spec in enumerate(specs):
        where = f"{stage.name}.environment" + (f"[{i}]" if len(specs) > 1 else "")
        if spec.tools and spec.config.turn_tokens is not None:
            raise RecipeError(f"{where}.turn_tokens: TRL's trainer bounds a whole rollout (trainer.max_completion_length), not a turn; leave it out")
    if stage.max_staleness is not None:
        raise RecipeError(f"{stage.name}.max_staleness: not with an environment (TRL's environment loop runs in the trainer's step); leave one out")
    if stage.dynamic_sampling:
        raise RecipeError(f"{stage.name}.dynamic_sampling: not with an environment (a refill would reuse the batch's environment instances); leave it out")


def check_async(stage: GRPOStage) -> None:
    """One line for asynchronous settings the generator cannot honour."""
    if stage.max_staleness is None:
        return
    where = f"{stage.name}.max_staleness"
    if stage.max_staleness < 0:  # an int: the typed config says so
        raise RecipeError(f"{where}: {stage.max_staleness!r}: an optimizer step count, 0 or more (0: in step)")
    if stage.dynamic_sampling:
        raise RecipeError(f"{where}: not with dynamic_sampling (a refill draws again inside the step); leave one of them out")
    trainer = stage.trainer
    if trainer.get("num_iterations", 1) != 1:
        raise RecipeError(f"{where}: not with trainer.num_iterations {trainer['num_iterations']} (one pass over each batch); "
                          "leave num_iterations out")
    accumulation = trainer.get("gradient_accumulation_steps", 1)
    if trainer.get("steps_per_generation", accumulation) != accumulation:
        raise RecipeError(f"{where}: trainer.steps_per_generation must equal gradient_accumulation_steps "
                          f"({accumulation}): one generation batch per optimizer step")
    if trainer.get("use_vllm"):
        raise RecipeError(f"{where}: not with trainer.use_vllm (r1kit's generator process draws the rollouts)")
    for key, neutral in LOOP_ONLY.items():
        if key in trainer and trainer[key] not in neutral:
            raise RecipeError(f"{where}: r1kit's generator samples with temperature and top-p only; not with trainer.{key} "
                              f"{trainer[key]!r} (leave it out, or leave max_staleness out)")
    if "max_completion_length" in trainer and trainer["max_completion_length"] is None:
        raise RecipeError(f"{where}: r1kit's generator needs trainer.max_completion_length (a number of tokens), not null")


def async_problems(stage: GRPOStage, machine: Machine) -> list[str]:
    """Asynchronous rollouts where r1kit's generator cannot run: on a GPU (the async_grpo stage,
    TRL's asynchronous trainer, is the engine there) or under a launcher's several processes."""
    if stage.max_staleness is None:
        return []
    if machine.gpu:
        return [f"{stage.name}.max_staleness: r1kit's asynchronous rollouts run on a CPU (r1kit's decoding loop as the "
                "generator); on GPUs use kind: async_grpo (TRL's asynchronous trainer), or leave max_staleness out"]
    if machine.world.world > 1:
        return [f"{stage.name}.max_staleness: r1kit's asynchronous rollouts run on one process, not {machine.world.world}; "
                "launch one, or leave max_staleness out"]
    return []


def prompt_rows(ctx: StageContext, tokenizer):
    """Training rows with `prompt` rendered by the stage's template; other columns kept (the
    distill stage keeps `prompt` alone)."""
    cfg, stage = ctx.stage.data, ctx.stage
    ds = data_lib.load_rows(cfg, ctx)
    data_lib.require_columns(ds, [cfg.prompt], ctx.resolve_data_source(cfg.source), f"{stage.kind} stage {stage.name!r}")

    def render(row):
        if getattr(stage, "environment", None) is not None:  # TRL's environment loop takes a conversation
            from r1kit.environments.episodes import user_message

            return {"prompt": [{"role": "user", "content": user_message(stage.template, row[cfg.prompt])}]}
        return {"prompt": templates.render(stage.template, row[cfg.prompt], tokenizer, stage.think_prefill)}

    drop = [c for c in ("prompt", "completion", "messages") if c in ds.column_names and c != cfg.prompt]
    ds = ds.remove_columns(drop)  # demonstrations must not leak into the rollout prompts
    return ds.map(render, remove_columns=[cfg.prompt] if cfg.prompt != "prompt" else None)


def run(ctx: StageContext) -> StageResult:
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from r1kit.trainers import trl_overrides, trl_patches

    trl_overrides.check()  # before any model loads
    stage = ctx.stage
    rewards = reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")
    specs = environments(stage)
    tokenizer = AutoTokenizer.from_pretrained(ctx.model, padding_side="left")
    env_figures: dict[str, float] = {}
    rows = prompt_rows(ctx, tokenizer)
    args = trainer_args(GRPOConfig, ctx, **trainer_defaults(stage))
    checkpoint = last_checkpoint(ctx)
    metrics_path = ctx.dir / "metrics.jsonl"
    clock = RewardClock()
    features = trl_overrides.Features(
        share_prompts=stage.share_prompts,
        dynamic_sampling_rounds=stage.dynamic_sampling_max_rounds if stage.dynamic_sampling else None,
        tools=stage.load_tools() if stage.tools else None,
        environments=[s for s in specs if not s.tools] or None,
        max_staleness=stage.max_staleness,
        where=f"{ctx.recipe.source}: {stage.name}.",
    )
    trainer = trl_overrides.GRPOTrainer(
        model=ctx.model,  # TRL builds it: float32 master weights, args.model_init_kwargs applied
        reward_funcs=[clock.timed(reward_registry.for_trl(r)) for r in rewards] + [clock.timed(f) for f in env_rewards(specs, env_figures)],
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        callbacks=[make_metrics_log(metrics_path, checkpoint_step(checkpoint) if checkpoint else None, ctx.is_main)],
        peft_config=lora.lora_config(stage),
        quantization_config=lora.quantization_config(stage),
        features=features,
        **({"environment_factory": episodes.trl_factory(specs)} if specs and specs[0].tools else {}),
    )
    trainer.add_callback(clock.log_steps(trainer, env_figures))
    sizes = lora.parameters(trainer.model)
    # TRL's own head and SDPA's choice on other devices and for other models
    try:
        with trl_patches.log_probs_on_cpu(), trl_patches.short_attention_in_math(trainer.model, trainer.ref_model):
            out = train_and_save(trainer, ctx)
    finally:
        if trainer.generator is not None:
            trainer.generator.close()
    metrics = sizes | summarize(read_metrics(metrics_path), rewards) | clock.totals()
    paths = trainer.paths | trl_patches.taken(trainer.accelerator.device)
    return StageResult(model=out, metrics=metrics | {"trainer_paths": paths})


class RewardClock:
    """Seconds spent in each reward function: since the last optimizer step, and in total."""

    def __init__(self):
        self.step: dict[str, float] = {}
        self.total: dict[str, float] = {}

    def timed(self, fn: Callable[..., list]) -> Callable[..., list]:
        """`fn` (a TRL reward function, named as TRL logs it), timing each call."""
        name = fn.__name__
        self.step[name] = self.total[name] = 0.0

        @functools.wraps(fn)
        def call(**kwargs):
            start = time.perf_counter()
            scores = fn(**kwargs)
            seconds = time.perf_counter() - start
            self.step[name] += seconds
            self.total[name] += seconds
            return scores

        return call

    def log_steps(self, trainer, figures: dict[str, float] | None = None):
        """A callback adding each optimizer step's seconds, and the environments' `figures` of its
        last batch (r1kit.environments.metrics), to the figures `trainer` logs next."""
        from transformers import TrainerCallback

        clock = self

        class RewardSeconds(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                # The trainer's own per-step figures (step_time, ...) gather here; its log() averages them.
                for name, seconds in clock.step.items():
                    trainer._metrics["train"][f"reward_seconds/{name}"].append(seconds)
                for name, value in (figures or {}).items():
                    trainer._metrics["train"][name].append(value)
                clock.step = dict.fromkeys(clock.step, 0.0)

        return RewardSeconds()

    def totals(self) -> dict[str, float]:
        """``reward_seconds`` (all rewards) and ``reward_seconds/<name>``, over every call so far."""
        return {"reward_seconds": sum(self.total.values())} | {f"reward_seconds/{n}": s for n, s in self.total.items()}


def summarize(records: list[dict], rewards) -> dict[str, float]:
    """First and last logged value of the figures a reasoning-RL user watches."""
    out: dict[str, float] = {}
    names = [reward_registry.for_trl(r).__name__ for r in rewards]
    keys = ["reward"] + [f"rewards/{n}/mean" for n in names]
    keys += ["completions/mean_length", "completions/clipped_ratio"]
    for key in keys:
        values = [r[key] for r in records if key in r]
        if values:
            short = key.removeprefix("rewards/").removesuffix("/mean").replace("completions/", "")
            out[f"{short}_first"], out[f"{short}_last"] = values[0], values[-1]
    return out | summarize_async(records)


def summarize_async(records: list[dict]) -> dict[str, float]:
    """Over the logged steps of an asynchronous stage (``max_staleness``): staleness (mean, max),
    the share of samples dropped as too old, the importance ratio's extremes and the share
    corrected, and the seconds each side waited for the other (summed)."""
    def values(key):
        return [r[key] for r in records if key in r]

    staleness = values("async/staleness")
    if not staleness:
        return {}
    out = {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness),
           "dropped_share": sum(values("async/dropped_share")) / len(staleness)}
    for key, name, pick in [("async/ratio_min", "ratio_min", min), ("sampling/importance_sampling_ratio/min", "ratio_min", min),
                            ("async/ratio_max", "ratio_max", max), ("sampling/importance_sampling_ratio/max", "ratio_max", max),
                            ("async/corrected_share", "corrected_share", lambda v: sum(v) / len(v))]:
        if values(key):
            out[name] = pick(values(key))
    for key in ("trainer_wait_seconds", "generator_wait_seconds"):
        out[key] = sum(values(f"async/{key}"))
    return out


def trainer_defaults(stage: GRPOStage) -> dict:
    """The paper's GRPO settings and the recipe's reward weights (as the registry reads them);
    no vLLM importance-sampling correction with tools (a rollout's turns carry no sampling
    log-probabilities for it) or asynchronous rollouts (unless the recipe asks: PPO's ratio to the
    sampling policy is the default)."""
    rewards = reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")
    weights = [r.weight for r in rewards] + [s.config.weight for s in environments(stage) if s.has_reward]
    tools = {"vllm_importance_sampling_correction": False} if stage.tools else {}
    # Asynchronous rollouts: PPO's clip to the sampling policy unless the recipe asks for TRL's
    # importance-sampling correction (r1kit.trainers.async_generation).
    asynchronous = {"vllm_importance_sampling_correction": False} if stage.max_staleness is not None else {}
    turns = {"max_tool_calling_iterations": max(s.config.max_turns for s in environments(stage)) - 1} if stage.environment is not None else {}
    return {**PAPER_DEFAULTS, "reward_weights": weights, **tools, **asynchronous, **turns, **lora.trainer_defaults(stage)}


def env_rewards(specs: list, figures: dict) -> list[Callable]:
    """One TRL reward function per environment that owns its reward (r1kit.environments.episodes.trl_reward)."""
    return [episodes.trl_reward(spec, figures) for spec in specs if spec.has_reward]


STAGE = StageKind(
    config=GRPOStage, run=run, trainer_config=lambda stage: __import__("trl").GRPOConfig, check=check, trainer_defaults=trainer_defaults,
    data=hooks.data_sections, budgets=hooks.trainer_budgets, bf16=hooks.trainer_bf16, plots_rl=True,
    machine_problems=lambda stage, machine: hooks.trainer_problems(stage, machine) + lora.machine_problems(stage, machine)
    + async_problems(stage, machine),
)
