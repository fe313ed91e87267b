"""The grpo stage on the tiny model: it learns a verifiable task, the loss variants run, dynamic
sampling keeps zero-signal groups out of the loss, reward time is logged and reported, and the
shipped GRPO recipes validate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from r1kit import pipeline
from r1kit.cli import main
from r1kit.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TASK = {"source": "task:addition", "task": {"n": 80, "digits": 1}}


def grpo_recipe(write_recipe, model: Path, rewards, output_dir: Path | None = None, **stage) -> Path:
    trainer = {
        "max_steps": 2,
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 32,
        "learning_rate": 5.0e-4,
        "logging_steps": 1,
        **stage.pop("trainer", {}),
    }
    rl = {"name": "rl", "kind": "grpo", "template": "plain", "data": TASK, "rewards": rewards, "trainer": trainer, **stage}
    return write_recipe({"model": str(model), "stages": [rl], **({"output_dir": str(output_dir)} if output_dir else {})})


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()]


def accuracy_run(write_recipe, cold_start, tmp_path, out: str) -> tuple[dict, list[float]]:
    path = grpo_recipe(
        write_recipe,
        cold_start,
        [{"name": "math_accuracy", "weight": 1.0}],
        # 16 problems, each seen about 30 times: the rise (about +0.12 here) stands well clear of
        # the step-to-step noise (about 0.02 on a 15-step mean), on any machine's float kernels.
        data={"source": "task:addition", "task": {"n": 16, "digits": 1}},
        trainer={"max_steps": 60, "per_device_train_batch_size": 128, "num_generations": 16, "loss_type": "dapo", "beta": 0.0},
        output_dir=tmp_path / out,
    )
    record = pipeline.run(load_recipe(path))["rl"]
    acc = [m["rewards/math_accuracy/mean"] for m in metrics(tmp_path / out) if "rewards/math_accuracy/mean" in m]
    assert len(acc) == 60
    return record, acc


def test_grpo_raises_accuracy_on_a_verifiable_task(write_recipe, cold_start, tmp_path, monkeypatch):
    """Rollouts by r1kit's decoding loop (the CPU default) and by TRL's own generation (as where
    the loop does not apply): with the same seed, the accuracy rises in both, by about as much."""
    from r1kit.trainers import rollouts

    record, acc = accuracy_run(write_recipe, cold_start, tmp_path, "run")
    assert record["metrics"]["trainer_paths"]["r1kit_decoding_loop"] == "on"
    monkeypatch.setattr(rollouts, "refusals", lambda trainer, **more: ["a test's say-so"])
    trl_run, trl_acc = accuracy_run(write_recipe, cold_start, tmp_path, "trl_run")
    assert trl_run["metrics"]["trainer_paths"]["r1kit_decoding_loop"] == "off: a test's say-so"
    rises = []
    for curve in (acc, trl_acc):
        first, last = sum(curve[:15]) / 15, sum(curve[-15:]) / 15
        assert last > first + 0.05, (first, last)
        rises.append(last - first)
    assert abs(rises[0] - rises[1]) < 0.08, rises  # the two rises' noise is about 0.04 (two 15-step means each)
    assert abs(sum(acc[:15]) - sum(trl_acc[:15])) / 15 < 0.05  # the same model, sampled the same way

    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(cold_start).state_dict()
    end = AutoModelForCausalLM.from_pretrained(record["model"]).state_dict()
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert record["metrics"]["math_accuracy_first"] == acc[0]


def test_rollouts_go_through_r1kits_loop_unless_it_cannot_draw_them(write_recipe, cold_start, monkeypatch):
    """On a CPU the grpo stage's rollouts come from r1kit's decoding loop; with a setting the loop
    does not apply (top-k here), from TRL's own ``model.generate``."""
    from transformers import GenerationMixin

    from r1kit.sampling import decode as decode_lib

    calls = {"decode": 0, "generate": 0}
    decode, generate = decode_lib.decode, GenerationMixin.generate

    def count(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(decode_lib, "decode", count("decode", decode))
    monkeypatch.setattr(GenerationMixin, "generate", count("generate", generate))
    pipeline.run(load_recipe(grpo_recipe(write_recipe, cold_start, [{"name": "math_accuracy"}])))
    assert calls == {"decode": 2, "generate": 0}
    calls.update(decode=0)
    path = grpo_recipe(write_recipe, cold_start, [{"name": "math_accuracy"}], trainer={"top_k": 5})
    pipeline.run(load_recipe(path), restart_from="rl")
    assert calls == {"decode": 0, "generate": 2}


@pytest.mark.parametrize(
    "fields, model_config, beyond",
    [
        ({"temperature": 0.6, "top_p": 0.9}, {}, []),
        ({"top_k": None}, {}, ["TopKLogitsWarper"]),  # TRL leaves it to transformers, which takes 50
        ({"min_p": 0.1}, {}, ["MinPLogitsWarper"]),
        ({}, {"no_repeat_ngram_size": 2}, ["NoRepeatNGramLogitsProcessor"]),  # from the model's generation_config.json
        ({}, {"repetition_penalty": 1.2}, []),  # TRL's own repetition_penalty (1.0) overrides the model's
        ({}, {"stop_strings": ["\n\n"]}, ["stop_strings"]),
    ],
)
def test_rollouts_leave_the_loop_where_generate_would_process_logits_beyond_temperature_and_top_p(
    grpo_trainer, fields, model_config, beyond
):
    from r1kit.trainers import rollouts

    trainer = grpo_trainer(4, 2, 8, beta=0.0, **fields)
    for name, value in model_config.items():
        setattr(trainer.model.generation_config, name, value)
    assert rollouts.logits_processing_beyond_the_loop(trainer) == beyond
    assert rollouts.refusals(trainer) == beyond


def test_rollouts_without_a_completion_length_come_from_trl(grpo_trainer):
    trainer = grpo_trainer(4, 2, None, beta=0.0)
    assert trainer.paths["r1kit_decoding_loop"] == "off: no max_completion_length" and trainer.loop is None


@pytest.mark.parametrize(
    "trainer, expect_kl",
    [
        ({"loss_type": "grpo", "beta": 0.04}, True),  # with a reference model
        ({"loss_type": "dr_grpo", "beta": 0.0, "scale_rewards": "none"}, False),
        ({"loss_type": "dapo", "beta": 0.0, "epsilon_high": 0.28}, False),
    ],
)
def test_loss_variants_run(write_recipe, cold_start, tmp_path, trainer, expect_kl):
    rewards = [{"name": "math_accuracy"}, {"name": "format", "weight": 0.5}, {"name": "overlong_penalty", "max_length": 32, "cache": 8}]
    path = grpo_recipe(write_recipe, cold_start, rewards, trainer=trainer)
    pipeline.run(load_recipe(path))
    logged = [m for m in metrics(tmp_path / "run") if "loss" in m]
    assert len(logged) == 2
    for m in logged:
        assert m["loss"] == m["loss"]  # not NaN
        assert ("kl" in m) == expect_kl
        for name in ("math_accuracy", "format", "overlong_penalty"):
            assert f"rewards/{name}/mean" in m and f"rewards/{name}/std" in m
        assert {"completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std", "entropy"} <= set(m)


def varies_for_odd_answers(completions, *, answer, **columns):
    """Constant (0.7) for even answers; 0/1 by the parity of the completion's character codes for
    odd ones (nearly a coin flip: the cold-start model's completions differ in their digits more
    than in their length). 0.7 is inexact in float32: a group of them gets advantages of about
    1e-3 from rounding, which must not count."""
    return [0.7 if int(a) % 2 == 0 else float(sum(map(ord, c)) % 2) for c, a in zip(completions, answer)]


def test_dynamic_sampling_keeps_zero_signal_groups_out_of_the_loss(write_recipe, cold_start, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from r1kit.trainers.trl_overrides import GRPOTrainer

    seen = []
    original = GRPOTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        seen.append({k: inputs[k].clone() for k in ("prompt_ids", "prompt_mask", "advantages")})
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "compute_loss", spy)
    path = grpo_recipe(
        write_recipe,
        cold_start,
        [{"name": f"{__name__}:varies_for_odd_answers"}],
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=8,
        trainer={"max_steps": 4},
    )
    pipeline.run(load_recipe(path))
    tok = AutoTokenizer.from_pretrained(cold_start)
    assert len(seen) == 4
    for batch in seen:
        assert batch["advantages"].shape == (16,)  # the batch stays full
        groups = batch["advantages"].view(-1, 8)
        assert (groups.abs().amax(dim=1) > 0).all()  # every group carries signal
        prompts = tok.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
        sums = [eval(p.removeprefix("What is ").rstrip("?")) for p in prompts]
        assert all(s % 2 == 1 for s in sums), "a constant-reward (even) prompt reached the loss"
    logged = [m for m in metrics(tmp_path / "run") if "dynamic_sampling/dropped_groups" in m]
    assert sum(m["dynamic_sampling/dropped_groups"] for m in logged) > 0
    assert all(m["dynamic_sampling/unfilled_groups"] == 0 for m in logged)


SLEEP_S = 0.2


def slow(completions, **columns):
    """Zero for every completion, after SLEEP_S seconds: a verifier slower than the model."""
    time.sleep(SLEEP_S)
    return [0.0] * len(completions)


def test_reward_seconds_are_logged_per_step_and_reported(write_recipe, tiny_model, tmp_path):
    # Two generation batches per optimizer step: a step's figure sums both calls of each reward.
    trainer = {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16,
               "gradient_accumulation_steps": 2, "steps_per_generation": 1}
    path = grpo_recipe(write_recipe, tiny_model, [{"name": f"{__name__}:slow"}, {"name": "format"}], trainer=trainer)
    assert main(["run", str(path)]) == 0
    slow_key = "reward_seconds/" + f"{__name__}:slow".replace(":", "_").replace(".", "_")
    steps = [m for m in metrics(tmp_path / "run") if "loss" in m]
    assert len(steps) == 2
    for m in steps:
        assert m[slow_key] >= 2 * SLEEP_S
        assert m["reward_seconds/format"] < m[slow_key]
    done = json.loads((tmp_path / "run" / "rl" / "DONE.json").read_text())
    totals = done["metrics"]
    assert totals[slow_key] == pytest.approx(sum(m[slow_key] for m in steps))  # logging_steps 1: the total
    assert totals["reward_seconds"] == pytest.approx(totals[slow_key] + totals["reward_seconds/format"])
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| stage | reward time (s) | share of stage wall time | by reward (s) |" in report
    share = f"| rl | {totals['reward_seconds']:.2f} | {totals['reward_seconds'] / done['wall_s']:.1%} |"
    assert share in report and f"{slow_key.removeprefix('reward_seconds/')} {totals[slow_key]:.2f}" in report


def test_dynamic_sampling_reads_signal_from_this_process_rewards():
    from types import SimpleNamespace

    from r1kit.trainers.dynamic_sampling import DynamicSampling

    nan = float("nan")
    mine = torch.tensor([  # process 1's 5 groups of 2, two reward functions
        [1.0, 1.0], [1.0, 1.0],   # equal (1.2 each with weights 1 and 0.2, inexact in float32)
        [nan, 1.0], [nan, 0.0],   # the routed reward is absent, the other differs
        [1.0, 0.0], [0.0, 1.0],   # the rewards differ; their sum differs only if the weights do
        [nan, nan], [nan, nan],   # unscorable
        [0.7, 1.0], [0.7, 1.0],   # equal
    ])
    others = torch.tensor([[0.0, 1.0], [1.0, 0.0]]).repeat(5, 1)  # process 0's rows, all with signal
    stub = SimpleNamespace(
        accelerator=SimpleNamespace(process_index=1), num_generations=2,
        reward_weights=torch.tensor([1.0, 0.2]), multi_objective_aggregation="sum_then_normalize",
    )
    sampling = DynamicSampling(max_rounds=1, seed=0)
    sampling.rewards = torch.cat([others, mine])
    signal = sampling.signal
    assert signal(stub, 10).tolist() == [False, True, True, False, False]
    stub.reward_weights = torch.tensor([1.0, 1.0])  # group 2's sums are now equal: no signal in the sum
    assert signal(stub, 10).tolist() == [False, True, False, False, False]
    stub.multi_objective_aggregation = "normalize_then_sum"  # each reward is normalised on its own
    assert signal(stub, 10).tolist() == [False, True, True, False, False]


def test_merge_rows_repads_each_side():
    from r1kit.trainers.dynamic_sampling import merge_rows

    a = {"prompt_ids": torch.tensor([[0, 5], [6, 7]]), "completion_ids": torch.tensor([[1], [2]]), "advantages": torch.tensor([1.0, -1.0]), "num_items_in_batch": torch.tensor(2)}
    b = {"prompt_ids": torch.tensor([[8, 9, 10]]), "completion_ids": torch.tensor([[3, 4, 0]]), "advantages": torch.tensor([0.5]), "num_items_in_batch": torch.tensor(3)}
    merged = merge_rows([(a, torch.tensor([1])), (b, torch.tensor([0]))], pad_token_id=0)
    assert merged["prompt_ids"].tolist() == [[0, 6, 7], [8, 9, 10]]  # prompts pad on the left
    assert merged["completion_ids"].tolist() == [[2, 0, 0], [3, 4, 0]]  # completions on the right
    assert merged["advantages"].tolist() == [-1.0, 0.5]
    with pytest.raises(NotImplementedError, match="pixel_values"):
        merge_rows([({**a, "pixel_values": torch.zeros(2)}, torch.tensor([0]))], 0)


@pytest.mark.parametrize("recipe", ["r1_zero.yaml", "r1_zero_dapo.yaml", "r1_zero_dr_grpo.yaml"])
def test_shipped_grpo_recipes_validate(recipe, capsys):
    assert main(["validate", str(ROOT / "recipes" / recipe)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([{"name": "math_acuracy"}], "rl.rewards[0]: unknown reward 'math_acuracy' (did you mean 'math_accuracy'?)"),
        ([{"name": "format", "mood": "strict"}], "rl.rewards[0]: reward 'format' has no parameter 'mood' (did you mean 'mode'?)"),
        ([{"name": "math_accuracy", "timeout": "long"}], "parameter 'timeout' must be float"),
        ([{"name": "math_accuracy", "timeout": 0}], "rl.rewards[0]: reward 'math_accuracy': parameter 'timeout' must be above 0; got 0"),
        ([{"name": "code_tests", "timeout": -1}], "reward 'code_tests': parameter 'timeout' must be above 0; got -1"),
        ([{"name": "overlong_penalty", "cache": 0}], "reward 'overlong_penalty': parameter 'cache' must be above 0; got 0"),
        ([{"name": "language_consistency", "language": "cn"}], "parameter 'language' must be one of 'en', 'zh', 'ja', 'ko', 'ru'; got 'cn'"),
        ([{"weight": 1.0}], "rl.rewards[0]: each reward needs a 'name'"),
        ([{"name": "math_accuracy", "weight": float("nan")}], "rl.rewards[0].weight: expected a finite number, got nan"),
        ([], "rl.rewards: a grpo stage needs at least one reward"),
    ],
)
def test_bad_reward_config_is_a_recipe_error(write_recipe, tiny_model, capsys, rewards, expected):
    assert main(["validate", str(grpo_recipe(write_recipe, tiny_model, rewards))]) == 2
    assert expected in capsys.readouterr().err


def test_templates():

    from r1kit import templates

    assert templates.render("r1_zero", "What is 2 + 2?").endswith("User: What is 2 + 2?. Assistant:")
    assert "<think> </think> and <answer> </answer> tags" in templates.render("r1_zero", "q")
    assert templates.render("Q: {prompt}\nA:", "hi", think_prefill=True) == "Q: hi\nA:<think>\n"
    assert templates.render("plain", "hi") == "hi"
    assert templates.check("no placeholder") is not None and templates.check("chat") is None


def test_chat_template_adds_r1_guidance(tiny_model):
    from transformers import AutoTokenizer

    from r1kit import templates

    tok = AutoTokenizer.from_pretrained(tiny_model)
    text = templates.render("chat", "What is 2 + 2?", tok, think_prefill=True)
    assert text == (
        "<|im_start|>user\nWhat is 2 + 2?\nPlease reason step by step, and put your final answer within \\boxed{}."
        "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize(
    "length, expected",
    [(10, 0.0), (12, 0.0), (14, -0.5), (16, -1.0), (17, -1.0)],
)
def test_overlong_penalty_is_dapos_soft_punishment(length, expected):
    from r1kit.rewards.length import overlong_penalty

    ids = [[0] * length]
    assert overlong_penalty(["x"], max_length=16, cache=4, completion_ids=ids) == [expected]


def test_trainer_config_checks_run_at_validate_time(write_recipe, tiny_model, capsys, tmp_path):
    # TRL refuses a generation batch that does not hold whole groups; validate says so first.
    path = grpo_recipe(write_recipe, tiny_model, [{"name": "format"}], trainer={"per_device_train_batch_size": 6, "num_generations": 4})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rl.trainer: generation_batch_size (6) must be divisible by num_generations (4)" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()
    assert main(["run", str(path)]) == 2 and not (tmp_path / "run").exists()  # run refuses before any stage


def test_a_trl_whose_overridden_method_changed_stops_the_stage_in_one_line_before_any_model_loads(write_recipe, tiny_model, tmp_path, monkeypatch, capsys):
    """r1kit's overrides are checked against the installed TRL: a method that takes other
    parameters (as `_generate_single_turn` gained one between TRL releases) stops the stage with
    one line naming it, before any model is loaded."""
    import trl
    from transformers import AutoModelForCausalLM

    def changed(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False, tools=None):
        raise AssertionError("never called")

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_single_turn", changed)
    loaded = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loaded.append(a) or None)
    path = grpo_recipe(write_recipe, tiny_model, [{"name": "math_accuracy"}])
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("r1kit: error: r1kit overrides trl.GRPOTrainer._generate_single_turn(self, prompt_ids, images, "
                             "multimodal_fields, num_generations, has_tool_images=False), written against TRL 1.16; the installed TRL")
    assert err[0].endswith("has (self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False, tools=None): "
                           "install trl~=1.16.0 (pyproject.toml's range)")
    assert loaded == [] and not (tmp_path / "run" / "rl" / "checkpoints").exists()


