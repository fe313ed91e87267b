"""Tools in training, sampling and evaluation: the tool output tokens' gradients are zero (against
the same rollouts unmasked), a grpo stage with ``tools: [python]`` trains and logs its tool
figures, TRL's vLLM path is configured to stop at the fence, and eval and rejection sample with
tools."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from r1kit.errors import RecipeError
from r1kit.trainers.rollouts import tool_rollout_func
from r1kit.execution.tools import Tool, ToolConfig, output_block

TURNS = ["<think> ```python\nprint(6 * 7)\n```\n", " </think> <answer> 42 </answer>"]


def scripted_decode(tokenizer, turns=TURNS):
    """A stand-in for r1kit's decoding loop: a rollout's first turn writes turns[0] (stopping at
    its fence), a later one the rest, then the end token; rollouts of odd rank answer directly."""

    def decode(model, prompts, counts, max_tokens, draw, eos_ids, pad_id, stop=None):
        out = []
        for i, prompt in enumerate(p for p, n in zip(prompts, counts) for _ in range(n)):
            later = "```output" in tokenizer.decode(prompt)
            text = turns[1] if later else (turns[0] if i % 2 == 0 else " </think> <answer> 7 </answer>")
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = ids if not later and i % 2 == 0 else ids + [min(eos_ids)]
            tokens = []
            for t in ids[:max_tokens]:
                tokens.append(t)
                if stop is not None and stop(i, tokens):
                    break
            out.append(tokens)
        return out

    return decode


@pytest.fixture
def tool_trainer(tiny_model, tmp_path, monkeypatch):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from r1kit.trainers.trl_overrides import Features, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    monkeypatch.setattr("r1kit.sampling.decode.decode", scripted_decode(tokenizer))
    monkeypatch.delattr("r1kit.sampling.decode.Step.session")  # each turn from whole prompts: the scripted decode's
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=96, gradient_checkpointing=False, beta=0.0)
    reward = lambda completions, **kw: [float("42" in c.rsplit("</think>", 1)[-1]) for c in completions]  # noqa: E731
    trainer = GRPOTrainer(model=str(tiny_model), reward_funcs=[reward], args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": "What is 6 * 7?"}] * 4),
                          features=Features(skip_zero_advantage=False, tools=[Tool(ToolConfig(name="python"))]))
    assert trainer.paths["tool_rollouts"] == "on: r1kit's decoding loop"
    return trainer


def logit_grads(trainer, inputs) -> torch.Tensor:
    """The loss's gradient with respect to the final hidden state that scores each completion
    token [B, C, H] (TRL's head multiplies it by lm_head.weight itself; a position's final
    state feeds that position's logits and nothing else)."""
    seen = {}

    def keep(module, args, output):
        output.retain_grad()
        seen["hidden"] = output

    handle = trainer.model.model.norm.register_forward_hook(keep)
    try:
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, inputs).backward()
    finally:
        handle.remove()
    prompt, completion = inputs["prompt_ids"].shape[1], inputs["completion_ids"].shape[1]
    return seen["hidden"].grad[:, prompt - 1 : prompt - 1 + completion]  # position p scores token p + 1


def test_tool_output_tokens_get_no_gradient_and_would_without_the_mask(tool_trainer):
    trainer = tool_trainer
    batch = [{"prompt": "What is 6 * 7?"}] * 4
    inputs = trainer._generate_and_score_completions(batch)
    mask, tools = inputs["completion_mask"], inputs["tool_mask"]
    tokenizer = trainer.processing_class
    first = tokenizer.decode(inputs["completion_ids"][0][mask[0].bool()], skip_special_tokens=True)
    assert first == TURNS[0] + output_block("42") + TURNS[1]  # the tool ran; the model went on
    shown = tokenizer(output_block("42"), add_special_tokens=False)["input_ids"]
    assert int((tools[0] == 0).sum()) == len(shown) and bool(tools[1].all())  # the direct rollout calls nothing
    assert inputs["advantages"].abs().sum() > 0

    grads = logit_grads(trainer, inputs).abs().sum(-1)  # [B, C]
    out = (mask * (1 - tools)).bool()
    assert out.any() and grads[out].max() == 0  # no gradient through what the tool wrote
    assert grads[(mask * tools).bool()].max() > 0
    unmasked = logit_grads(trainer, {**inputs, "tool_mask": torch.ones_like(tools)}).abs().sum(-1)
    assert unmasked[out].max() > 0  # the same rollouts unmasked: those tokens would be trained


