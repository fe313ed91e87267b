"""Asynchronous GRPO on a CPU (r1kit.trainers.async_generation): in lockstep it is the synchronous
stage; the staleness bound holds whichever side is slow; the correction is TRL's ratio truncated
as written; new weights reach the generator; a killed run resumes; bad settings are one line."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import interruptible
import torch

from r1kit import pipeline
from r1kit.cli import main
from r1kit.recipe import load_recipe
from r1kit.trainers import async_generation

TRAINER = {"max_steps": 4, "per_device_train_batch_size": 16, "num_generations": 8, "max_completion_length": 24,
           "learning_rate": 5.0e-4, "logging_steps": 1, "beta": 0.0, "loss_type": "dapo"}


def recipe(write_recipe, model: Path, out: Path, name: str = "recipe.yaml", **stage) -> Path:
    rl = {"name": "rl", "kind": "grpo", "template": "plain", "data": {"source": "task:addition", "task": {"n": 32, "digits": 1}},
          "rewards": [{"name": "math_accuracy"}], **stage, "trainer": {**TRAINER, **stage.get("trainer", {})}}
    return write_recipe({"model": str(model), "output_dir": str(out), "stages": [rl]}, name)


def steps(out: Path) -> list[dict]:
    return [m for m in map(json.loads, (out / "rl" / "metrics.jsonl").read_text().splitlines()) if "loss" in m]


def test_lockstep_gives_the_synchronous_stages_steps(write_recipe, cold_start, tmp_path):
    """max_staleness 0: the same samples (so rewards and lengths), loss and weights as the
    synchronous stage, for the same seed, with the rollouts drawn in the generator process."""
    sync = pipeline.run(load_recipe(recipe(write_recipe, cold_start, tmp_path / "sync")))["rl"]
    lock = pipeline.run(load_recipe(recipe(write_recipe, cold_start, tmp_path / "lock", "l.yaml", max_staleness=0)))["rl"]
    assert lock["metrics"]["trainer_paths"]["async_generation"].startswith("on: at most 0 steps ahead")
    assert sync["metrics"]["trainer_paths"]["async_generation"] == "off: not asked"
    a, b = steps(tmp_path / "sync"), steps(tmp_path / "lock")
    assert len(a) == len(b) == 4
    assert any(m["grad_norm"] > 0 for m in a)  # the policy moves, so lockstep has something to keep up with
    for x, y in zip(a, b):
        for key in ("reward", "completions/mean_length", "num_tokens", "frac_reward_zero_std"):
            assert x[key] == y[key], key
        assert math.isclose(x["loss"], y["loss"], rel_tol=1e-4, abs_tol=1e-6)
        assert y["async/staleness"] == 0
        if "async/ratio_max" in y:  # not in a step whose every completion had zero advantage (no forward pass)
            assert abs(y["async/ratio_max"] - 1) < 1e-3 and abs(y["async/ratio_min"] - 1) < 1e-3  # the same weights, to rounding
            assert y["async/corrected_share"] == 0
    assert any("async/ratio_max" in y for y in b)
    from transformers import AutoModelForCausalLM

    w1 = AutoModelForCausalLM.from_pretrained(sync["model"]).state_dict()
    w2 = AutoModelForCausalLM.from_pretrained(lock["model"]).state_dict()
    for name, tensor in w1.items():
        torch.testing.assert_close(w2[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def slow_trainer(monkeypatch):
    from r1kit.trainers import trl_overrides

    step = trl_overrides.GRPOTrainer.training_step

    def slow(self, *args, **kwargs):
        time.sleep(0.4)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(trl_overrides.GRPOTrainer, "training_step", slow)


def slow_serve(*args):
    """The generator process, 0.4 s slower per batch (it runs in a spawned process: a test's
    monkeypatch does not reach it, the function it runs does)."""
    import r1kit.sampling.decode as decode_lib

    decode = decode_lib.decode

    def slow(*a, **k):
        time.sleep(0.4)
        return decode(*a, **k)

    decode_lib.decode = slow
    async_generation.serve(*args)


@pytest.mark.parametrize("slow", ["trainer", "generator"])
def test_the_staleness_bound_holds_whichever_side_is_slow(write_recipe, cold_start, tmp_path, monkeypatch, slow):
    if slow == "trainer":
        slow_trainer(monkeypatch)
    else:
        monkeypatch.setattr(async_generation, "serve", slow_serve)
    record = pipeline.run(load_recipe(recipe(write_recipe, cold_start, tmp_path / slow, max_staleness=2,
                                             trainer={"max_steps": 6})))["rl"]
    logged = steps(tmp_path / slow)
    staleness = [m["async/staleness"] for m in logged]
    assert len(staleness) == 6 and max(staleness) <= 2
    waits = sum(m["async/trainer_wait_seconds"] for m in logged[1:]), sum(m["async/generator_wait_seconds"] for m in logged)
    if slow == "trainer":  # the generator runs the whole bound ahead and waits for weights
        assert staleness[3:] == [2, 2, 2] and waits[1] > 0.4 and waits[0] < waits[1] / 4
    else:  # the trainer waits for every batch, which the newest weights draw
        assert waits[0] > 1.0 and waits[1] < waits[0] / 4
    metrics = record["metrics"]
    assert metrics["staleness_max"] <= 2 and metrics["dropped_share"] == 0
    assert {"ratio_min", "ratio_max", "corrected_share", "trainer_wait_seconds", "generator_wait_seconds"} <= set(metrics)


def keep_batches(monkeypatch) -> list[dict]:
    from r1kit.trainers import trl_overrides

    seen = []
    score = trl_overrides.trl.GRPOTrainer._generate_and_score_completions

    def keep(self, inputs):
        batch = score(self, inputs)
        seen.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return batch

    monkeypatch.setattr(trl_overrides.trl.GRPOTrainer, "_generate_and_score_completions", keep)
    return seen


def test_by_default_ppos_ratio_is_taken_to_the_sampling_policy(write_recipe, cold_start, tmp_path, monkeypatch):
    """The trainer's batches carry the generator's log-probabilities as PPO's old ones (no extra
    forward pass); the logged ratio is the training pass's to them, clipped at 1 +- epsilon."""
    from r1kit.trainers import trl_overrides

    seen = keep_batches(monkeypatch)
    trained = []
    loss = trl_overrides.trl.GRPOTrainer._compute_loss
    monkeypatch.setattr(trl_overrides.trl.GRPOTrainer, "_compute_loss",
                        lambda self, model, inputs: trained.append(inputs["old_per_token_logps"].clone()) or loss(self, model, inputs))
    slow_trainer(monkeypatch)
    loaded = load_recipe(recipe(write_recipe, cold_start, tmp_path / "run", max_staleness=1,
                                trainer={"learning_rate": 2.0e-3, "epsilon": 0.05, "beta": 0.001, "loss_type": "grpo"}))
    records = pipeline.run(loaded)
    record = records["rl"]
    assert record["metrics"]["trainer_paths"]["async_generation"].endswith("PPO clip to the sampling policy")
    assert len(seen) == len(trained) == 4  # beta > 0: no completion leaves the loss
    for batch, old in zip(seen, trained):
        assert "importance_sampling_ratio" not in batch and "old_per_token_logps" not in batch  # TRL's correction is off
        drawn = {tuple(row.tolist()) for row in batch["sampling_per_token_logps"]}
        assert {tuple(row.tolist()) for row in old} == drawn  # the same rows, shuffled
    logged = steps(tmp_path / "run")
    moved = logged[1:]
    from r1kit import report as report_lib

    report = report_lib.write_report(loaded, records).read_text()
    assert "## Asynchronous rollouts" in report and "| rl | " in report.split("## Asynchronous rollouts")[1]
    assert (tmp_path / "run" / "plots" / "rl.png").is_file()
    assert max(m["async/ratio_max"] for m in moved) > 1.05 and min(m["async/ratio_min"] for m in moved) < 0.95
    assert sum(m["async/corrected_share"] > 0 for m in moved) >= 2