def test_the_run_record_and_report_name_the_paths_a_grpo_stage_took(write_recipe, tiny_model, tmp_path):
    """DONE.json records which of r1kit's paths trained the model, and why not where not; the
    report shows them."""
    path = grpo_recipe(write_recipe, tiny_model, [{"name": "math_accuracy"}], share_prompts=True,
                       trainer={"beta": 0.0, "max_steps": 1})
    assert main(["run", str(path)]) == 0
    done = json.loads((tmp_path / "run" / "rl" / "DONE.json").read_text())
    assert done["metrics"]["trainer_paths"] == {
        "tool_rollouts": "off: no tools",
        "r1kit_decoding_loop": "on",
        "zero_advantage_skip": "on",
        "shared_prompts": "on",
        "dynamic_sampling": "off: not asked",
        "async_generation": "off: not asked",
        "whole_vocab_log_probs": "on",
        "short_attention_in_math": "on",
    }
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| rl | r1kit_decoding_loop | on |" in report and "| rl | dynamic_sampling | off: not asked |" in report
    path = grpo_recipe(write_recipe, tiny_model, [{"name": "math_accuracy"}], trainer={"max_steps": 1, "top_k": 5})
    assert main(["run", str(path), "--restart-from", "rl"]) == 0
    paths = json.loads((tmp_path / "run" / "rl" / "DONE.json").read_text())["metrics"]["trainer_paths"]
    assert paths["r1kit_decoding_loop"] == "off: TopKLogitsWarper"
    assert paths["zero_advantage_skip"] == "off: beta 0.001 (a KL term moves every completion)"
