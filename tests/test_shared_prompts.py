"""r1kit.trainers.shared_prompts: GRPO scoring with each distinct prompt through the model once gives the
one-pass forward's log-probabilities, entropies and gradients, and really does run prompts once."""

from __future__ import annotations

import pytest
import torch

import trl

from r1kit.trainers.trl_overrides import Features
from r1kit.trainers.trl_patches import log_probs_on_cpu

SHARE = Features(skip_zero_advantage=False, share_prompts=True)

PROMPT, COMPLETION = 9, 6


def batch(vocab: int, prompts: int, per_prompt: int):
    """Left-padded prompts (of uneven lengths), each repeated for its group, then right-padded completions."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, vocab, (prompts, PROMPT), generator=g)
    prompt_mask = torch.ones_like(prompt)
    for i in range(prompts):
        prompt_mask[i, : 2 * i] = 0  # prompt i is 2i tokens shorter
    rows = prompts * per_prompt
    completion = torch.randint(5, vocab, (rows, COMPLETION), generator=g)
    completion_mask = torch.ones_like(completion)
    for r in range(rows):
        completion_mask[r, COMPLETION - r % 4 :] = 0  # completions that ended early
    ids = torch.cat([prompt.repeat_interleave(per_prompt, 0), completion], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(per_prompt, 0), completion_mask], 1)
    return ids.masked_fill(mask == 0, 0), mask, completion_mask


def first_layer(trainer):
    """The first decoder layer: its input is [rows, tokens, hidden] for each pass through the model."""
    model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    return model.model.layers[0]


def score(trainer, ids, mask, completion_mask, trls: bool = False, **kwargs):
    """Log-probabilities, entropies and every parameter's gradient of their masked sum, by the
    trainer's scoring (TRL's own one-pass forward with `trls`)."""
    model = trainer.model
    model.zero_grad()
    scoring = trl.GRPOTrainer._get_per_token_logps_and_entropies.__get__(trainer) if trls else trainer._get_per_token_logps_and_entropies
    logps, entropies, _ = scoring(model, ids, mask, COMPLETION, compute_entropy=True, **kwargs)
    ((logps + 0.1 * entropies) * completion_mask).sum().backward()
    m = completion_mask.bool()
    return logps[m], entropies[m], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("bf16", "lora"), [(False, False), (True, False), (False, True)], ids=["float32", "bf16-autocast", "lora"])
def test_prompts_scored_once_give_the_one_pass_log_probs_entropies_and_gradients(grpo_trainer, bf16, lora):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    trainer = grpo_trainer(4, 2, COMPLETION, peft_config=peft_config, features=SHARE, bf16=bf16)
    assert trainer.paths["shared_prompts"] == "on"
    ids, mask, completion_mask = batch(trainer.model.config.vocab_size, prompts=3, per_prompt=4)
    with log_probs_on_cpu():
        one_pass = score(trainer, ids, mask, completion_mask, trls=True)
        seen = []
        hook = first_layer(trainer).register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape[:2])))
        shared = score(trainer, ids, mask, completion_mask, batch_size=12)
        hook.remove()
    # 3 prompts (all but their last token) once, then 12 rows from each prompt's last token on
    assert seen == [(3, PROMPT - 1), (12, COMPLETION + 1)]
    # bfloat16 rounds products of other shapes otherwise: up to about 1% of a gradient's norm here,
    # less than bfloat16 autocast differs from float32; a wrong position, mask or row is off by far more.
    tolerance = 3e-2 if bf16 else 1e-5
    assert shared[2].keys() == one_pass[2].keys() and all(("lora" in n) == lora for n in one_pass[2])
    for name, a, b in [("log_probs", shared[0], one_pass[0]), ("entropies", shared[1], one_pass[1])] + [(n, shared[2][n], g) for n, g in one_pass[2].items()]:
        assert (a - b).norm() <= tolerance * b.norm(), name


def test_distinct_prompts_take_the_one_pass_forward_and_chunks_share_their_own_prompts(grpo_trainer):
    trainer = grpo_trainer(4, 2, COMPLETION, features=SHARE)
    seen = []
    first_layer(trainer).register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape[:2])))
    ids, mask, completion_mask = batch(trainer.model.config.vocab_size, prompts=4, per_prompt=1)
    with log_probs_on_cpu():
        score(trainer, ids, mask, completion_mask)
        assert seen == [(4, PROMPT + COMPLETION)]
        seen.clear()
        ids, mask, completion_mask = batch(trainer.model.config.vocab_size, prompts=2, per_prompt=2)
        score(trainer, ids, mask, completion_mask, batch_size=2)  # each chunk holds one group
        assert seen == [(1, PROMPT - 1), (2, COMPLETION + 1)] * 2


def test_gradient_checkpointing_keeps_the_one_pass_forward_and_says_so(grpo_trainer, caplog):
    with caplog.at_level("INFO", logger="r1kit.trainers.trl_overrides"):
        trainer = grpo_trainer(4, 2, COMPLETION, features=SHARE, gradient_checkpointing=True)
    assert trainer.paths["shared_prompts"] == "off: gradient checkpointing recomputes the forward pass"
    assert "shared_prompts off: gradient checkpointing recomputes the forward pass" in caplog.text


def test_a_grpo_stage_scores_prompts_once_only_when_its_recipe_asks(tiny_model, write_recipe, tmp_path):
    import json

    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    for share in (False, True):
        stage = {"name": "rl", "kind": "grpo", "template": "plain", "share_prompts": share,
                 "data": {"source": "task:addition", "task": {"n": 8, "digits": 1}}, "rewards": [{"name": "math_accuracy"}],
                 "trainer": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 4}}
        pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / str(share)), "stages": [stage]})))
        done = json.loads((tmp_path / str(share) / "rl" / "DONE.json").read_text())
        assert done["metrics"]["trainer_paths"]["shared_prompts"] == ("on" if share else "off: not asked")