def test_ratio_figures_on_a_literal_batch():
    log2 = math.log(2.0)
    rows = {"completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
            "old_per_token_logps": torch.tensor([[0.0, -log2, log2, 0.0], [0.0, -0.1, 0.0, 0.0]])}
    logps = torch.zeros(2, 4)  # ratios exp(0 - old): 1, 2, 1/2, (masked) | 1, e^0.1
    figures = async_generation.ratio_figures(logps, rows, 0.2, 0.2)
    assert figures["async/ratio_max"] == pytest.approx(2.0) and figures["async/ratio_min"] == pytest.approx(0.5)
    assert figures["async/ratio_mean"] == pytest.approx((1 + 2 + 0.5 + 1 + math.exp(0.1)) / 5)
    assert figures["async/corrected_share"] == pytest.approx(2 / 5)  # 2 and 1/2 leave [0.8, 1.2]; e^0.1 = 1.105 does not


def test_trls_importance_sampling_correction_is_the_ratio_truncated_at_the_bound(write_recipe, cold_start, tmp_path, monkeypatch):
    """Opt-in: on the batches a stale run really trained on, TRL's importance ratio is
    exp(old - sampling) per token, truncated at the recipe's bound; the truncated share is what r1kit logs."""
    seen = keep_batches(monkeypatch)
    slow_trainer(monkeypatch)  # so every batch after the first is a step stale
    trainer = {"learning_rate": 5.0e-3, "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_truncate",
               "vllm_importance_sampling_clip_max": 1.02}
    pipeline.run(load_recipe(recipe(write_recipe, cold_start, tmp_path / "run", max_staleness=1, trainer=trainer)))
    logged = steps(tmp_path / "run")
    truncated = 0
    for batch, m in zip(seen, logged):
        mask = batch["completion_mask"].bool()
        by_hand = torch.exp(batch["old_per_token_logps"] - batch["sampling_per_token_logps"]).clamp(max=1.02)
        torch.testing.assert_close(batch["importance_sampling_ratio"][mask], by_hand[mask])
        share = float((torch.exp(batch["old_per_token_logps"] - batch["sampling_per_token_logps"])[mask] > 1.02).float().mean())
        assert m["async/corrected_share"] == pytest.approx(share)
        truncated += share > 0
    assert truncated >= 2  # stale batches really were corrected


