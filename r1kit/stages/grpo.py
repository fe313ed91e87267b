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
server``); without it TRL generates with transformers, and on a CPU r1kit's decoding loop
(r1kit.sampling.decode) generates in its place, from the same distribution (`decode_rollouts`), and TRL's
log-probabilities go through r1kit.hardware.cpu's whole-vocabulary products. ``share_prompts: true`` scores
each group's prompt once (r1kit.trainers.shared_prompts). At ``beta: 0`` completions with zero advantage
skip the forward and backward pass (r1kit.trainers.zero_advantage). With ``peft:`` the stage trains a LoRA
adapter (TRL syncs the merged weights into vLLM) and hands on the merged model (r1kit.trainers.lora).

With ``tools:`` a rollout may run code while it reasons (r1kit.execution.tools: a python block, its output
appended, generation going on): `tool_rollouts` hands TRL the turns as its ``rollout_func``, with
the tools' output tokens masked out of the loss and the KL (TRL's tool mask); the rewards read the
whole transcript, and answer extraction skips output blocks. On a CPU r1kit's decoding loop does
the turns; with ``use_vllm`` vLLM does (one process; the closing fence is its stop string). Each
step logs ``tools/calls_per_rollout``, ``tools/call_share``, ``tools/error_share``,
``tools/timeout_share`` and ``tools/sandbox_seconds``.

Not here: the reward functions themselves (rewards/), or any loss of r1kit's own: TRL computes it.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from r1kit import data as data_lib
from r1kit.trainers import lora
from r1kit import reward_registry
from r1kit import templates
from r1kit.execution import tools as tools_lib
from r1kit.config import PromptStageConfig
from r1kit.errors import RecipeError
from r1kit.trainers.shared_prompts import score_prompts_once
from r1kit.stages.base import StageContext, StageKind, StageResult
from r1kit.trainers.training import checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, train_and_save, trainer_args
from r1kit.trainers.zero_advantage import skip_zero_advantage

log = logging.getLogger(__name__)

# The DeepSeek-R1 paper's GRPO (arXiv:2501.12948, section 2.2): KL coefficient 0.001, and the
# sequence-level GRPO loss. TRL defaults to beta 0 and the DAPO token-level loss.
PAPER_DEFAULTS = {"loss_type": "grpo", "beta": 0.001, "logging_steps": 1}


@dataclass(kw_only=True)
class GRPOStage(PromptStageConfig, lora.LoraFields, tools_lib.ToolFields):
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch."""
    dynamic_sampling_max_rounds: int = 3
    """Cap on extra generation rounds per batch for dynamic sampling."""
    share_prompts: bool = False
    """Score each group's prompt once, not once per completion (r1kit.trainers.shared_prompts): the same
    log-probabilities and gradients up to rounding, fewer tokens through the model."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.GRPOConfig, passed through."""


def check(stage: GRPOStage) -> None:
    stage.check_prompting("a grpo stage needs at least one reward")
    if "reward_weights" in stage.trainer:
        raise RecipeError(f"{stage.name}.trainer.reward_weights: set weights in the rewards list instead")
    lora.check(stage)
    stage.check_tools(f"{stage.name}.tools")
    if stage.tools and stage.trainer.get("vllm_importance_sampling_correction"):
        raise RecipeError(f"{stage.name}.trainer.vllm_importance_sampling_correction: not with tools (a rollout's turns carry no "
                          "sampling log-probabilities); leave it out")


def prompt_rows(ctx: StageContext, tokenizer):
    """Training rows with `prompt` rendered by the stage's template; other columns kept (the
    distill stage keeps `prompt` alone)."""
    cfg, stage = ctx.stage.data, ctx.stage
    ds = data_lib.load_rows(cfg, ctx)
    data_lib.require_columns(ds, [cfg.prompt], ctx.resolve_data_source(cfg.source), f"{stage.kind} stage {stage.name!r}")

    def render(row):
        return {"prompt": templates.render(stage.template, row[cfg.prompt], tokenizer, stage.think_prefill)}

    drop = [c for c in ("prompt", "completion", "messages") if c in ds.column_names and c != cfg.prompt]
    ds = ds.remove_columns(drop)  # demonstrations must not leak into the rollout prompts
    return ds.map(render, remove_columns=[cfg.prompt] if cfg.prompt != "prompt" else None)


