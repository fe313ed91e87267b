"""LoRA and QLoRA for the training stages (``sft``, ``grpo``): the ``peft:`` and ``quantization:`` blocks.

    - name: rl
      kind: grpo
      peft: {r: 16, lora_alpha: 32}                  # peft.LoraConfig fields, as they are
      quantization: {load_in_4bit: true, bnb_4bit_quant_type: nf4}   # transformers.BitsAndBytesConfig

- A stage with ``peft:`` (an empty mapping ``peft: {}`` is enough; a bare ``peft:`` is null, which
  means no adapter) trains a fresh LoRA adapter on its start
  model through the trainer's ``peft_config``; its frozen base loads in the precision it is
  stored in (`trainer_defaults`). r1kit's defaults, under the recipe's fields:
  ``task_type: CAUSAL_LM`` and ``target_modules: all-linear`` (every linear layer, MLPs
  included: "LoRA Without Regret", Schulman et al. 2025, finds attention-only LoRA falls
  behind full fine-tuning). The fields are checked like ``trainer:`` fields, and
  ``peft.LoraConfig`` is built at validate time so its own checks run before any compute.
- When the stage ends, its adapter is saved to ``<stage>/adapter`` and merged into a fresh
  copy of the start model's own weights (full precision after QLoRA too), saved as
  ``<stage>/model``: the next stage, rejection
  sampling, evaluation and vLLM take that folder as any model, and a later LoRA stage starts a
  new adapter on it. A resumed stage continues from its newest adapter checkpoint (the
  trainer's own resume).
- ``quantization:`` loads the frozen base weights in 4 or 8 bits (bitsandbytes; QLoRA with
  ``load_in_4bit``). It needs ``peft:`` (quantized weights are not trained) and a CUDA GPU:
  r1kit.pipeline refuses it on other machines before the run starts.
- `parameters(model)`: trainable and total parameter counts and the trained weights' dtype,
  which every training stage records (``trainable_params``, ``total_params``,
  ``trained_dtype``) for the run report.

Not here: PEFT methods other than LoRA, and adapter-only hand-off (later stages take merged
folders, so nothing downstream needs peft).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

from r1kit.errors import RecipeError, suggest

log = logging.getLogger("r1kit")

DEFAULTS: dict[str, Any] = {"task_type": "CAUSAL_LM", "target_modules": "all-linear"}


def check_peft(stage) -> None:
    """Check a stage's ``peft:`` block (names, types and peft's own consistency checks); converts it in place."""
    from r1kit.config import check_trainer_block

    if stage.peft is not None:
        from peft import LoraConfig

        stage.peft = check_trainer_block(LoraConfig, stage.peft, f"{stage.name}.peft")
        try:
            lora_config(stage)
        except (ValueError, TypeError) as exc:
            raise RecipeError(f"{stage.name}.peft: {' '.join(str(exc).split())}") from None


def check(stage) -> None:
    """Check a stage's ``peft:`` and ``quantization:`` blocks (names, types and the libraries'
    own consistency checks); converts them in place. Quantized weights are refused beside TRL's
    vLLM generation: TRL 1.16 merges the adapter into the 4-bit base and sends vLLM the
    dequantized weights, which vLLM's loader refuses or rounds (TRL issues 4973 and 3466)."""
    check_peft(stage)
    if stage.quantization is not None:
        if stage.trainer.get("use_vllm"):
            raise RecipeError(f"{stage.name}.quantization: not with trainer.use_vllm: TRL merges the adapter into the 4-bit "
                              "base and syncs dequantized weights that vLLM refuses (TRL issue 4973); set "
                              "trainer.use_vllm: false, or train LoRA on full-precision weights")
        if stage.peft is None:
            raise RecipeError(f"{stage.name}.quantization: quantized weights are frozen; add a peft: block to train a LoRA adapter on them")
        if not isinstance(stage.quantization, dict):
            raise RecipeError(f"{stage.name}.quantization: expected a mapping of transformers.BitsAndBytesConfig fields")
        from transformers import BitsAndBytesConfig

        names = [p for p in inspect.signature(BitsAndBytesConfig.__init__).parameters if p not in ("self", "kwargs")]
        for key in stage.quantization:
            if key not in names:
                raise RecipeError(f"{stage.name}.quantization: {key!r} is not a field of transformers.BitsAndBytesConfig{suggest(str(key), names)}")
        if not (stage.quantization.get("load_in_4bit") or stage.quantization.get("load_in_8bit")):
            raise RecipeError(f"{stage.name}.quantization: set load_in_4bit: true (QLoRA) or load_in_8bit: true")
        try:
            BitsAndBytesConfig(**stage.quantization)
        except (ValueError, TypeError, AttributeError) as exc:  # AttributeError: a dtype name torch lacks
            raise RecipeError(f"{stage.name}.quantization: {' '.join(str(exc).split())}") from None


