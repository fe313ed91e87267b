"""The `reward` stage: train a reward model on preference pairs with `trl.RewardTrainer`, for the
`reward_model` reward of a later stage (R1's second RL round scores general data with one).

    - name: rm
      kind: reward
      data: {source: data/pairs.jsonl}         # rows with prompt, chosen and rejected
      trainer: {max_steps: 200, learning_rate: 1.0e-4}   # trl.RewardConfig fields, as they are
    - name: rl
      kind: grpo
      rewards: [{name: reward_model, model: rm, prompt_column: question}]   # the rm stage's model

The reward model is the stage's starting model with a one-output score head (a sequence
classifier), trained with TRL's Bradley-Terry loss to score ``chosen`` above ``rejected``. Each
response is rendered and tokenized exactly as the `reward_model` reward will read it
(r1kit.reward_text: ``[user: prompt, assistant: response]`` through the chat template, the
text after ``</think>`` unless ``text: full``, the end kept past ``max_length``), so it trains on
the very tokens it later scores. ``held_out`` of the pairs (10% unless set) are kept out of
training; the stage's metrics give the share of them it ranks right (``pair_accuracy``), before
and after training.

The model and its tokenizer are saved to ``<stage>/model``. The stage hands on no model: a reward
model is no policy, so the next stage starts from the model this one started from. A later
stage's reward names it by the stage's name (``{name: reward_model, model: rm}``, resolved when
that stage starts: r1kit.stages.served_rewards). An interrupted stage resumes from its last checkpoint.

Not here: scoring (the `reward_model` reward), pairs made by a judge or by sampling (write them to
a .jsonl file; ``task:chain_sum`` with ``pairs: true`` makes offline ones), LoRA.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from r1kit import data as data_lib
from r1kit.config import DataConfig, StageConfig
from r1kit.errors import RecipeError
from r1kit.stages import hooks
from r1kit.stages.base import StageContext, StageKind, StageResult
from r1kit.trainers.training import checkpoint_step, last_checkpoint, make_metrics_log, read_metrics, trainer_args, train_and_save

log = logging.getLogger(__name__)
COLUMNS = ("chosen", "rejected")


@dataclass(kw_only=True)
class RewardStage(StageConfig):
    data: DataConfig
    """Preference pairs: the ``prompt`` column (the question), ``chosen`` and ``rejected`` (two
    responses to it, the first preferred); other names through the data section's ``columns:``."""
    text: Literal["summary", "full"] = "summary"
    """What of a response the model reads, as the `reward_model` reward's ``text`` (set it the same there)."""
    max_length: int = 1024
    """Tokens of a rendered pair member; longer ones lose their beginning (as the reward's ``max_length``)."""
    held_out: float = 0.1
    """The share of pairs kept out of training, on which ``pair_accuracy`` is measured."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Fields of trl.RewardConfig, passed through."""


def check(stage: RewardStage) -> None:
    if not 0.0 <= stage.held_out < 1.0:
        raise RecipeError(f"{stage.name}.held_out: a share from 0 to below 1, got {stage.held_out!r}")
    if stage.max_length < 1:
        raise RecipeError(f"{stage.name}.max_length: at least 1 token, got {stage.max_length!r}")
    for key in ("max_length", "model_init_kwargs"):
        if key in stage.trainer:
            raise RecipeError(f"{stage.name}.trainer.{key}: r1kit renders and cuts the pairs itself; set the stage's max_length instead"
                              if key == "max_length" else f"{stage.name}.trainer.{key}: the reward model is loaded by TRL as it is")


def pairs(ctx: StageContext, tokenizer) -> tuple[list[dict], list[dict]]:
    """(training, held-out) pairs as token ids (``chosen_ids``, ``rejected_ids``), rendered as the
    `reward_model` reward renders what it scores; the held-out ones drawn with the recipe's seed."""
    from r1kit.reward_text import encode, rendered

    stage = ctx.stage
    rows = data_lib.load_rows(stage.data, ctx)
    data_lib.require_columns(rows, [stage.data.prompt, *COLUMNS], ctx.resolve_data_source(stage.data.source), f"reward stage {stage.name!r}")
    questions = rows[stage.data.prompt]
    out = [
        {f"{c}_ids": ids for c, ids in zip(COLUMNS, pair)}
        for pair in zip(*(encode(tokenizer, rendered(tokenizer, rows[c], stage.text, questions), stage.max_length) for c in COLUMNS))
    ]
    order = list(range(len(out)))
    random.Random(ctx.recipe.seed).shuffle(order)
    cut = round(len(out) * stage.held_out)
    return [out[i] for i in order[cut:]], [out[i] for i in order[:cut]]


def pair_accuracy(model, tokenizer, held_out: list[dict]) -> float | None:
    """The share of `held_out` pairs whose chosen response `model` scores above the rejected one."""
    from r1kit.reward_text import scores

    if not held_out:
        return None
    model.eval()
    chosen, rejected = (scores(model, tokenizer, [p[f"{c}_ids"] for p in held_out]) for c in COLUMNS)
    model.train()
    return sum(a > b for a, b in zip(chosen, rejected)) / len(held_out)


def run(ctx: StageContext) -> StageResult:
    import datasets
    from trl import RewardConfig, RewardTrainer

    from r1kit.reward_text import tokenizer_of

    tokenizer = tokenizer_of(ctx.model)
    train, held_out = pairs(ctx, tokenizer)
    if not train:
        raise RecipeError(f"{ctx.stage.name}: no pairs left to train on after holding out {ctx.stage.held_out:.0%}")
    args = trainer_args(RewardConfig, ctx, **DEFAULTS, max_length=None)
    checkpoint = last_checkpoint(ctx)
    metrics_path = ctx.dir / "metrics.jsonl"
    callback = make_metrics_log(metrics_path, checkpoint_step(checkpoint) if checkpoint else None, ctx.is_main)
    trainer = RewardTrainer(model=ctx.model, args=args, train_dataset=datasets.Dataset.from_list(train), processing_class=tokenizer,
                            callbacks=[callback])
    trainer.model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last token that is not padding
    before = pair_accuracy(trainer.model, tokenizer, held_out)
    out = train_and_save(trainer, ctx)
    after = pair_accuracy(trainer.model, tokenizer, held_out)
    losses = [r["loss"] for r in read_metrics(metrics_path) if "loss" in r]
    metrics = {"pairs": len(train), "held_out": len(held_out), "pair_accuracy_before": before, "pair_accuracy": after}
    if losses:
        metrics |= {"first_loss": losses[0], "last_loss": losses[-1]}
    log.info("%s: the reward model ranks %s of %d held-out pairs right (%s before training); saved to %s", ctx.stage.name,
             "-" if after is None else f"{after:.1%}", len(held_out), "-" if before is None else f"{before:.1%}", out)
    return StageResult(model=out, metrics=metrics)  # named by later stages, not handed on (hands_on=False)


DEFAULTS = {"logging_steps": 10}

STAGE = StageKind(
    config=RewardStage, run=run, trainer_config=lambda stage: __import__("trl").RewardConfig, check=check,
    trainer_defaults=lambda stage: DEFAULTS, data=hooks.data_sections,
    machine_problems=hooks.trainer_problems, bf16=hooks.trainer_bf16, hands_on=False,
)