def test_outside_share_on_a_literal_batch():
    log2 = math.log(2.0)
    batch = {"completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
             "old_per_token_logps": torch.tensor([[0.0, log2, -log2, 9.0], [log2, log2, 0.0, 0.0]]),
             "sampling_per_token_logps": torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])}
    # token ratios 1, 2, 1/2 | 2, 2 (the masked 9 ignored): above 1.5 are 3 of 5, below 0.75 1 of 5
    assert async_generation.outside_share(batch, "token_truncate", None, 1.5) == pytest.approx(3 / 5)
    assert async_generation.outside_share(batch, "token_mask", 0.75, 1.5) == pytest.approx(4 / 5)
    # sequence ratios: 1 * 2 * 1/2 = 1 and 2 * 2 = 4
    assert async_generation.outside_share(batch, "sequence_mask", None, 3.0) == pytest.approx(1 / 2)


def test_new_weights_reach_the_generator(tiny_model):
    """The generator's sampling log-probabilities are the trainer's for the same tokens, before and
    after an update; after it they are no longer the old weights'."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    old = {k: v.clone() for k, v in model.state_dict().items()}
    generator = async_generation.Generator(model, max_staleness=0, temperature=0.7, top_p=1.0, eos_ids={0}, pad_id=0,
                                           bf16=False, threads=1, seed=0)
    prompts = [[5, 6, 7, 8], [9, 10]]

    def draw(step: int):
        generator.submit(step, prompts, [2, 2], 12)
        return generator.take()[0]

    def scored(drawn, weights) -> list[torch.Tensor]:
        model.load_state_dict(weights)
        out = []
        for prompt, completion in zip([p for p, n in zip(prompts, [2, 2]) for _ in range(n)], drawn.completions):
            ids = torch.tensor([prompt + completion])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1:-1] / 0.7
            out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1))
        return out

    try:
        generator.publish(model, 0)
        first = draw(0)
        assert first.version == 0
        for mine, theirs in zip(scored(first, old), first.logps):
            torch.testing.assert_close(torch.tensor(theirs), mine, rtol=1e-4, atol=1e-4)
        new = {k: v + 0.05 * torch.randn_like(v) for k, v in old.items()}
        model.load_state_dict(new)
        generator.publish(model, 1)
        second = draw(1)
        assert second.version == 1
        for mine, theirs in zip(scored(second, new), second.logps):
            torch.testing.assert_close(torch.tensor(theirs), mine, rtol=1e-4, atol=1e-4)
        stale = scored(second, old)
        assert max(float((torch.tensor(t) - s).abs().max()) for t, s in zip(second.logps, stale)) > 0.01
    finally:
        generator.close()
    assert not generator.process.is_alive()


def test_sigkill_mid_stage_resumes_with_no_step_lost_or_repeated(write_recipe, cold_start, tmp_path, hold, wait_gone):
    path = recipe(write_recipe, cold_start, tmp_path / "run", max_staleness=1,
                  trainer={"max_steps": 5, "save_steps": 2})
    proc = subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=hold.env(step=2, output_dir=tmp_path / "run" / "rl" / "checkpoints"))
    pids = hold.wait(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_gone(pids)
    assert not (tmp_path / "run" / "rl" / "DONE.json").exists()
    assert main(["run", str(path)]) == 0
    logged = steps(tmp_path / "run")
    assert [m["step"] for m in logged] == [1, 2, 3, 4, 5]
    assert all(m["async/staleness"] <= 1 for m in logged)
    done = json.loads((tmp_path / "run" / "rl" / "DONE.json").read_text())
    assert done["metrics"]["trainer_paths"]["async_generation"].startswith("on")


def test_ctrl_c_mid_stage_is_one_line_and_leaves_no_generator(write_recipe, cold_start, tmp_path, hold, wait_gone):
    """Issue 66, point 3: Ctrl-C in an asynchronous GRPO stage printed tracebacks (the trainer's and
    the generator process's) ending in KeyboardInterrupt."""
    path = recipe(write_recipe, cold_start, tmp_path / "run", max_staleness=1, trainer={"max_steps": 5, "save_steps": 2})
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(path)], stdout=log, stderr=log, start_new_session=True,
                                env=hold.env(step=2, output_dir=tmp_path / "run" / "rl" / "checkpoints"), preexec_fn=interruptible)
        try:
            pids = hold.wait(proc)
            children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: the whole foreground group
            assert proc.wait(120) == 130
        finally:  # a failed test leaves nothing running
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    wait_gone(pids + children)
    said = (tmp_path / "run.log").read_text()
    assert said.rstrip().endswith("r1kit: interrupted; run the same command again to resume from what finished")
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said


