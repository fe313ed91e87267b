"""What the training stages share: trainer arguments, resume, metrics, the saved model.

- `trainer_args(config_cls, ctx, **r1kit_defaults)`: the recipe's ``trainer:`` fields, passed to
  the trainer library's config unchanged, plus the fields r1kit owns (output folder, seed) and,
  when no GPU is present, CPU-safe defaults for the fields the recipe left unset (logged), with
  bf16 autocast where it pays (r1kit.hardware.precision). The whole effective config, every library default included, is written to
  ``<stage>/trainer_config.json``.
- `last_checkpoint(ctx)` and `MetricsLog`, a callback writing every logged figure to
  ``<stage>/metrics.jsonl`` that stays consistent across resumes.

This is not a trainer: TRL's trainers train. Not here either: the models a stage starts from
(r1kit.models).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from r1kit import hardware
from r1kit.files import complete_lines, write_atomic

log = logging.getLogger("r1kit")

# TRL refuses to start on a machine without a GPU unless told so (it defaults to bf16). At run time
# bf16 becomes r1kit.hardware.precision's choice for the stage's model.
CPU_DEFAULTS = {
    "use_cpu": True,
    "bf16": False,
    "fp16": False,
    "gradient_checkpointing": False,
    "dataloader_num_workers": 0,
    "report_to": "none",
}


def merged(defaults: dict, given: dict) -> dict:
    """`given` over `defaults`, mapping by mapping: a recipe's ``model_init_kwargs: {revision: x}``
    keeps r1kit's ``dtype`` default beside it."""
    out = dict(defaults)
    for key, value in given.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def trainer_fields(stage, recipe, r1kit_defaults: dict) -> tuple[dict, dict]:
    """The fields the trainer library's config gets for `stage`, and the CPU defaults among them:
    recipe fields over r1kit's defaults (merged deeply, once), the fields r1kit owns, then (no GPU)
    CPU ones."""
    fields = merged({"seed": recipe.seed, **r1kit_defaults}, stage.trainer)
    fields["output_dir"] = str(Path(recipe.output_dir) / stage.name / "checkpoints")
    applied = {k: v for k, v in CPU_DEFAULTS.items() if k not in fields} if not hardware.has_gpu() else {}
    return fields | applied, applied


def trainer_args(config_cls, ctx, **r1kit_defaults):
    """The trainer library's config for this stage (see `trainer_fields`), recorded in the stage folder."""
    fields, applied = trainer_fields(ctx.stage, ctx.recipe, r1kit_defaults)
    if "bf16" in applied:
        from r1kit.hardware.precision import cpu_bf16

        bf16, why = cpu_bf16(ctx.model)
        fields["bf16"] = applied["bf16"] = bf16
        log.info("%s: bfloat16 autocast %s: %s (trainer.bf16 overrides)", ctx.stage.name, "on" if fields["bf16"] else "off", why)
    if applied:
        log.info("%s: no GPU found; CPU defaults applied: %s", ctx.stage.name, applied)
    log.info("%s: trainer fields (the recipe's over r1kit's defaults): %s", ctx.stage.name, fields)
    config = config_cls(**fields)
    record(ctx, config)
    return config


def record(ctx, config) -> None:
    """Write ``<stage>/trainer_config.json``: exactly what the trainer is given, every default included."""
    if ctx.is_main:
        write_atomic(ctx.dir / "trainer_config.json", config.to_json_string())


def last_checkpoint(ctx) -> str | None:
    """The newest complete checkpoint of the stage, or None (see `newest_checkpoint`)."""
    return newest_checkpoint(ctx.dir)


def newest_checkpoint(stage_dir: Path) -> str | None:
    """The newest complete checkpoint in a stage's folder, or None.

    A run killed while saving leaves a partial checkpoint folder; the trainer writes
    trainer_state.json last, so only folders that have it count.
    """
    folder = stage_dir / "checkpoints"
    complete = [c for c in folder.glob("checkpoint-*") if (c / "trainer_state.json").is_file()] if folder.is_dir() else []
    return str(max(complete, key=checkpoint_step)) if complete else None


def checkpoint_step(checkpoint: str) -> int:
    return int(Path(checkpoint).name.split("-")[-1])


def make_metrics_log(path: Path, resume_step: int | None, is_main: bool, added=lambda record: {}):
    """A TrainerCallback appending each log record, with its step, to `path` (jsonl); `added`
    returns figures to write beside a record's own (r1kit.stages.async_grpo.grpo_figures).

    On resume, records past the checkpoint's step are dropped first: they will be logged again
    (and a last line that a kill cut short).
    """
    from transformers import TrainerCallback

    if is_main and path.exists():
        keep = []
        if resume_step is not None:
            keep = [line for line in complete_lines(path)[0] if line.strip() and json.loads(line)["step"] <= resume_step]
        write_atomic(path, "".join(line + "\n" for line in keep))

    class MetricsLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if is_main and logs:
                record = {"step": state.global_step, **logs}
                with open(path, "a") as f:
                    f.write(json.dumps(record | added(record)) + "\n")

    return MetricsLog()


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics log; a last line that a kill cut short is not one."""
    return [json.loads(line) for line in complete_lines(path)[0] if line.strip()]


def train_and_save(trainer, ctx, tokenizer=None) -> str:
    """Train (resuming from the stage's last checkpoint if any) and save the final model folder,
    with `tokenizer` (default: the trainer's own)."""
    checkpoint = last_checkpoint(ctx)
    if checkpoint:
        log.info("%s: resuming from %s", ctx.stage.name, checkpoint)
    trainer.train(resume_from_checkpoint=checkpoint)
    from r1kit.trainers import lora

    if lora.enabled(ctx.stage):
        return lora.save_merged(trainer, ctx, tokenizer)
    out = ctx.dir / "model"
    trainer.save_model(str(out))
    if ctx.is_main:
        (tokenizer or trainer.processing_class).save_pretrained(str(out))
    return str(out)