def run(ctx: StageContext) -> StageResult:
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from r1kit.hardware import cpu
    from r1kit.trainers.dynamic_sampling import DynamicSamplingGRPOTrainer

    stage = ctx.stage
    rewards = reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")
    tokenizer = AutoTokenizer.from_pretrained(ctx.model, padding_side="left")
    rows = prompt_rows(ctx, tokenizer)
    args = trainer_args(GRPOConfig, ctx, **trainer_defaults(stage))
    checkpoint = last_checkpoint(ctx)
    metrics_path = ctx.dir / "metrics.jsonl"
    clock = RewardClock()
    kwargs = dict(
        model=ctx.model,  # TRL builds it: float32 master weights, args.model_init_kwargs applied
        reward_funcs=[clock.timed(reward_registry.for_trl(r)) for r in rewards],
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        callbacks=[make_metrics_log(metrics_path, checkpoint_step(checkpoint) if checkpoint else None, ctx.is_main)],
        peft_config=lora.lora_config(stage),
        quantization_config=lora.quantization_config(stage),
    )
    if stage.dynamic_sampling:
        trainer = DynamicSamplingGRPOTrainer(**kwargs, max_rounds=stage.dynamic_sampling_max_rounds)
    else:
        trainer = GRPOTrainer(**kwargs)
    trainer.add_callback(clock.log_steps(trainer))
    skip_zero_advantage(trainer)
    if stage.share_prompts:
        score_prompts_once(trainer)
    if stage.tools:
        tool_rollouts(trainer, stage.load_tools())
    elif trainer.accelerator.device.type == "cpu":
        decode_rollouts(trainer)
        if args.bf16:
            autocast_rollouts(trainer)
    sizes = lora.parameters(trainer.model)
    with cpu.log_probs_on_cpu(), cpu.short_attention_in_math():  # TRL's own head and SDPA's choice on other devices
        out = train_and_save(trainer, ctx)
    return StageResult(model=out, metrics=sizes | summarize(read_metrics(metrics_path), rewards) | clock.totals())


def decode_rollouts(trainer) -> bool:
    """Generate rollouts with r1kit's decoding loop (r1kit.sampling.decode) where TRL would call
    ``model.generate``, and say whether it does.

    The loop prefills each prompt once for its group of generations, writes keys and values in
    place and drops finished completions from the batch; on a CPU that makes rollouts several
    times faster. It draws from the same distribution as TRL's generation config (temperature and
    top-p, the policy's current weights), so the loss, TRL's log-probabilities and everything
    after generation are unchanged. Taken only where that holds: not with vLLM or continuous
    batching, not for vision-language models, not without a ``max_completion_length``, and not
    where ``model.generate`` would apply anything beyond temperature and top-p to the logits (top-k,
    TRL's ``top_k: null`` included, which transformers makes 50; min-p; a repetition penalty;
    ``generation_kwargs``; or settings of the model's own generation_config.json such as
    ``no_repeat_ngram_size``): TRL's generation runs then, as before."""
    from trl.models import unwrap_model_for_generation

    from r1kit.sampling.decode import Nucleus, decode

    args = trainer.args
    if (
        trainer.use_vllm
        or trainer.use_transformers_continuous_batching
        or trainer._is_vlm
        or args.generation_kwargs
        or trainer.max_completion_length is None
    ):
        return False
    beyond = logits_processing_beyond_the_loop(trainer)
    if beyond:
        log.info("rollouts come from TRL's model.generate: r1kit's decoding loop does not apply %s", ", ".join(beyond))
        return False
    draw = Nucleus(args.temperature, args.top_p).draw
    eos_ids, pad_id = set(trainer.eos_token_ids), trainer._tokenizer.pad_token_id

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        prompts, counts = groups(prompt_ids)
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            ) as model
        ):
            return decode(model, prompts, counts, trainer.max_completion_length, draw, eos_ids, pad_id), None

    trainer._generate_single_turn = generate
    return True


