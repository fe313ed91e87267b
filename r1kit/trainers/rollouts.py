"""The rollout seam: where r1kit's decoding loop (r1kit.sampling.decode) stands in for a TRL
trainer's generation, for the grpo stage's rollouts, its tool rollouts and the distill stage's
student samples alike.

- `refusals(trainer, **more)`: the one guard. r1kit's loop draws from temperature and top-p alone,
  so it may stand in only where TRL's ``model.generate`` would apply nothing more: not with vLLM,
  not for vision-language models, not with ``generation_kwargs`` or without a
  ``max_completion_length``, and not where transformers, reading TRL's generation config over the
  model's own ``generation_config.json``, would add a logits processor (top-k, TRL's ``top_k:
  null`` included, which transformers makes 50; min-p; a repetition penalty; ``no_repeat_ngram_size``
  ...), beam search, stop strings or a time limit. Empty when the loop may stand in.
- `loop_step(trainer)`: a step function over the trainer's current weights (unwrapped for
  generation as TRL does), drawing with the trainer's temperature and top-p, each call in
  `generation_region` (one bfloat16 autocast region with ``bf16`` on a CPU).
- `tool_rollout_func(trainer, tools)`: TRL's ``rollout_func`` for rollouts that call tools
  (r1kit.sampling.tool_loop), with r1kit's loop or, with ``use_vllm``, TRL's vLLM engine;
  `env_rollout_func(trainer, specs)` the same for gym-style environments.

The trainer subclasses in r1kit.trainers.trl_overrides call these; nothing else here touches TRL's
objects beyond reading them.

Not here: the decoding loop itself (r1kit.sampling.decode), the turn loop of tool rollouts
(r1kit.sampling.tool_loop), the loss.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from r1kit.errors import RecipeError
from r1kit.execution import tools as tools_lib

# A step function: (distinct prompts' ids, generations of each, max new tokens, stop sequences or
# None) -> each generation's new token ids, the prompts' generations one after another.
Step = Callable[[list[list[int]], list[int], int, "list[list[int]] | None"], list[list[int]]]


def refusals(trainer, **more: bool) -> list[str]:
    """Why r1kit's loop may not stand in for `trainer`'s generation (empty: it may). `more` adds
    the trainer kind's own reasons, each a name that is true where it refuses."""
    args = trainer.args
    found = [name for name, refuses in {
        "use_vllm": trainer.use_vllm,
        "a vision-language model": trainer._is_vlm,
        "generation_kwargs": bool(args.generation_kwargs),
        "no max_completion_length": trainer.max_completion_length is None,
        **more,
    }.items() if refuses]
    return found or logits_processing_beyond_the_loop(trainer)


