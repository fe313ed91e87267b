"""Stages over environments on the tiny model: a rejection stage keeps whole conversations scored
by the environment and, killed with SIGKILL, resumes without playing a finished episode again;
a grpo stage trains on TRL's environment_factory with the environment's tokens masked out of the
loss; an sft stage on conversations with an environment trains the model's turns only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from r1kit import pipeline
from r1kit.recipe import load_recipe


class Tally:
    """Rewards 0.5 every episode; each reset appends the row's id to `log` (the episodes played)."""

    def __init__(self, log: str = ""):
        self.log = log

    def reset(self, **row):
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{row['id']}\n")
        return " Say something."

    def get_reward(self) -> float:
        return 0.5


def rejection(log, **extra):
    return {"name": "rej", "kind": "rejection", "template": "plain", "data": {"source": "prompts.jsonl"},
            "environment": {"name": "test_environment_stages:Tally", "args": {"log": str(log)}, "weight": 2.0},
            "samples": 2, "chunk_prompts": 2, "min_total": 1.0, "max_kept_per_prompt": None, "backend": "transformers",
            "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "filters": {"truncated": False}, **extra}


def prompts(folder: Path, n: int) -> None:
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Hello {i}."}) + "\n" for i in range(n)))


def test_rejection_keeps_conversations_scored_by_the_environment_and_sft_trains_on_them(write_recipe, tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    prompts(tmp_path, 3)
    sft = {"name": "sft", "kind": "sft", "data": {"source": "rej"}, "trainer": {"max_steps": 1, "per_device_train_batch_size": 2}}
    run = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [rejection(tmp_path / "played"), sft]})))
    record = run["rej"]
    rows = [json.loads(line) for line in Path(record["dataset"]).read_text().splitlines()]
    assert len(rows) == 6 and all(r["reward_total"] == 1.0 and r["rewards"] == {"env_Tally": 0.5} for r in rows)
    first = rows[0]
    assert first["messages"][0] == {"role": "user", "content": "Hello 0. Say something."}  # reset's text joins the prompt
    assert first["messages"][1]["role"] == "assistant" and first["episode"]["environment"] == "Tally"
    assert first["tools"] is None and (tmp_path / "played").read_text().split() == ["p0", "p0", "p1", "p1", "p2", "p2"]
    config = json.loads((tmp_path / "run" / "sft" / "trainer_config.json").read_text())  # SFT on the kept episodes: the model's turns only
    assert config["assistant_only_loss"] is True and run["sft"]["metrics"]["rows"] == 6


def test_rejection_over_an_environment_resumes_after_sigkill_without_replaying(write_recipe, tiny_model, tmp_path, hold, wait_gone):
    prompts(tmp_path, 8)
    held = {"rewards": [{"name": "test_rejection:hold_after_two_chunks"}]}
    whole = write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "whole"),
                          "stages": [rejection(tmp_path / "whole.played", **held)]}, "whole.yaml")
    env = hold.env()
    done = subprocess.run([sys.executable, "-m", "r1kit.cli", "run", str(whole)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "killed"),
                           "stages": [rejection(tmp_path / "killed.played", **held)]}, "killed.yaml")
    command = [sys.executable, "-m", "r1kit.cli", "run", str(killed)]
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=hold.env(reward_calls=2), cwd=tmp_path)
    pids = hold.wait(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_gone(pids)
    played = (tmp_path / "killed.played").read_text().split()
    assert played == ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3", "p4", "p4", "p5", "p5"]  # the third chunk was being scored
    (tmp_path / "killed.played").unlink()
    resumed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming, 2 of 4 chunks already done" in resumed.stderr
    assert (tmp_path / "killed.played").read_text().split() == ["p4", "p4", "p5", "p5", "p6", "p6", "p7", "p7"]  # no finished episode again
    read = lambda run: [json.loads(line) for line in (tmp_path / run / "rej" / "dataset.jsonl").read_text().splitlines()]  # noqa: E731
    assert read("killed") == read("whole")


def test_grpo_trains_on_trls_environment_loop_with_the_environments_tokens_masked(tiny_model, tmp_path, monkeypatch):
    """TRL's own environment loop (environment_factory), a scripted policy calling the tool: the
    trainer's tool mask is 0 on exactly the environment's reply tokens, and the reward is the
    environment's, weighed."""
    import datasets
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from r1kit.environments import from_recipe
    from r1kit.environments.episodes import trl_factory, trl_reward
    from r1kit.trainers import trl_overrides

    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    script = ['<tool_call>{"name": "guess", "arguments": {"number": 4}}</tool_call><|im_end|>', "done<|im_end|>"]
    specs = from_recipe({"name": "guess", "max_turns": 3}, "environment")
    figures = {}
    rows = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "Find it."}], "secret": 4}] * 2)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=96, report_to="none", max_tool_calling_iterations=2, logging_steps=1, beta=0.0)
    trainer = trl_overrides.GRPOTrainer(model=str(tiny_model), reward_funcs=[trl_reward(specs[0], figures)], args=args, train_dataset=rows,
                                        processing_class=tok, environment_factory=trl_factory(specs))
    def scripted(prompts, counts, max_tokens, stop=None):  # a rollout with k tool replies so far writes script[k]
        out = []
        for p, n in zip(prompts, counts):
            text = script[min(tok.decode(p).count("<|im_start|>tool"), len(script) - 1)]
            out += [tok(text, add_special_tokens=False)["input_ids"]] * n
        return out

    trainer.loop = scripted
    seen = {}
    original = trainer._compute_loss

    def capture(model, inputs):
        seen.update(inputs)
        return original(model, inputs)

    trainer._compute_loss = capture
    trainer.train()
    ids, mask = seen["completion_ids"][0], seen["tool_mask"][0]
    written = tok.decode(ids[(mask == 0) & (seen["completion_mask"][0] == 1)])
    kept = tok.decode(ids[(mask == 1) & (seen["completion_mask"][0] == 1)])
    assert "correct" in written and "<tool_call>" not in written  # the environment's reply, and only it, is out of the loss
    assert kept.count("<tool_call>") == 1 and "done" in kept and "correct" not in kept
    assert figures["env/reward/guess"] == 1.0 and figures["env/calls/guess"] == 1.0
    assert torch.equal(seen["advantages"], torch.zeros(2))  # both rollouts found it: equal rewards