def groups(prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Each distinct prompt once and how many generations it has: TRL's RepeatSampler puts a
    prompt's generations one after another."""
    prompts, counts = [], []
    for ids in prompt_ids:
        if prompts and prompts[-1] == ids:
            counts[-1] += 1
        else:
            prompts.append(ids)
            counts.append(1)
    return prompts, counts


def tool_rollouts(trainer, tools: list) -> None:
    """Generate rollouts that call `tools` (r1kit.sampling.tool_loop) as TRL's ``rollout_func``:
    TRL gets each rollout's tokens with the tools' outputs marked 0 in its tool mask (``env_mask``),
    so they are left out of the loss and the KL. On a CPU r1kit's decoding loop generates (in
    one bfloat16 autocast region with ``bf16``); with vLLM, TRL's colocated or server engine does,
    stopping at a block's closing fence. Refused on several processes with vLLM (the turns of one
    process would wait on another's)."""
    import contextlib

    import torch
    from trl.models import unwrap_model_for_generation

    from r1kit.sampling import tool_loop
    from r1kit.sampling.decode import Nucleus, decode

    args, tokenizer = trainer.args, trainer.processing_class
    eos_ids, pad_id = set(trainer.eos_token_ids), trainer._tokenizer.pad_token_id
    if trainer.use_vllm:
        if trainer.accelerator.num_processes > 1:
            raise RecipeError("tools with use_vllm run on one process for now; launch one process, or set use_vllm: false")
        trainer.vllm_generation.generation_kwargs = {**trainer.vllm_generation.generation_kwargs, "stop": [tools_lib.CLOSE],
                                                     "include_stop_str_in_output": True}

        def step(prompts, counts, max_tokens, stop):
            flat = [p for p, n in zip(prompts, counts) for _ in range(n)]
            _, completion_ids, _, _ = trainer.vllm_generation.generate(prompts=flat, images=None, num_generations=1)
            return [list(ids)[:max_tokens] for ids in completion_ids]
    else:
        beyond = logits_processing_beyond_the_loop(trainer)
        if beyond:
            log.warning("rollouts with tools come from r1kit's decoding loop, which does not apply %s", ", ".join(beyond))
        draw = Nucleus(args.temperature, args.top_p).draw
        on_cpu = args.bf16 and trainer.accelerator.device.type == "cpu"  # one autocast region a turn, as `autocast_rollouts`
        region = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16) if on_cpu else contextlib.nullcontext

        def step(prompts, counts, max_tokens, stop):
            unwrapped = unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            )
            with unwrapped as model, region():
                return decode(model, prompts, counts, max_tokens, draw, eos_ids, pad_id, stop)

    def rollout(prompts, trainer):
        ids = tokenizer(text=prompts)["input_ids"]
        distinct, counts = groups(ids)
        transcripts = tool_loop.rollouts(step, distinct, counts, trainer.max_completion_length, tools, tokenizer, eos_ids)
        mode = "train" if trainer.model.training else "eval"
        for key, value in tool_loop.metrics(transcripts).items():
            trainer._metrics[mode][key].append(value)
        return {"prompt_ids": ids, "completion_ids": [t.ids for t in transcripts], "logprobs": None,
                "env_mask": [t.mask for t in transcripts]}

    trainer.rollout_func = rollout


