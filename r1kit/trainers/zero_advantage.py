"""GRPO training that leaves out the completions whose advantage is zero: the same gradient, less work.

A group whose completions all get the same reward has zero advantage everywhere, and so has any
completion scored exactly at its group's mean. Without a KL term (``beta: 0``, TRL's default and
the smollm2 recipe's), every GRPO loss TRL computes is a per-token factor times the advantage, so
such a completion adds exactly nothing to the gradient, yet TRL runs its forward and backward pass
with the rest. `loss` computes it on the other completions only (r1kit.trainers.trl_overrides'
``GRPOTrainer._compute_loss``, where `refusal` finds nothing) and rescales it to TRL's
normalisation over the whole batch (the mean over completions of ``grpo``, ``sapo``, ``dr_grpo``
and ``luspo``, the token mean of ``bnpo``; ``dapo``, ``cispo`` and ``vespo`` already divide by the
generation batch's token count), so the loss and its gradient are TRL's up to
the rounding of products of another shape (a test compares every gradient). A batch with no
signal at all returns a zero loss whose backward leaves zero gradients, as TRL's would, so the
optimizer's step (moments, weight decay) is unchanged.

In runs of recipes/smollm2.yaml, 57-58% of the groups had zero reward spread on average over the
120 steps (TRL's ``frac_reward_zero_std``): the model either always or never answers a problem.

What changes: TRL's entropy and clipping figures are logged over the completions that trained, and
are missing from a step where none did; ``zero_advantage/skipped`` logs the share left out.

Taken only where that holds: ``beta: 0``, no entropy bonus or high-entropy token mask, no MoE
auxiliary loss, one process without DeepSpeed or FSDP (their gradient sync expects every process's
full forward), TRL's loss types listed above, and batches of text only (others take TRL's loss as
is). DAPO's dynamic sampling (r1kit.trainers.dynamic_sampling) is the other answer to zero-signal groups:
it replaces them with fresh ones.

Not here: the loss (TRL's), generation, scoring.
"""

from __future__ import annotations

# TRL's loss types whose per-token loss is proportional to the advantage, by how each normalises.
PER_COMPLETION = {"grpo", "sapo", "dr_grpo", "luspo"}  # a mean over the batch's completions
PER_TOKEN = {"bnpo"}  # a mean over the batch's completion tokens
PER_GENERATION_BATCH = {"dapo", "cispo", "vespo"}  # the generation batch's token count, unchanged
# The tensors of a training batch with a row per completion, and the one shared by all.
ROWS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
        "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask"}
SHARED = {"num_items_in_batch"}


def refusal(trainer) -> str | None:
    """Why `trainer` (r1kit's ``GRPOTrainer``) may not leave zero-advantage completions out of its
    forward and backward passes, or None where that keeps its gradient."""
    reasons = {
        f"beta {trainer.beta} (a KL term moves every completion)": trainer.beta != 0.0,
        "an entropy bonus": trainer._entropy_bonus_enabled,
        "a high-entropy token mask": trainer.top_entropy_quantile < 1.0,
        "an MoE auxiliary loss": trainer.aux_loss_enabled,
        f"loss_type {trainer.loss_type}": trainer.loss_type not in PER_COMPLETION | PER_TOKEN | PER_GENERATION_BATCH,
        f"{trainer.accelerator.num_processes} processes": trainer.accelerator.num_processes != 1,
        "DeepSpeed": trainer.is_deepspeed_enabled,
        "FSDP": trainer.is_fsdp_enabled,
        "Liger kernels": trainer.args.use_liger_kernel,
    }
    return next((reason for reason, refuses in reasons.items() if refuses), None)


def loss(trainer, compute_loss, model, inputs):
    """TRL's loss (`compute_loss`, its ``_compute_loss``) over the completions of `inputs` whose
    advantage is not zero, rescaled to TRL's normalisation over the whole batch."""
    if not set(inputs) <= ROWS | SHARED:
        return compute_loss(model, inputs)  # images and the like: TRL's loss over every row
    advantages = inputs["advantages"]
    keep = advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(-1)
    rows = keep.numel()
    kept = int(keep.sum())
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode]["zero_advantage/skipped"].append(1 - kept / rows)
    if kept == rows:
        return compute_loss(model, inputs)
    if kept == 0:
        # TRL's loss is zero here, and its backward leaves a zero gradient on every trainable weight.
        return sum(p.flatten()[0] * 0.0 for p in model.parameters() if p.requires_grad)
    sub = {k: v[keep] if k in ROWS else v for k, v in inputs.items()}
    if trainer.loss_type in PER_COMPLETION:
        scale = kept / rows
    elif trainer.loss_type in PER_TOKEN:
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        scale = float(mask[keep].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
    else:
        scale = 1.0
    return compute_loss(model, sub) * scale