@pytest.mark.parametrize("stage, expected", [
    ({"max_staleness": -1}, "rl.max_staleness: -1: an optimizer step count, 0 or more"),
    ({"max_staleness": "two"}, "rl.max_staleness"),
    ({"max_staleness": 1, "dynamic_sampling": True}, "rl.max_staleness: not with dynamic_sampling"),
    ({"max_staleness": 1, "trainer": {"num_iterations": 2}}, "not with trainer.num_iterations 2"),
    ({"max_staleness": 1, "trainer": {"steps_per_generation": 2}}, "steps_per_generation must equal gradient_accumulation_steps"),
    ({"max_staleness": 1, "trainer": {"use_vllm": True}}, "not with trainer.use_vllm"),
    # what r1kit's decoding loop (the generator's) does not apply: refused before any model loads
    ({"max_staleness": 1, "trainer": {"top_k": 5}},
     "rl.max_staleness: r1kit's generator samples with temperature and top-p only; not with trainer.top_k 5"),
    ({"max_staleness": 1, "trainer": {"repetition_penalty": 1.1}}, "not with trainer.repetition_penalty 1.1"),
    ({"max_staleness": 1, "trainer": {"generation_kwargs": {"top_k": 5}}}, "not with trainer.generation_kwargs"),
])
def test_bad_async_settings_are_one_line(write_recipe, tiny_model, tmp_path, capsys, stage, expected):
    path = recipe(write_recipe, tiny_model, tmp_path / "run", **stage)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err
    assert main(["run", str(path)]) == 2
    assert not (tmp_path / "run").exists()