def test_a_packaged_gym_style_environment_trains_and_evaluates(write_recipe, tiny_model, tmp_path, monkeypatch):
    """skyrl-gym's multi-turn GSM8K end to end on the tiny model: a grpo stage (r1kit's rollout
    function: TRL's loop plays function calls only) and an eval stage, scored by the environment."""
    monkeypatch.chdir(tmp_path)
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    (tmp_path / "gsm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {"name": "skyrl_gym", "args": {"env_id": "gsm8k_multi_turn", "extras": {"max_turns": 2}}}
    rl = {"name": "rl", "kind": "grpo", "data": {"source": "gsm.jsonl"}, "template": "plain", "environment": env,
          "trainer": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 24,
                      "use_cpu": True, "report_to": "none", "save_strategy": "no"}}
    ev = {"name": "eval", "kind": "eval", "benchmarks": ["gsm.jsonl"], "problem_field": "prompt", "samples": 2, "max_tokens": 24,
          "template": "plain", "environment": {**env, "args": {**env["args"], "prompt": "prompt"}}, "backend": "transformers"}
    records = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [rl, ev]})))
    assert records["rl"]["metrics"]["trainer_paths"]["tool_rollouts"].startswith("on: a gym-style environment's turns")
    logged = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert "rewards/env_skyrl_gym/mean" in logged[0] and "env/turns_per_rollout" in logged[0]
    summary = json.loads((tmp_path / "run" / "eval" / "gsm" / "summary.json").read_text())
    assert summary["domain"] == "environment" and summary["problems"] == 4 and 0.0 <= summary["pass@1"] <= 1.0


def test_sft_on_conversations_with_an_environment_trains_the_models_turns_by_default(write_recipe, tiny_model, tmp_path):
    """An sft stage whose rows are whole games (an environment's turns inside, as a rejection stage
    over an environment keeps them) turns TRL's assistant-only loss on; on a model whose chat
    template cannot mark the model's turns it refuses in one line before training, and as the
    recipe is read where the recipe asks for it."""
    import shutil

    import pytest
    from transformers import AutoTokenizer

    from r1kit.errors import RecipeError
    from r1kit.offline.tasks import guess
    from r1kit.offline.tiny import CHAT_TEMPLATE

    turns = guess(60, demos=True, informed=0.5)  # whole games: each game's closing turn after the conversation so far
    games = [{"messages": t["prompt"] + t["completion"], "tools": t["tools"]} for t in turns if not t["completion"][0].get("tool_calls")][:8]
    (tmp_path / "games.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    sft = {"name": "sft", "kind": "sft", "data": {"source": str(tmp_path / "games.jsonl")}, "trainer": {"max_steps": 1, "per_device_train_batch_size": 4}}
    record = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [sft]})))
    assert json.loads((tmp_path / "run" / "sft" / "trainer_config.json").read_text())["assistant_only_loss"] is True
    assert record["sft"]["metrics"]["rows"] == 8

    unmarked = tmp_path / "unmarked"
    shutil.copytree(tiny_model, unmarked)
    tok = AutoTokenizer.from_pretrained(unmarked)
    tok.chat_template = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tok.save_pretrained(unmarked)
    recipe = load_recipe(write_recipe({"model": str(unmarked), "output_dir": str(tmp_path / "unmarked_run"), "stages": [sft]}, "unmarked.yaml"))
    with pytest.raises(RecipeError, match=r"^sft\.trainer\.assistant_only_loss \(on by default: the conversations hold an environment's turns\): .*generation %\} markers") as refused:
        pipeline.run(recipe)
    assert "\n" not in str(refused.value) and not (tmp_path / "unmarked_run" / "sft" / "trainer_config.json").exists()
    asked = {**sft, "trainer": {**sft["trainer"], "assistant_only_loss": True}}
    with pytest.raises(RecipeError, match=r"asked\.yaml: sft\.trainer\.assistant_only_loss: .*unmarked.*set trainer\.assistant_only_loss: false"):
        load_recipe(write_recipe({"model": str(unmarked), "stages": [asked]}, "asked.yaml"))
