"""r1kit.trainers.zero_advantage: GRPO's loss computed on the completions with a nonzero advantage alone gives
TRL's loss and every gradient, runs the model on those completions only, and is taken only where
zero-advantage completions really add nothing."""

from __future__ import annotations

import functools

import pytest
import torch
import trl

from r1kit.errors import RecipeError
from r1kit.trainers import trl_overrides, trl_patches
from r1kit.trainers.trl_overrides import Features

PROMPT, COMPLETION, ROWS = 5, 6, 8


def training(trainer):
    """`trainer` as its training step runs the loss: one accumulation step, the model in training mode
    (the loss logs its figures by the model's mode)."""
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def inputs(vocab: int, advantages: list[float]) -> dict:
    """A training batch as TRL's scoring hands it on: old log-probabilities away from the policy's,
    so that the clipped ratio matters, and completions that ended early."""
    g = torch.Generator().manual_seed(0)
    completion_mask = torch.ones(ROWS, COMPLETION, dtype=torch.long)
    for r in range(ROWS):
        completion_mask[r, COMPLETION - r % 3 :] = 0
    prompt_mask = torch.ones(ROWS, PROMPT, dtype=torch.long)
    prompt_mask[::2, :2] = 0
    return {
        "prompt_ids": torch.randint(5, vocab, (ROWS, PROMPT), generator=g),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(5, vocab, (ROWS, COMPLETION), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "old_per_token_logps": -5.0 + 0.3 * torch.randn(ROWS, COMPLETION, generator=g),
        "num_items_in_batch": completion_mask.sum().float(),
    }


def loss_and_gradients(trainer, batch, rows_seen: list[int], trls: bool = False):
    """The trainer's loss (TRL's own with `trls`) as its training step computes it (in the
    trainer's autocast, through r1kit's log-probabilities on a CPU), and every trainable weight's
    gradient."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    layers = (model.get_base_model() if hasattr(model, "get_base_model") else model).model.layers
    hook = layers[0].register_forward_pre_hook(lambda module, args: rows_seen.append(args[0].size(0)))
    try:
        compute = functools.partial(trl.GRPOTrainer._compute_loss, trainer) if trls else trainer._compute_loss
        with trl_patches.log_probs_on_cpu(), trainer.compute_loss_context_manager():
            loss = compute(model, batch)
    finally:
        hook.remove()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


# Two groups of four: the first with no reward spread (zero advantages), the second with one
# completion scored at its group's mean.
SOME_ZERO = [0.0, 0.0, 0.0, 0.0, 1.5, -0.5, 0.0, -1.0]


@pytest.mark.parametrize(("loss_type", "bf16", "lora"), [("grpo", False, False), ("bnpo", False, False), ("dr_grpo", False, False), ("dapo", False, False), ("grpo", True, False), ("grpo", False, True)],
                         ids=["grpo", "bnpo", "dr_grpo", "dapo", "grpo-bf16-autocast", "grpo-lora"])
def test_the_loss_on_rows_with_signal_is_trls_loss_with_its_gradients(grpo_trainer, loss_type, bf16, lora):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    trainer = training(grpo_trainer(ROWS, 4, COMPLETION, peft_config=peft_config, features=Features(), beta=0.0,
                                    loss_type=loss_type, bf16=bf16))
    batch = inputs(trainer.model.config.vocab_size, SOME_ZERO)
    seen_by_trl: list[int] = []
    trl_loss, trl_grads = loss_and_gradients(trainer, batch, seen_by_trl, trls=True)
    assert trainer.paths["zero_advantage_skip"] == "on"
    seen: list[int] = []
    loss, grads = loss_and_gradients(trainer, batch, seen)
    assert seen_by_trl == [ROWS] and seen == [3]
    assert loss.item() != 0.0
    # bfloat16 rounds products of 3 rows otherwise than of 8; a wrong scale or row is off by far more.
    tolerance = 2e-2 if bf16 else 1e-5
    assert abs(loss - trl_loss) <= tolerance * abs(trl_loss)
    assert grads.keys() == trl_grads.keys() and all(("lora" in n) == lora for n in grads)
    for name, grad in grads.items():
        assert (grad - trl_grads[name]).norm() <= tolerance * trl_grads[name].norm() + 1e-12, name
    assert trainer._metrics["train"]["zero_advantage/skipped"] == [5 / 8]


def test_a_batch_without_signal_skips_the_model_and_leaves_zero_gradients_as_trl_does(grpo_trainer):
    trainer = training(grpo_trainer(ROWS, 4, COMPLETION, features=Features(), beta=0.0))
    batch = inputs(trainer.model.config.vocab_size, [0.0] * ROWS)
    seen_by_trl: list[int] = []
    trl_loss, trl_grads = loss_and_gradients(trainer, batch, seen_by_trl, trls=True)
    assert trainer.paths["zero_advantage_skip"] == "on"
    seen: list[int] = []
    loss, grads = loss_and_gradients(trainer, batch, seen)
    assert seen == [] and loss.item() == trl_loss.item() == 0.0
    assert grads.keys() == trl_grads.keys()
    assert all(not g.any() for g in grads.values()) and all(not g.any() for g in trl_grads.values())
    assert trainer._metrics["train"]["zero_advantage/skipped"] == [1.0]


@pytest.mark.parametrize(("args", "why"), [({"beta": 0.04}, "beta 0.04 (a KL term moves every completion)"),
                                           ({"entropy_coef": 0.01}, "an entropy bonus"),
                                           ({"top_entropy_quantile": 0.2}, "a high-entropy token mask")],
                         ids=["kl", "entropy-bonus", "entropy-mask"])
def test_terms_that_move_zero_advantage_rows_keep_trls_loss_over_every_row(grpo_trainer, args, why):
    trainer = training(grpo_trainer(ROWS, 4, COMPLETION, features=Features(), **{"beta": 0.0, **args}))
    assert trainer.paths["zero_advantage_skip"] == f"off: {why}"
    batch = inputs(trainer.model.config.vocab_size, SOME_ZERO)
    batch["ref_per_token_logps"] = batch["old_per_token_logps"] - 0.1  # the KL term's reference
    seen: list[int] = []
    loss_and_gradients(trainer, batch, seen)
    assert seen == [ROWS] and "zero_advantage/skipped" not in trainer._metrics["train"]


def test_a_trl_that_no_longer_sets_an_attribute_a_path_reads_stops_the_trainer_in_one_line(grpo_trainer, monkeypatch):
    """The guards read TRL's attributes directly: a renamed flag stops the stage instead of taking
    the skip unguarded (as a `getattr` with a default would)."""
    init = trl.GRPOTrainer.__init__

    def without_the_flag(self, *args, **kwargs):
        init(self, *args, **kwargs)
        del self._entropy_bonus_enabled

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", without_the_flag)
    with pytest.raises(RecipeError, match=r"^r1kit reads GRPOTrainer._entropy_bonus_enabled, which the installed TRL") as e:
        grpo_trainer(ROWS, 4, COMPLETION, features=Features(), beta=0.0)
    assert "\n" not in str(e.value) and trl_overrides.WRITTEN_AGAINST in str(e.value)


def test_a_grpo_stage_logs_the_share_of_completions_it_left_out(tiny_model, write_recipe, tmp_path):
    import json

    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    stage = {"name": "rl", "kind": "grpo", "template": "plain",
             "data": {"source": "task:addition", "task": {"n": 8, "digits": 1}}, "rewards": [{"name": "math_accuracy"}],
             "trainer": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 4, "beta": 0.0}}
    pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [stage]})))
    records = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "frac_reward_zero_std" in r]
    assert len(steps) == 2
    # Two completions a group: a group without spread has zero advantages, one with spread has none.
    assert [r["zero_advantage/skipped"] for r in steps] == [r["frac_reward_zero_std"] for r in steps]