def trainer_defaults(stage) -> dict[str, Any]:
    """r1kit's trainer defaults for a LoRA stage: its frozen base keeps the precision it is stored
    in (``model_init_kwargs: {dtype: auto}``; TRL would load float32), while peft keeps the
    trained adapter in float32. Without ``peft:`` nothing: the weights train in float32."""
    return {"model_init_kwargs": {"dtype": "auto"}} if stage.peft is not None else {}


def machine_problems(stage, machine) -> list[str]:
    """A ``quantization:`` block where 4- and 8-bit weights cannot load (no CUDA GPU, or no bitsandbytes)."""
    import importlib.util

    if stage.quantization is None:
        return []
    if not machine.gpu:
        return [f"{stage.name}.quantization: 4- and 8-bit weights (bitsandbytes) need a CUDA GPU, and this machine has none; "
                "remove the quantization block to train LoRA on full-precision weights"]
    if importlib.util.find_spec("bitsandbytes") is None:
        return [f"{stage.name}.quantization: bitsandbytes is not installed here (pip install 'r1kit[qlora]')"]
    return []


def enabled(stage) -> bool:
    """Whether the stage trains a LoRA adapter (a stage kind with a ``peft:`` block that sets one)."""
    return isinstance(stage, LoraFields) and stage.peft is not None


def lora_config(stage):
    """The stage's `peft.LoraConfig` (r1kit's defaults under the recipe's fields), or None."""
    if stage.peft is None:
        return None
    from peft import LoraConfig

    return LoraConfig(**{**DEFAULTS, **stage.peft})


def quantization_config(stage):
    """The stage's `transformers.BitsAndBytesConfig` for the trainer's ``quantization_config``, or None."""
    if stage.quantization is None:
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**stage.quantization)


def parameters(model) -> dict:
    """Trainable and total parameters of `model` (a LoRA model counts its frozen base too; peft's
    own count unpacks 4-bit weights, and a ZeRO-3 partitioned parameter counts whole), and the
    dtype the trained weights are kept in (the optimizer's master weights)."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad})
    out = {"trained_dtype": ",".join(dtypes)}
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        return out | {"trainable_params": int(trainable), "total_params": int(total)}
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in model.parameters()]
    return out | {"trainable_params": sum(n for n, grad in sizes if grad), "total_params": sum(n for n, _ in sizes)}


def save_merged(trainer, ctx, tokenizer=None) -> str:
    """Save the trained adapter to ``<stage>/adapter`` and the start model with it merged to
    ``<stage>/model`` with `tokenizer` (default: the trainer's; main process); returns the model folder."""
    adapter, out = ctx.dir / "adapter", ctx.dir / "model"
    trainer.save_model(str(adapter))
    if ctx.is_main:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        # Merged from the saved adapter into the start model's own weights, loaded afresh on the
        # CPU in their own precision: right after QLoRA (not the 4-bit copy) and under ZeRO-3 or
        # FSDP (where this process holds only a shard of the trained model).
        base = AutoModelForCausalLM.from_pretrained(ctx.model, dtype="auto", device_map="cpu")
        with torch.no_grad():
            merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
        merged.save_pretrained(str(out))
        (tokenizer or trainer.processing_class).save_pretrained(str(out))
        log.info("%s: adapter in %s, merged model in %s", ctx.stage.name, adapter, out)
    return str(out)


@dataclass(kw_only=True)
class LoraFields:
    """The recipe fields of a stage that can train a LoRA adapter (sft, grpo)."""

    peft: dict[str, Any] | None = None
    """Fields of peft.LoraConfig: train a LoRA adapter instead of every weight (see r1kit.trainers.lora)."""
    quantization: dict[str, Any] | None = None
    """Fields of transformers.BitsAndBytesConfig: 4- or 8-bit base weights under the adapter (CUDA only)."""
