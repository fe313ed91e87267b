"""What the pipeline's checks ask of a stage before anything runs, answered once per concern and
named in each stage kind's `StageKind` (r1kit.stages.base): the models and data sources it names,
the token budgets one sequence must hold, what this machine lacks for it, and where it asks for
bfloat16. The recipe loader, the pipeline's machine check and r1kit.hardware.precision call these
through the stage kind; none of them branches on a kind or looks for a field by name.

- sampling stages (rejection, eval: r1kit.sampling.base.EngineConfig and ``max_tokens``):
  `check_engine`, `sampling_budgets`, `engine_problems`, `engine_bf16`, `server_problems`, each
  asking the backend's record (r1kit.sampling.backends);
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


def check_engine(stage, prefill: bool = False, tools: bool = False) -> None:
    """A sampling stage's engine settings, as far as they can be checked without asking anything:
    its backend's refusals (r1kit.sampling.backends.settings_problem) of its served-model settings,
    of a <think> prefill (`prefill`) and of tool rollouts (`tools`), as the stage kind says it asks."""
    from r1kit.sampling import backends

    if problem := backends.settings_problem(stage.backend, stage.endpoint, prefill, tools):
        raise RecipeError(f"{stage.name}.{problem}")


def engine_problems(stage, machine) -> list[str]:
    """What this machine lacks for a sampling stage's backend (vLLM that imports, a served model's
    API key variable), as the backend's record says."""
    from r1kit.sampling import backends, resolve_backend

    lacking = backends.get(resolve_backend(stage.backend)).machine_problem(stage.endpoint)
    return [f"{stage.name}.{lacking}"] if lacking else []


def server_problems(stage, start=None) -> list[str]:
    """A sampling stage's served model that does not answer, refuses the key or does not serve the
    named model, as its backend's record asks (r1kit.pipeline.preflight). The served name is the
    endpoint's or the stage's ``model``, not the starting model `start`."""
    from r1kit.sampling import backends

    problem = backends.get(stage.backend).server_problem(stage.endpoint, stage.endpoint.name or stage.model)
    return [f"{stage.name}.{problem}"] if problem else []


def trainer_problems(stage, machine) -> list[str]:
    """A training stage asking TRL to generate with vLLM where it cannot."""
    if not stage.trainer.get("use_vllm"):
        return []
    if not machine.gpu:
        return [f"{stage.name}.trainer.use_vllm: TRL generates with vLLM on CUDA GPUs only, and this machine has none; "
                f"set {stage.name}.trainer.use_vllm=false to generate with transformers"]
    from r1kit.sampling.vllm_backend import vllm_problem

    if lacking := vllm_problem():
        return [f"{stage.name}.trainer.use_vllm: {lacking}; or set use_vllm: false"]
    return []


def engine_bf16(stage) -> dict[str, bool]:
    """Whether a sampling stage asks its backend for bfloat16 weights."""
    return {"backend_options.dtype": str(stage.backend_options.get("dtype")) in BF16_NAMES}


def trainer_bf16(stage) -> dict[str, bool]:
    """Whether a training stage asks TRL for bfloat16 autocast or weights."""
    trainer = stage.trainer
    return {"trainer.bf16": trainer.get("bf16") is True,
            "trainer.model_init_kwargs.dtype": str((trainer.get("model_init_kwargs") or {}).get("dtype")) in BF16_NAMES}
