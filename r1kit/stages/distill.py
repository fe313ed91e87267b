"""The `distill` stage: on-policy distillation. The student samples completions of the prompts and
learns to match the teacher's next-token distribution on every token it wrote.

    - name: distill
      kind: distill
      model: tiny:student                 # the student (default: the previous stage's model)
      teacher: rl                         # an earlier stage's model, a folder, a hub id, tiny or tiny:NAME
      template: plain
      data: {source: "task:last_digit", task: {n: 2000}}
      trainer: {max_steps: 100, max_completion_length: 64, beta: 1.0}   # trl.DistillationConfig fields

The loss is TRL's generalized Jensen-Shannon divergence over the completion tokens (Agarwal et
al. 2024, "On-Policy Distillation of Language Models", GKD): ``beta: 1.0``, the default, is the
per-token reverse KL(student || teacher) of on-policy distillation (Thinking Machines Lab, "On-Policy
Distillation", 2025), ``0.0`` the forward KL, values between the generalized JSD. Only the
student's completion tokens carry loss; the prompt does not, and the teacher gets no gradient.

TRL's `DistillationTrainer` does the sampling (transformers' generate, or vLLM with
``use_vllm``; on a CPU r1kit's decoding loop where it may stand in, through r1kit's subclass in
r1kit.trainers.trl_overrides, checked against the installed TRL before any model loads), the
teacher's forward pass, the loss and checkpoints; its config fields pass through ``trainer:``. r1kit adds what a recipe needs around it: the teacher named like any model
of the run (an earlier stage included), the prompts rendered by r1kit's template, a teacher and
student whose tokenizers differ (or, with the chat template, whose chat templates differ) refused
in one line before any model is loaded, metrics.jsonl, and resume from the last checkpoint.

Off-policy distillation (R1 section 2.4: SFT on a teacher's verified samples) needs no stage of
its own: a rejection stage with ``model: TEACHER`` and an sft stage with ``model: STUDENT`` on its
samples (see recipes/r1_distill.yaml).

Not here: rewards in the loss (this is distillation, not RL), teachers behind a server.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from r1kit import templates

from r1kit.trainers import lora
from r1kit.config import DataConfig, StageConfig
from r1kit.errors import RecipeError
from r1kit.stages import grpo
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult
from r1kit.templates import Prompting
from r1kit.models import resolve
from r1kit.trainers.training import checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, trainer_args, train_and_save

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class DistillStage(StageConfig, Prompting):
    teacher: str
    """The teacher: an earlier stage's name, a model folder or hub id, tiny or tiny:NAME. It must
    share the student's tokenizer."""
    data: DataConfig
    """Prompts the student completes; other columns are not used."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.DistillationConfig, passed through (beta 1.0: reverse KL)."""


def check(stage: DistillStage) -> None:
    problem = templates.check(stage.template)
    if problem:
        raise RecipeError(f"{stage.name}.template: {problem}")


def local_check(stage: DistillStage, tokenizers: dict) -> None:
    """The student's and the teacher's tokenizers, where both are known before the run (a local
    folder's, or a tiny model's built from the recipe's arguments), compared when the recipe is
    read (`compatible`)."""
    if "model" in tokenizers and "teacher" in tokenizers:
        (student, load_student), (teacher, load_teacher) = tokenizers["model"], tokenizers["teacher"]
        compatible(load_student(), load_teacher(), student, teacher, stage.template == "chat", f"{stage.name}.teacher")


def teacher_path(ctx: StageContext) -> str:
    """The teacher's folder or hub id: an earlier stage's model, or a model reference resolved as the run's are."""
    return resolve(ctx.stage.teacher, ctx.recipe, ctx.models)


def compatible(student_tokenizer, teacher_tokenizer, student: str, teacher: str, chat: bool, where: str) -> None:
    """Refuse a pair the teacher cannot score token by token (one line, before any model loads)."""
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise RecipeError(
            f"{where}: the teacher {teacher} and the student {student} have different tokenizers; on-policy "
            "distillation scores the student's own tokens, so both need one vocabulary (for a teacher of "
            "another family, distil off-policy: a rejection stage from the teacher, then sft)"
        )
    if chat and student_tokenizer.chat_template != teacher_tokenizer.chat_template:
        raise RecipeError(f"{where}: the teacher {teacher} and the student {student} have different chat templates; use template: plain or one chat template")


def build(ctx: StageContext):
    """The stage's trainer (teacher checked first) and its metrics file."""
    from transformers import AutoTokenizer
    from trl import DistillationConfig

    from r1kit.trainers import trl_overrides

    trl_overrides.check()  # before any model loads
    teacher = teacher_path(ctx)
    tokenizer = AutoTokenizer.from_pretrained(ctx.model, padding_side="left")
    compatible(tokenizer, AutoTokenizer.from_pretrained(teacher), ctx.model, teacher, ctx.stage.template == "chat", ctx.stage.name)
    rows = grpo.prompt_rows(ctx, tokenizer).select_columns(["prompt"])
    args = trainer_args(DistillationConfig, ctx, **DEFAULTS)
    checkpoint = last_checkpoint(ctx)
    metrics_path = ctx.dir / "metrics.jsonl"
    log.info("%s: student %s, teacher %s, beta %s", ctx.stage.name, ctx.model, teacher, args.beta)
    trainer = trl_overrides.DistillationTrainer(
        model=ctx.model,  # TRL builds both: float32 weights, model_init_kwargs / teacher_model_init_kwargs applied
        teacher_model=teacher,
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        callbacks=[make_metrics_log(metrics_path, checkpoint_step(checkpoint) if checkpoint else None, ctx.is_main)],
    )
    return trainer, metrics_path


def run(ctx: StageContext) -> StageResult:
    trainer, metrics_path = build(ctx)
    sizes = lora.parameters(trainer.model)
    out = train_and_save(trainer, ctx)
    losses = [r["loss"] for r in read_metrics(metrics_path) if "loss" in r]
    metrics = {"rows": len(trainer.train_dataset), **sizes, "trainer_paths": trainer.paths}
    if losses:
        metrics |= {"first_loss": losses[0], "last_loss": losses[-1]}
    return StageResult(model=out, metrics=metrics)


DEFAULTS = {"logging_steps": 10}


STAGE = StageKind(
    config=DistillStage, run=run, trainer_config=lambda stage: __import__("trl").DistillationConfig, check=check,
    trainer_defaults=lambda stage: DEFAULTS, models=lambda stage: hooks.model_refs(stage) + [("teacher", stage.teacher)],
    data=hooks.data_sections, machine_problems=hooks.trainer_problems, bf16=hooks.trainer_bf16, local_check=local_check,
)