def logits_processing_beyond_the_loop(trainer) -> list[str]:
    """The logits processors TRL's ``model.generate`` call would apply other than temperature and
    top-p (the only ones r1kit's decoding loop applies), by transformers' own reckoning from TRL's
    generation config over the model's, and beam search or stop strings and time limits it would
    honour; on a transformers whose private helpers differ, a line saying so."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    model = trainer.accelerator.unwrap_model(trainer.model)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        config, _ = model._prepare_generation_config(trainer.generation_config)
        processors = model._get_logits_processor(config, device="cpu")
    except (AttributeError, TypeError) as e:
        return [f"a generation config it could not read ({type(e).__name__}: {e})"]
    beyond = [type(p).__name__ for p in processors if not isinstance(p, (TemperatureLogitsWarper, TopPLogitsWarper))]
    if (config.num_beams or 1) > 1:
        beyond.append(f"beam search (num_beams {config.num_beams})")
    beyond += [name for name in ("stop_strings", "max_time") if getattr(config, name, None)]  # stopping criteria
    return beyond


def autocast_rollouts(trainer) -> None:
    """Generate each rollout batch inside one bfloat16 autocast region on the CPU.

    With ``bf16`` on a CPU, accelerate wraps every forward call in an autocast region of its own,
    so each decoding step casts every weight to bfloat16 again and throws the copies away on the
    way out: rollouts get slower than in float32. Inside one outer region, nested regions keep
    autocast's cache of cast weights, so each is cast once per batch (the weights do not change
    while generating). The cache holds trainable weights only: a LoRA stage's frozen base is
    still cast at every step. The tokens are drawn from the same bfloat16-computed logits either
    way; log-probabilities and the loss are computed outside the region, as before."""
    import torch

    generate = trainer._generate_single_turn

    @functools.wraps(generate)
    def in_one_region(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return generate(*args, **kwargs)

    trainer._generate_single_turn = in_one_region


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

    def log_steps(self, trainer):
        """A callback adding each optimizer step's seconds to the figures `trainer` logs next."""
        from transformers import TrainerCallback

        clock = self

        class RewardSeconds(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                # The trainer's own per-step figures (step_time, ...) gather here; its log() averages them.
                for name, seconds in clock.step.items():
                    trainer._metrics["train"][f"reward_seconds/{name}"].append(seconds)
                clock.step = dict.fromkeys(clock.step, 0.0)

        return RewardSeconds()

    def totals(self) -> dict[str, float]:
        """``reward_seconds`` (all rewards) and ``reward_seconds/<name>``, over every call so far."""
        return {"reward_seconds": sum(self.total.values())} | {f"reward_seconds/{n}": s for n, s in self.total.items()}


def summarize(records: list[dict], rewards) -> dict[str, float]:
    """First and last logged value of the figures a reasoning-RL user watches."""
    out: dict[str, float] = {}
    keys = ["reward"] + [f"rewards/{reward_registry.for_trl(r).__name__}/mean" for r in rewards]
    keys += ["completions/mean_length", "completions/clipped_ratio"]
    for key in keys:
        values = [r[key] for r in records if key in r]
        if values:
            short = key.removeprefix("rewards/").removesuffix("/mean").replace("completions/", "")
            out[f"{short}_first"], out[f"{short}_last"] = values[0], values[-1]
    return out


def trainer_defaults(stage: GRPOStage) -> dict:
    """The paper's GRPO settings and the recipe's reward weights (as the registry reads them);
    with tools, no vLLM importance-sampling correction (a rollout's turns carry no sampling
    log-probabilities for it)."""
    rewards = reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")
    tools = {"vllm_importance_sampling_correction": False} if stage.tools else {}
    return {**PAPER_DEFAULTS, "reward_weights": [r.weight for r in rewards], **tools, **lora.trainer_defaults(stage)}


STAGE = StageKind(
    config=GRPOStage, run=run, trainer_config=lambda: __import__("trl").GRPOConfig, check=check, trainer_defaults=trainer_defaults
)