def logits_processing_beyond_the_loop(trainer) -> list[str]:
    """The logits processors TRL's ``model.generate`` call would apply other than temperature and
    top-p (the only ones r1kit's decoding loop applies), by transformers' own reckoning from TRL's
    generation config over the model's, and beam search or stop strings and time limits it would
    honour; on a transformers whose private helpers differ, a line saying so."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    model = trainer.accelerator.unwrap_model(trainer.model)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model
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


def generation_region(trainer):
    """The region a generation call runs in: with ``bf16`` on a CPU, one bfloat16 autocast region.

    There accelerate wraps every forward call in an autocast region of its own, so each decoding
    step would cast every weight to bfloat16 again and throw the copies away: inside one outer
    region per call, nested regions keep autocast's cache of cast weights, so each is cast once per
    batch (the weights do not change while generating). The cache holds trainable weights only: a
    LoRA stage's frozen base is still cast at every step. The tokens are drawn from the same
    bfloat16-computed logits either way."""
    import torch

    if trainer.args.bf16 and trainer.accelerator.device.type == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loop_step(trainer) -> Step:
    """r1kit's decoding loop (r1kit.sampling.decode.Step) over `trainer`'s current weights,
    with its temperature and top-p, each call in `generation_region` with the model unwrapped
    for generation as TRL does."""
    from trl.models import unwrap_model_for_generation

    from r1kit.sampling import decode, draws

    args = trainer.args

    @contextlib.contextmanager
    def region():  # yields the model as it is now
        with generation_region(trainer), unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ) as model:
            yield model

    return decode.Step(None, draws.Nucleus(args.temperature, args.top_p).draw, set(trainer.eos_token_ids),
                       trainer._tokenizer.pad_token_id, region)


def vllm_step(trainer, stop: list[str]) -> Step:
    """A step function on TRL's colocated or server vLLM engine, each turn ending at `stop` or
    the end of the sequence; one process only (the turns of one would wait on another's)."""
    if trainer.accelerator.num_processes > 1:
        raise RecipeError("multi-turn rollouts with use_vllm run on one process for now; launch one process, or set use_vllm: false")
    trainer.vllm_generation.generation_kwargs = {**trainer.vllm_generation.generation_kwargs, "stop": stop or None,
                                                 "include_stop_str_in_output": True}

    def step(prompts, counts, max_tokens, stop=None):
        flat = [p for p, n in zip(prompts, counts) for _ in range(n)]
        _, completion_ids, _, _ = trainer.vllm_generation.generate(prompts=flat, images=None, num_generations=1)
        return [list(ids)[:max_tokens] for ids in completion_ids]

    return step


def env_rollout_func(trainer, specs: list, loop: bool) -> Callable:
    """TRL's ``rollout_func`` for gym-style environments (``step``, no tools: TRL's own loop plays
    function calls only): r1kit's turn loop with r1kit.environments.episodes.Episodes as its
    world, each rollout's environment reset from its row (``trainer.batch_rows``). TRL gets the
    environment's tokens marked 0 in its tool mask and the episode records as ``env_records``
    (for r1kit.environments.episodes.trl_reward). With `loop` r1kit's decoding loop generates the
    turns, else TRL's vLLM engine."""
    from r1kit.environments.episodes import Episodes
    from r1kit.sampling import tool_loop

    tokenizer = trainer.processing_class
    eos_ids = set(trainer.eos_token_ids)
    step = loop_step(trainer) if loop else vllm_step(trainer, [])

    def rollout(prompts, trainer):
        episodes = Episodes(specs, tokenizer)
        episodes.start_conversations(trainer.batch_rows, prompts)
        transcripts = tool_loop.rollouts(step, episodes.prompts, [1] * len(prompts), trainer.max_completion_length, episodes,
                                         tokenizer, eos_ids)
        return {"prompt_ids": episodes.prompts, "completion_ids": [t.ids for t in transcripts], "logprobs": None,
                "env_mask": [t.mask for t in transcripts], "env_records": episodes.records([t.turns for t in transcripts])}

    return rollout


def tool_rollout_func(trainer, tools: list, loop: bool) -> Callable:
    """TRL's ``rollout_func`` for rollouts that call `tools` (r1kit.sampling.tool_loop): TRL gets
    each rollout's tokens with the tools' outputs marked 0 in its tool mask (``env_mask``), so they
    are left out of the loss and the KL. With `loop` r1kit's decoding loop generates the turns;
    else (``use_vllm``) TRL's colocated or server engine does, stopping at a block's closing fence.
    Refused on several processes with vLLM (the turns of one process would wait on another's)."""
    from r1kit.sampling import tool_loop

    tokenizer = trainer.processing_class
    eos_ids = set(trainer.eos_token_ids)
    step = loop_step(trainer) if loop else vllm_step(trainer, [tools_lib.CLOSE])

    def rollout(prompts, trainer):
        ids = tokenizer(text=prompts)["input_ids"]
        distinct, counts = groups(ids)
        transcripts = tool_loop.rollouts(step, distinct, counts, trainer.max_completion_length, tools, tokenizer, eos_ids)
        mode = "train" if trainer.model.training else "eval"
        for key, value in tool_loop.metrics(transcripts).items():
            trainer._metrics[mode][key].append(value)
        return {"prompt_ids": ids, "completion_ids": [t.ids for t in transcripts], "logprobs": None,
                "env_mask": [t.mask for t in transcripts]}

    return rollout
