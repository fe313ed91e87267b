"""The DeepSeek-R1 pipeline on the tiny model, on CPU: cold-start SFT → GRPO → rejection sampling
→ SFT, each stage consuming what the one before produced; and the shipped recipes/r1.yaml
validates."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from r1kit import pipeline
from r1kit.cli import main
from r1kit.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TASK = {"source": "task:addition", "task": {"n": 80, "digits": 1}}
REWARDS = [{"name": "math_accuracy", "weight": 1.0}, {"name": "format", "weight": 0.5}]


def test_sft_grpo_rejection_sft_hand_off_end_to_end(write_recipe, tiny_model, tmp_path):
    stages = [
        {
            "name": "cold_start",
            "kind": "sft",
            "format": "prompt_completion",
            "data": TASK,
            "trainer": {"max_steps": 200, "per_device_train_batch_size": 32, "learning_rate": 5.0e-3, "lr_scheduler_type": "cosine", "warmup_steps": 10, "logging_steps": 50},
        },
        {
            "name": "reasoning_rl",
            "kind": "grpo",
            "template": "plain",
            "data": TASK,
            "rewards": REWARDS,
            "trainer": {"max_steps": 4, "per_device_train_batch_size": 32, "num_generations": 8, "max_completion_length": 32, "learning_rate": 5.0e-4},
        },
        {
            "name": "rejection",
            "kind": "rejection",
            "template": "plain",
            "data": {**TASK, "limit": 32},
            "rewards": REWARDS,
            "min_total": 1.5,  # right answer and right format
            "samples": 8,
            "temperature": 1.0,
            "top_p": 1.0,
            "max_tokens": 32,
            "chunk_prompts": 16,
            "backend": "transformers",
        },
        {
            "name": "sft",
            "kind": "sft",
            "data": {"source": "rejection"},
            "trainer": {"max_steps": 10, "per_device_train_batch_size": 16, "learning_rate": 5.0e-4, "logging_steps": 1},
        },
    ]
    records = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": stages})))
    cold, rl, rej, sft = (records[s["name"]] for s in stages)
    assert rl["input_model"] == cold["model"] and rej["input_model"] == rl["model"]
    assert rej["model"] is None and sft["input_model"] == rl["model"]  # rejection hands on a dataset only
    rows = [json.loads(line) for line in Path(rej["dataset"]).read_text().splitlines()]
    assert rows and all(r["reward_total"] >= 1.5 for r in rows)
    assert sft["metrics"]["rows"] == len(rows) == rej["metrics"]["kept"]
    # the last stage learned the verified samples: they are likelier under its model than before
    assert completion_nll(sft["model"], rows) < completion_nll(rl["model"], rows)


def completion_nll(model_dir: str, rows: list[dict]) -> float:
    """Mean negative log-likelihood of the rows' completion tokens given their prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total = count = 0.0
    with torch.no_grad():
        for r in rows:
            prompt = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + tok(r["completion"], add_special_tokens=False)["input_ids"]])
            labels = ids.clone()
            labels[0, : len(prompt)] = -100
            n = int((labels[0, 1:] != -100).sum())
            total += model(ids, labels=labels).loss.item() * n
            count += n
    return total / count


def test_shipped_r1_recipe_validates(capsys):
    assert main(["validate", str(ROOT / "recipes" / "r1.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid (8 stages" in out
    for kind in ("sft", "grpo", "rejection", "eval"):
        assert f" {kind} " in out
