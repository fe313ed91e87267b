"""What the pipeline's checks ask of a stage before anything runs, answered once per concern and
named in each stage kind's `StageKind` (r1kit.stages.base): the models and data sources it names,
the token budgets one sequence must hold, what this machine lacks for it, and where it asks for
bfloat16. The recipe loader, the pipeline's machine check and r1kit.hardware.precision call these
through the stage kind; none of them branches on a kind or looks for a field by name.

- sampling stages (rejection, eval: r1kit.sampling.base.EngineConfig and ``max_tokens``):
  `sampling_budgets`, `engine_problems`, `engine_bf16`, `server_problems`;
- training stages (a ``trainer:`` block passed to TRL): `trainer_budgets` (grpo's),
  `trainer_problems`, `trainer_bf16`;
- stages with a ``data:`` section: `data_sections`.

Not here: the checks themselves (r1kit.recipe, r1kit.pipeline), anything that loads a model.
"""

from __future__ import annotations

from r1kit.errors import RecipeError

import dataclasses
from typing import NamedTuple

BF16_NAMES = {"bfloat16", "torch.bfloat16", "bf16"}


class TokenBudgets(NamedTuple):
    """The token budgets a recipe sets for one sequence of a stage."""

    completion_key: str
    completion: int | None
    """Tokens a completion may take, where the recipe sets them (None: the stage's default)."""
    limit_key: str
    limit: int | None
    """vLLM's sequence limit, where the recipe sets one."""
    vllm: bool
    """Whether the limit applies (vLLM generates)."""


def model_refs(stage) -> list[tuple[str, str]]:
    """The stage's own ``model:``, when it names one (key, reference)."""
    return [("model", stage.model)] if stage.model else []


def data_sections(stage) -> list[tuple[str, object]]:
    """The stage's ``data:`` section and each of its ``also:`` sections (key, r1kit.config.DataConfig)."""
    return [("data", stage.data), *((f"data.also[{i}]", extra) for i, extra in enumerate(stage.data.also))]


def sampling_budgets(stage) -> TokenBudgets:
    """``max_tokens`` where the recipe changed it from the stage's default (the R1 protocol's
    32,768 end at the model's context), and vLLM's ``backend_options.max_model_len``."""
    default = {f.name: f.default for f in dataclasses.fields(stage)}["max_tokens"]
    completion = stage.max_tokens if stage.max_tokens != default else None
    return TokenBudgets("max_tokens", completion, "backend_options.max_model_len", stage.backend_options.get("max_model_len"), True)


def trainer_budgets(stage) -> TokenBudgets:
    """TRL's ``max_completion_length`` and ``vllm_max_model_length``, as the trainer block sets them."""
    trainer = stage.trainer
    return TokenBudgets("trainer.max_completion_length", trainer.get("max_completion_length"),
                        "trainer.vllm_max_model_length", trainer.get("vllm_max_model_length"), bool(trainer.get("use_vllm")))


def check_engine(stage) -> None:
    """A sampling stage's engine settings, as far as they can be checked without asking anything:
    the served model's (r1kit.sampling.base.Endpoint.problem), and what a chat endpoint cannot do."""
    problem = stage.endpoint.problem(stage.backend)
    if problem is None and stage.backend == "endpoint" and stage.endpoint.chat and getattr(stage, "think_prefill", False):
        problem = "endpoint.chat: the server writes the assistant's turn, so r1kit cannot prefill <think>; set think_prefill: false or chat: false"
    if problem is None and stage.backend == "endpoint" and stage.endpoint.chat and getattr(stage, "tools", None):
        problem = "endpoint.chat: tool rollouts continue r1kit's own prompt; use the completions endpoint (chat: false)"
    if problem:
        raise RecipeError(f"{stage.name}.{problem}")


def engine_problems(stage, gpu: bool) -> list[str]:
    """A sampling stage whose ``backend: vllm`` (or vllm_server) is not installed here, or whose
    served model's API key variable is not set."""
    from r1kit.sampling import VLLM_MISSING, vllm_available

    if stage.backend in ("vllm", "vllm_server") and not vllm_available():
        return [f"{stage.name}.backend: {VLLM_MISSING}; or set backend: transformers (auto takes vLLM on a GPU when it is installed)"]
    if stage.backend == "endpoint":
        if lacking := stage.endpoint.machine_problem():
            return [f"{stage.name}.{lacking}"]
    return []


def server_problems(stage, start=None) -> list[str]:
    """A sampling stage's served model (``backend: endpoint``) that does not answer, refuses the
    key or does not serve the named model: every URL is asked which models it serves
    (r1kit.pipeline.preflight). The served name is the endpoint's or the stage's ``model``, not
    the starting model `start`."""
    from r1kit.sampling.endpoint import EndpointError, probe

    if stage.backend != "endpoint" or stage.endpoint.machine_problem():
        return []
    try:
        probe(stage.endpoint, stage.endpoint.name or stage.model)
    except EndpointError as exc:
        return [f"{stage.name}.endpoint: {exc}"]
    return []


def trainer_problems(stage, gpu: bool) -> list[str]:
    """A training stage asking TRL to generate with vLLM where it cannot."""
    from r1kit.sampling import vllm_available

    if not stage.trainer.get("use_vllm"):
        return []
    if not gpu:
        return [f"{stage.name}.trainer.use_vllm: TRL generates with vLLM on CUDA GPUs only, and this machine has none; "
                f"set {stage.name}.trainer.use_vllm=false to generate with transformers"]
    if not vllm_available():
        return [f"{stage.name}.trainer.use_vllm: vllm is not installed here (pip install vllm), or set use_vllm: false"]
    return []


def engine_bf16(stage) -> dict[str, bool]:
    """Whether a sampling stage asks its backend for bfloat16 weights."""
    return {"backend_options.dtype": str(stage.backend_options.get("dtype")) in BF16_NAMES}


def trainer_bf16(stage) -> dict[str, bool]:
    """Whether a training stage asks TRL for bfloat16 autocast or weights."""
    trainer = stage.trainer
    return {"trainer.bf16": trainer.get("bf16") is True,
            "trainer.model_init_kwargs.dtype": str((trainer.get("model_init_kwargs") or {}).get("dtype")) in BF16_NAMES,
            "trainer.dtype": str(trainer.get("dtype")) in BF16_NAMES}  # AsyncGRPOConfig's (async_engine: trl)
