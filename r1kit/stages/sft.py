"""The `sft` stage: supervised fine-tuning with `trl.SFTTrainer` (cold start, or SFT on kept samples).

    - name: cold_start
      kind: sft
      data: {source: data/cot.jsonl}          # rows with `messages`, or `prompt` + `completion`
      trainer: {max_steps: 400, learning_rate: 1.0e-4}   # trl.SFTConfig fields, as they are

Conversation rows (a `messages` list) train on the chat template; prompt/completion rows train on
the completion only (TRL's completion-only loss). Column names come from the ``data:`` section.
The trained model is saved to ``<stage>/model`` and handed to the next stage; checkpoints go to
``<stage>/checkpoints`` and an interrupted stage resumes from the last one.

With ``peft:`` (and optionally ``quantization:``) the stage trains a LoRA adapter and hands on
the merged model (see r1kit.lora).

Not here: packing heuristics or custom losses; set SFTConfig fields for those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from r1kit import data as data_lib
from r1kit import lora
from r1kit.config import DataConfig, StageConfig
from r1kit.stages.base import StageContext, StageKind, StageResult
from r1kit.training import checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, trainer_args, train_and_save


@dataclass(kw_only=True)
class SFTStage(StageConfig, lora.LoraFields):
    data: DataConfig
    """Training rows: `messages` conversations, or `prompt` + `completion` pairs."""
    format: Literal["auto", "messages", "prompt_completion"] = "auto"
    """Which rows to train on; `auto` takes messages when the column exists."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.SFTConfig, passed through."""


def _training_rows(ctx: StageContext):
    cfg = ctx.stage.data
    ds = data_lib.load_rows(cfg, ctx)
    source = ctx.resolve_data_source(cfg.source)
    what = f"sft stage {ctx.stage.name!r}"
    fmt = ctx.stage.format
    if fmt == "auto":
        fmt = "messages" if cfg.messages in ds.column_names else "prompt_completion"
    if fmt == "messages":
        data_lib.require_columns(ds, [cfg.messages], source, what)
        keep = {cfg.messages: "messages"}
    else:
        data_lib.require_columns(ds, [cfg.prompt, cfg.completion], source, what)
        keep = {cfg.prompt: "prompt", cfg.completion: "completion"}
    ds = ds.select_columns(list(keep))
    return ds.rename_columns({k: v for k, v in keep.items() if k != v})


def run(ctx: StageContext) -> StageResult:
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = _training_rows(ctx)
    args = trainer_args(SFTConfig, ctx, **trainer_defaults(ctx.stage))
    tokenizer = AutoTokenizer.from_pretrained(ctx.model)
    checkpoint = last_checkpoint(ctx)
    metrics_path = ctx.dir / "metrics.jsonl"
    callback = make_metrics_log(metrics_path, checkpoint_step(checkpoint) if checkpoint else None, ctx.is_main)
    trainer = SFTTrainer(
        model=ctx.model,  # TRL builds it: float32 master weights, args.model_init_kwargs applied
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        callbacks=[callback],
        peft_config=lora.lora_config(ctx.stage),
        quantization_config=lora.quantization_config(ctx.stage),
    )
    sizes = lora.parameters(trainer.model)
    out = train_and_save(trainer, ctx)
    losses = [r["loss"] for r in read_metrics(metrics_path) if "loss" in r]
    metrics = {"rows": len(rows), **sizes}
    if losses:
        metrics |= {"first_loss": losses[0], "last_loss": losses[-1]}
    return StageResult(model=out, metrics=metrics)


DEFAULTS = {"logging_steps": 10}


def trainer_defaults(stage: SFTStage) -> dict:
    return DEFAULTS | lora.trainer_defaults(stage)


STAGE = StageKind(
    config=SFTStage, run=run, trainer_config=lambda: __import__("trl").SFTConfig, check=lora.check, trainer_defaults=trainer_defaults
)