def test_the_loop_must_be_able_to_draw_the_rollouts(write_recipe, tiny_model, tmp_path, capsys):
    """What only the model's own generation config asks (here no_repeat_ngram_size) is known once it loads: one
    line naming the recipe, the stage and the key."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "generation_config.json").write_text(json.dumps({"no_repeat_ngram_size": 3}))
    path = recipe(write_recipe, str(model), tmp_path / "run", max_staleness=1)
    assert main(["run", str(path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model loaded (datasets' progress above it)
    assert last.startswith(f"r1kit: error: {path}: rl.max_staleness: asynchronous generation runs r1kit's decoding loop"), last
    assert "NoRepeatNGram" in last


def scripted_serve(*args):
    """The generator process with test_tools_grpo's scripted decoding loop (a tool call on even rows)."""
    import r1kit.sampling.decode as decode_lib
    from tests.test_tools_grpo import scripted_decode

    decode_lib.decode = scripted_decode(args[-1]["tokenizer"])
    del decode_lib.Step.session  # each turn from whole prompts: the scripted decode's
    async_generation.serve(*args)


def test_tool_rollouts_come_from_the_generator_with_their_tool_mask(tiny_model, tmp_path, monkeypatch):
    """With tools, the generator runs the turns (the sandbox in its process): the trainer gets each
    rollout's tool mask, sampling log-probabilities scored by the weights that drew it (0 on the
    tool's tokens), and the tools' figures."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from r1kit.execution.tools import Tool, ToolConfig
    from r1kit.trainers.trl_overrides import Features, GRPOTrainer

    monkeypatch.setattr(async_generation, "serve", scripted_serve)
    seen = keep_batches(monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=96, gradient_checkpointing=False, beta=0.0, max_steps=2, logging_steps=1,
                        vllm_importance_sampling_correction=False, save_strategy="no")
    reward = lambda completions, **kw: [float("42" in c.rsplit("</think>", 1)[-1]) for c in completions]  # noqa: E731
    trainer = GRPOTrainer(model=str(tiny_model), reward_funcs=[reward], args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": "What is 6 * 7?"}] * 8),
                          features=Features(tools=[Tool(ToolConfig(name="python"))], max_staleness=1))
    try:
        assert trainer.paths["tool_rollouts"] == "on: the asynchronous generator's decoding loop"
        trainer.train()
    finally:
        trainer.generator.close()
    assert len(seen) == 2
    for batch in seen:
        tool = batch["tool_mask"] == 0
        real = batch["completion_mask"].bool()
        assert (tool & real).any()  # the python block's output, in the even rows
        assert (batch["sampling_per_token_logps"][tool & real] == 0).all()
        model_tokens = batch["sampling_per_token_logps"][~tool & real]
        assert (model_tokens < 0).all() and torch.isfinite(model_tokens).all()
    logged = [m for m in trainer.state.log_history if "loss" in m]
    assert all(m["tools/call_share"] == 0.5 for m in logged) and all(m["async/staleness"] <= 1 for m in logged)


def test_generation_goes_on_across_epochs(write_recipe, cold_start, tmp_path):
    """Two optimizer steps an epoch: the lookahead stops at each epoch's end and starts again with
    the next epoch's order; every step gets its own batch, within the bound."""
    path = recipe(write_recipe, cold_start, tmp_path / "run", max_staleness=1, data={"source": "task:addition", "task": {"n": 4, "digits": 1}},
                  trainer={"max_steps": 5})
    pipeline.run(load_recipe(path))
    logged = steps(tmp_path / "run")
    assert [m["step"] for m in logged] == [1, 2, 3, 4, 5] and all(m["async/staleness"] <= 1 for m in logged)
    assert logged[-1]["epoch"] == pytest.approx(2.5)