def test_tool_figures_are_logged_per_step(tool_trainer):
    tool_trainer.model.train()  # as in a training step: TRL logs under "train"
    tool_trainer._generate_and_score_completions([{"prompt": "What is 6 * 7?"}] * 4)
    metrics = tool_trainer._metrics["train"]
    assert metrics["tools/calls_per_rollout"] == [0.5] and metrics["tools/call_share"] == [0.5]
    assert metrics["tools/error_share"] == [0.0] and metrics["tools/sandbox_seconds"][0] > 0
    assert metrics["completions/mean_length"][0] < 40  # the model's tokens only, tool output left out


def test_a_grpo_stage_with_the_python_tool_trains_and_records_its_tool_figures(write_recipe, tiny_model):
    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    stage = {"name": "rl", "kind": "grpo", "data": {"source": "task:multiply", "task": {"n": 8, "digits": 2}}, "template": "plain",
             "tools": [{"name": "python", "calls": 1, "timeout": 2}], "rewards": [{"name": "math_accuracy"}],
             "trainer": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 24, "logging_steps": 1}}
    path = write_recipe({"model": str(tiny_model), "stages": [stage]})
    record = pipeline.run(load_recipe(path))["rl"]
    lines = [json.loads(x) for x in (Path(record["model"]).parent / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in lines if "tools/call_share" in r]
    assert len(logged) == 2 and all(0 <= r["tools/call_share"] <= 1 for r in logged)
    config = json.loads((Path(record["model"]).parent / "trainer_config.json").read_text())
    assert config["vllm_importance_sampling_correction"] is False


# ---- TRL's vLLM path ---------------------------------------------------------------------------


def test_with_vllm_the_turns_stop_at_the_fence_and_run_on_one_process(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    asked = []

    class Engine:
        generation_kwargs = {"repetition_penalty": 1.0}

        def generate(self, prompts, images, num_generations):
            asked.append((len(prompts), num_generations, dict(self.generation_kwargs)))
            later = ["```output" in tokenizer.decode(p) for p in prompts]
            texts = [TURNS[1] if x else TURNS[0] for x in later]
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if x else []) for t, x in zip(texts, later)]
            return prompts, ids, None, None

    trainer = SimpleNamespace(
        args=SimpleNamespace(temperature=1.0, top_p=1.0, bf16=False), processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id],
        _tokenizer=tokenizer, use_vllm=True, accelerator=SimpleNamespace(num_processes=1, device=torch.device("cpu")),
        vllm_generation=Engine(), max_completion_length=96, model=SimpleNamespace(training=True), _metrics={"train": {}, "eval": {}},
    )
    trainer._metrics["train"] = __import__("collections").defaultdict(list)
    trainer.rollout_func = tool_rollout_func(trainer, [Tool(ToolConfig(name="python"))], loop=False)
    assert trainer.vllm_generation.generation_kwargs == {"repetition_penalty": 1.0, "stop": ["\n```\n"], "include_stop_str_in_output": True}
    out = trainer.rollout_func(["What is 6 * 7?"] * 2, trainer)
    assert [a[:2] for a in asked] == [(2, 1), (2, 1)]  # each rollout alone, a turn per call
    assert tokenizer.decode(out["completion_ids"][0]) == TURNS[0] + output_block("42") + TURNS[1] + tokenizer.eos_token
    assert out["logprobs"] is None and len(out["env_mask"][0]) == len(out["completion_ids"][0])

    trainer.accelerator.num_processes = 2
    with pytest.raises(RecipeError, match="multi-turn rollouts with use_vllm run on one process"):
        tool_rollout_func(trainer, [Tool(ToolConfig(name="python"))], loop=False)


def test_importance_sampling_correction_is_refused_with_tools(write_recipe, capsys):
    from r1kit.cli import main

    stage = {"name": "rl", "kind": "grpo", "data": {"source": "task:multiply", "task": {"n": 8}}, "tools": ["python"],
             "rewards": [{"name": "math_accuracy"}],
             "trainer": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 4, "vllm_importance_sampling_correction": True}}
    assert main(["validate", str(write_recipe({"model": "tiny", "stages": [stage]}))]) == 2
    assert "rl.trainer.vllm_importance_sampling_correction: not with tools" in capsys.readouterr().err


# ---- eval and rejection ------------------------------------------------------------------------


