"""The `sft` stage: supervised fine-tuning with `trl.SFTTrainer` (cold start, or SFT on kept samples).

    - name: cold_start
      kind: sft
      data: {source: data/cot.jsonl}          # rows with `messages`, or `prompt` + `completion`
      trainer: {max_steps: 400, learning_rate: 1.0e-4}   # trl.SFTConfig fields, as they are

Conversation rows (a `messages` list) train on the chat template; prompt/completion rows train on
the completion only (TRL's completion-only loss), plain text or conversations (a turn of a game
with an environment: the conversation so far, the model's next turn, and a ``tools`` column the
chat template shows). Column names come from the ``data:`` section.
The trained model is saved to ``<stage>/model`` and handed to the next stage; checkpoints go to
``<stage>/checkpoints`` and an interrupted stage resumes from the last one.

Conversations that hold an environment's turns (``tool`` turns, or the rows a rejection stage
kept from an environment's episodes: `from_an_environment`) train on the model's turns only:
TRL's ``assistant_only_loss`` is on by default there (the chat template marks the model's turns
with ``{% generation %}``; TRL adds the marks to the templates it knows; the stage refuses a
template with neither). Other conversations train on every turn unless the recipe says otherwise.

Rows whose completions hold tool calls (r1kit.execution.tools: a code block, then the ``output`` block a
tool wrote) train on what the model writes only: the output blocks' tokens are left out of the
loss (`mask_tool_outputs`), as in a grpo stage with tools, so the model learns to call the tool
and read its output, not to guess what it will print.

With ``peft:`` (and optionally ``quantization:``) the stage trains a LoRA adapter and hands on
the merged model (see r1kit.trainers.lora).

Not here: packing heuristics or custom losses; set SFTConfig fields for those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from r1kit import data as data_lib
from r1kit.trainers import lora
from r1kit.config import DataConfig, StageConfig
from r1kit.errors import RecipeError
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult
from r1kit.trainers.training import checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, trainer_args, train_and_save

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SFTStage(StageConfig, lora.LoraFields):
    data: DataConfig
    """Training rows: `messages` conversations, or `prompt` + `completion` pairs."""
    format: Literal["auto", "messages", "prompt_completion"] = "auto"
    """Which rows to train on; `auto` takes messages when the column exists."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.SFTConfig, passed through."""


def _training_rows(ctx: StageContext):
    """The stage's rows, renamed to what TRL reads, and whether they are conversations with an
    environment (`from_an_environment`)."""
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
    if "tools" in ds.column_names:  # the tools a conversation's chat template shows (an environment's, as JSON)
        keep["tools"] = "tools"
    played = fmt == "messages" and from_an_environment(ds, cfg.messages)
    ds = ds.select_columns(list(keep))
    return ds.rename_columns({k: v for k, v in keep.items() if k != v}), played


def run(ctx: StageContext) -> StageResult:
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows, played = _training_rows(ctx)
    tokenizer = AutoTokenizer.from_pretrained(ctx.model)
    if ctx.stage.trainer.get("assistant_only_loss", played) and (problem := marks_problem(tokenizer)):
        why = "" if "assistant_only_loss" in ctx.stage.trainer else " (on by default: the conversations hold an environment's turns)"
        raise RecipeError(f"{ctx.stage.name}.trainer.assistant_only_loss{why}: {ctx.model}: {problem}")
    if played and "assistant_only_loss" not in ctx.stage.trainer:
        log.info("%s: the conversations hold an environment's turns: training on the model's turns only", ctx.stage.name)
    args = trainer_args(SFTConfig, ctx, **trainer_defaults(ctx.stage), **({"assistant_only_loss": True} if played else {}))
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
    trainer.train_dataset = mask_tool_outputs(trainer.train_dataset, tokenizer)
    sizes = lora.parameters(trainer.model)
    out = train_and_save(trainer, ctx)
    losses = [r["loss"] for r in read_metrics(metrics_path) if "loss" in r]
    metrics = {"rows": len(rows), **sizes}
    if losses:
        metrics |= {"first_loss": losses[0], "last_loss": losses[-1]}
    return StageResult(model=out, metrics=metrics)


def from_an_environment(ds, column: str) -> bool:
    """Whether the conversations in `column` hold an environment's turns: rows a rejection stage
    kept from episodes (an ``episode`` column; a gym-style environment replies in user turns), or
    conversations with ``tool`` turns (the first 256 rows looked at). Other multi-turn chats are not."""
    if "episode" in ds.column_names:
        return True
    return any(m["role"] == "tool" for conversation in ds.select(range(min(len(ds), 256)))[column] for m in conversation)


def marks_problem(tokenizer) -> str | None:
    """Why the chat template cannot mark the model's turns for TRL's assistant-only loss (no
    ``{% generation %}`` markers, and not a template TRL knows how to add them to), or None."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    template = template.get("default") if isinstance(template, dict) else template
    if template:
        if has_generation_markers(template):
            return None
        try:
            get_training_chat_template(tokenizer)  # a template TRL knows: it adds the markers itself
            return None
        except ValueError:
            pass
    return ("training on the model's turns only needs a chat template with {% generation %} markers, and this one "
            "has none that TRL can add; add them, or set trainer.assistant_only_loss: false to train on every turn")


def local_check(stage: SFTStage, tokenizers: dict) -> None:
    """``trainer.assistant_only_loss: true`` on a model whose tokenizer is known before the run."""
    if stage.trainer.get("assistant_only_loss") and "model" in tokenizers:
        name, load = tokenizers["model"]
        if problem := marks_problem(load()):
            raise RecipeError(f"{stage.name}.trainer.assistant_only_loss: {name}: {problem}")


def mask_tool_outputs(dataset, tokenizer):
    """`dataset` (tokenized by TRL, with ``labels``) with the tokens of each tool output block
    (r1kit.text.tool_output_spans) out of the loss: label -100 for each token that lies wholly
    inside one. Unchanged when no row holds a tool call."""
    from r1kit.text import OUTPUT_FENCE, tool_output_spans

    if not any(OUTPUT_FENCE in tokenizer.decode(row["input_ids"]) for row in dataset.select(range(min(len(dataset), 256)))):
        return dataset

    def mask(row):
        ids, labels = row["input_ids"], list(row["labels"])
        ends = [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]  # each token's end in the decoded text
        spans = tool_output_spans(tokenizer.decode(ids))
        for k, end in enumerate(ends):
            start = ends[k - 1] if k else 0
            if any(a <= start and end <= b for a, b in spans):
                labels[k] = -100
        return {"labels": labels}

    log.info("tool output blocks in the training rows: their tokens are left out of the loss")
    return dataset.map(mask, desc="Masking tool outputs")


DEFAULTS = {"logging_steps": 10}


def trainer_defaults(stage: SFTStage) -> dict:
    return DEFAULTS | lora.trainer_defaults(stage)


STAGE = StageKind(
    config=SFTStage, run=run, trainer_config=lambda stage: __import__("trl").SFTConfig, check=lora.check, trainer_defaults=trainer_defaults,
    data=hooks.data_sections, machine_problems=lambda stage, machine: hooks.trainer_problems(stage, machine) + lora.machine_problems(stage, machine),
    bf16=hooks.trainer_bf16, local_check=local_check,
)
