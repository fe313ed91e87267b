"""GRPO scoring that runs each group's prompt through the model once, not once per completion.

GRPO scores every completion with a forward pass over prompt and completion (TRL's
``_get_per_token_logps_and_entropies``: the policy's log-probabilities for the loss, the reference
model's for the KL term, the old policy's for importance sampling), and a group's
``num_generations`` completions all follow the same prompt. `scores` splits each such
pass in two: the batch's distinct prompts (all but their last token) go through the model once,
with a cache of their keys and values; each completion then runs from the prompt's last token on,
attending to its prompt's cached keys and values. Gradients flow back through the cache into the
prompt's pass, summed over the group. The tokens, positions, attention mask and log-probabilities
are those of the one-pass forward, up to the rounding of products of other shapes (a test compares
log-probabilities and gradients); on SmolLM2 with 25-token prompts, 8 completions of at most 32
tokens per prompt, a third of the tokens go through the model once instead of 8 times.

Opt-in, with a grpo stage's ``share_prompts: true``. On SmolLM2 the gradients matched the one-pass
forward's to 4e-7 in float32 and as closely as bfloat16 allows under autocast. Four runs of
recipes/smollm2.yaml (seeds 42-45) ended at held-out pass@1 0.685, 0.665, 0.698 and 0.772 with it,
against 0.772, 0.743, 0.685 and 0.715 without (means 0.705 and 0.729, within the seeds' spread):
more runs must tell a different trajectory's chance from a cost before it becomes the default.

Taken only where that holds: text-only batches without MoE auxiliary losses, no gradient
checkpointing (it turns the cache off), one process (DDP expects one forward per backward), and
models whose cache is transformers' ``DynamicCache`` of full-attention layers (checked on the first
call; other models go on with the one-pass forward). Batches whose prompts are all distinct also
take the one-pass forward.

Not here: the loss (TRL's), generation (r1kit.sampling.decode shares prompts there too).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def refusal(trainer) -> str | None:
    """Why `trainer` (r1kit's ``GRPOTrainer``) may not score each batch's distinct prompts once,
    or None where it may (a model whose cache cannot be shared is found on its first call)."""
    if trainer.args.gradient_checkpointing:
        return "gradient checkpointing recomputes the forward pass"
    if trainer.accelerator.num_processes != 1:
        return f"{trainer.accelerator.num_processes} processes split the batches"
    return None


def scores(trainer, one_pass, unfit: set[int], model, input_ids, attention_mask, logits_to_keep, batch_size=None,
           compute_entropy=False, compute_aux_loss=False, **extra):
    """TRL's ``_get_per_token_logps_and_entropies`` (`one_pass`) with each batch's distinct prompts
    through the model once; `unfit` collects the models whose cache cannot be shared."""
    if compute_aux_loss or id(model) in unfit or any(v is not None for v in extra.values()):
        return one_pass(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **extra)
    batch_size = batch_size or input_ids.size(0)
    parts = []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
        part = _two_passes(trainer, model, ids, mask, logits_to_keep, compute_entropy, unfit)
        parts.append(part or one_pass(model, ids, mask, logits_to_keep, None, compute_entropy))
    entropies = torch.cat([p[1] for p in parts]) if compute_entropy else None
    return torch.cat([p[0] for p in parts]), entropies, None


def _two_passes(trainer, model, ids, mask, logits_to_keep, compute_entropy, unfit):
    """Log-probabilities (and entropies) of the last `logits_to_keep` tokens of each row of `ids`,
    with the rows' distinct prompts through the model once; None where that would not pay or hold."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    split = ids.size(1) - logits_to_keep - 1  # the prompt's last token predicts the first completion token
    if split < 1:
        return None
    prefixes, row_prefix = torch.unique(torch.cat([ids[:, :split], mask[:, :split]], 1), dim=0, return_inverse=True)
    if prefixes.size(0) == ids.size(0) or not bool(prefixes[:, split:].any(1).all()):
        return None  # nothing shared, or a prefix of padding alone
    # One embedding lookup for both passes: its backward fills a dense vocabulary-sized gradient.
    prefix_ids, rest_ids = prefixes[:, :split], ids[:, split:]
    embeds = model.get_input_embeddings()(torch.cat([prefix_ids.flatten(), rest_ids.flatten()]))
    prefix_embeds, rest_embeds = embeds.split([prefix_ids.numel(), rest_ids.numel()])
    with trainer.accelerator.autocast():
        cache = model(inputs_embeds=prefix_embeds.view(*prefix_ids.shape, -1), attention_mask=prefixes[:, split:], use_cache=True, logits_to_keep=1).past_key_values
    if not isinstance(cache, DynamicCache) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        unfit.add(id(model))
        log.warning("share_prompts: each completion is scored with its prompt: %s's cache cannot be shared", type(model).__name__)
        return None
    cache.batch_select_indices(row_prefix)
    labels = rest_ids.masked_fill(mask[:, split:] == 0, -100)
    labels[:, :-logits_to_keep] = -100
    with trainer.accelerator.autocast():
        out = model(inputs_embeds=rest_embeds.view(*rest_ids.shape, -1), attention_mask=mask, past_key_values=cache, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -logits_to_keep:], out.entropy[:, -logits_to_keep:] if compute_entropy else None