def test_a_lora_stage_sends_the_merged_weights(write_recipe, cold_start, tmp_path):
    """With peft: the generator draws with the base weights plus the adapter's delta: in lockstep
    its log-probabilities are the trainer's (the ratio is 1 to rounding) while the adapter moves."""
    path = recipe(write_recipe, cold_start, tmp_path / "run", max_staleness=0, peft={"r": 8, "lora_alpha": 16},
                  trainer={"learning_rate": 2.0e-2, "beta": 0.001, "loss_type": "grpo"})
    record = pipeline.run(load_recipe(path))["rl"]
    assert record["metrics"]["trainer_paths"]["async_generation"].startswith("on")
    logged = steps(tmp_path / "run")
    assert any(m["grad_norm"] > 0 for m in logged)
    for m in logged:
        assert abs(m["async/ratio_max"] - 1) < 1e-3 and abs(m["async/ratio_min"] - 1) < 1e-3, m
    assert logged[-1]["kl"] > 0  # the adapter moved the policy away from the start


def test_plain_weights_of_a_lora_model_are_its_merged_weights(tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=4, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a moved adapter (fresh ones start at zero)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain = async_generation.plain_weights(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the model untouched
    merged = model.merge_and_unload().state_dict()
    assert set(plain) == set(merged)
    for name, tensor in merged.items():
        torch.testing.assert_close(plain[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_on_a_gpu_machine_the_run_is_refused_before_any_compute(write_recipe, tiny_model, tmp_path, capsys, monkeypatch):
    import r1kit.hardware

    monkeypatch.setattr(r1kit.hardware, "has_gpu", lambda: True)
    path = recipe(write_recipe, tiny_model, tmp_path / "run", max_staleness=1, trainer={"use_cpu": True})  # TRL's config, on a faked GPU
    assert main(["validate", str(path)]) == 0  # a recipe may be written for another machine: a note
    assert main(["validate", str(path), "--here"]) == 2
    assert "rl.max_staleness: r1kit's asynchronous rollouts run on a CPU" in capsys.readouterr().err
    assert main(["run", str(path)]) == 2
    assert not (tmp_path / "run").exists()


def test_under_a_launchers_several_processes_the_run_is_refused_before_any_compute(write_recipe, tiny_model, tmp_path, capsys,
                                                                                  monkeypatch):
    path = recipe(write_recipe, tiny_model, tmp_path / "run", max_staleness=1)
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "R1KIT_STAGE_PROCESS": "1"}.items():
        monkeypatch.setenv(name, value)  # rank 0 of two; its stages in processes of their own (it joins no group)
    assert main(["validate", str(path), "--here"]) == 2
    assert "rl.max_staleness: r1kit's asynchronous rollouts run on one process, not 2" in capsys.readouterr().err
    assert main(["run", str(path)]) == 2
    assert not (tmp_path / "run").exists()