@pytest.fixture
def scripted_sampling(tiny_model, monkeypatch):
    """The transformers sampler writing `scripted_decode`'s rollouts; returns a writer of a
    .jsonl file of `n` rows asking 6 * 7 (the question under `key`)."""
    from transformers import AutoTokenizer

    scripted = scripted_decode(AutoTokenizer.from_pretrained(tiny_model))
    monkeypatch.setattr("r1kit.sampling.hf_backend.decode", scripted)  # one turn
    monkeypatch.setattr("r1kit.sampling.decode.decode", scripted)  # the turns of tool calls, each from whole prompts:
    monkeypatch.delattr("r1kit.sampling.decode.Step.session")

    def questions(path: Path, key: str, n: int) -> Path:
        path.write_text("".join(json.dumps({"id": f"q{i}", key: "What is 6 * 7?", "answer": "42"}) + "\n" for i in range(n)))
        return path

    return questions


def test_eval_with_tools_keeps_transcripts_and_reports_pass_at_1_with_and_without_a_call(tiny_model, tmp_path, scripted_sampling, capsys):
    from r1kit.cli import main

    problems = scripted_sampling(tmp_path / "p.jsonl", "problem", 3)
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model), "--benchmark", str(problems), "--samples", "2", "--max-tokens", "96",
            "--template", "plain", "--backend", "transformers", "--tools", "python", "--output", str(out)]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["tool_calls"] for r in rows] == [1, 0] * 3
    assert rows[0]["completion"] == TURNS[0] + output_block("42") + TURNS[1] and rows[0]["correct"]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["pass@1"], summary["pass@1_with_tool"], summary["pass@1_without_tool"]) == (0.5, 1.0, 0.0)
    assert summary["tool_calls"] == 0.5 and summary["tool_call_share"] == 0.5
    assert json.loads((out / "settings.json").read_text())["tools"] == ["python"]
    capsys.readouterr()
    assert main([*argv[:-2], "--tools", "nope", "--output", str(tmp_path / "bad")]) == 2
    assert "unknown tool 'nope'" in capsys.readouterr().err


def test_rejection_samples_with_the_stages_tools_and_keeps_the_transcripts(write_recipe, tiny_model, tmp_path, scripted_sampling):
    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    data = scripted_sampling(tmp_path / "q.jsonl", "prompt", 2)
    stage = {"name": "rs", "kind": "rejection", "data": {"source": str(data)}, "template": "plain", "tools": ["python"],
             "rewards": [{"name": "math_accuracy"}], "samples": 2, "max_tokens": 96, "backend": "transformers"}
    record = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [stage]})))["rs"]
    rows = [json.loads(x) for x in Path(record["dataset"]).read_text().splitlines()]
    assert len(rows) == 2 and all(r["tool_calls"] == 1 and r["sample"] == 0 for r in rows)  # the direct "7"s were wrong
    assert rows[0]["completion"] == TURNS[0] + output_block("42") + TURNS[1]


def test_the_report_shows_tool_figures_per_eval_and_the_call_rate_over_rl_steps(tmp_path):
    from types import SimpleNamespace

    from r1kit.report import accuracy_rows, accuracy_table, tool_table

    base = {"m/pass@1": 0.4, "m/cons@4": 0.5, "m/mean_tokens": 20.0, "m/truncated": 0.0, "m/domain": "math"}
    tools = {"m/tool_calls": 0.5, "m/tool_call_share": 0.5, "m/pass@1_with_tool": 0.8, "m/pass@1_without_tool": 0.0}
    records = {"with": {"input_model": "x", "metrics": {**base, **tools}}, "without": {"input_model": "x", "metrics": base}}
    lines = accuracy_table(accuracy_rows(records)).splitlines()
    assert lines[0].startswith("| eval | model |")  # one model, two evals: each row names its eval
    assert lines[0].endswith("| tool_calls | tool_call_share | pass@1_with_tool | pass@1_without_tool |")
    assert lines[2].endswith("| 0.500 | 0.500 | 0.800 | 0.000 |") and lines[3].endswith("| - | - | - | - |")

    (tmp_path / "rl").mkdir()
    steps = [{"step": s, "tools/call_share": share, "tools/calls_per_rollout": share, "tools/error_share": 0.1, "tools/sandbox_seconds": 1.0}
             for s, share in [(1, 0.5), (2, 0.75), (3, 1.0)]]
    (tmp_path / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    recipe = SimpleNamespace(stages=[SimpleNamespace(name="rl", kind="grpo"), SimpleNamespace(name="plain", kind="grpo")])
    table = tool_table(recipe, tmp_path).splitlines()
    assert table[2] == "| rl | 0.500 → 1.000 | 0.50 → 1.00 | 0.100 | 3.0 |" and len(table) == 3
