"""Training stages keep float32 master weights, whatever precision the start model is stored in
(as TRL does for a model it loads itself); mixed precision comes from the trainer's bf16 flag.

In bfloat16 weights an AdamW step of 1e-6 (R1's learning rates are 1e-6 to 3e-6) is below half a
unit in the last place of almost every weight and rounds away: training stalls without an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from r1kit import pipeline
from r1kit.recipe import load_recipe


@pytest.fixture(scope="module")
def bf16_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model as hub checkpoints usually are: bfloat16 weights on disk."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16") / "model"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return out


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(folder / "model.safetensors").items() if ".layers." in k}


def length(completions, **columns):
    """A reward that differs within every group, so each GRPO step has a gradient."""
    return [float(len(c)) for c in completions]


def _run(write_recipe, model: Path, kind: str, trainer: dict) -> dict:
    task = {"source": "task:addition", "task": {"n": 32, "digits": 1}}
    common = {"max_steps": 3, "per_device_train_batch_size": 8, "learning_rate": 1.0e-6, "save_strategy": "no", **trainer}
    if kind == "sft":
        stage = {"name": "s", "kind": "sft", "format": "prompt_completion", "data": task, "trainer": common}
    else:
        stage = {"name": "s", "kind": "grpo", "template": "plain", "data": task, "rewards": [{"name": "test_precision:length"}],
                 "trainer": {**common, "num_generations": 4, "max_completion_length": 8, "temperature": 1.0}}
    return pipeline.run(load_recipe(write_recipe({"model": str(model), "stages": [stage]})))["s"]


@pytest.mark.parametrize("kind", ["sft", "grpo"])
def test_bf16_checkpoint_trains_float32_master_weights(write_recipe, bf16_model, kind):
    record = _run(write_recipe, bf16_model, kind, {})
    assert record["metrics"]["trained_dtype"] == "float32"
    before, after = _weights(bf16_model), _weights(Path(record["model"]))
    changed = sum(int((after[k] != before[k]).sum()) for k in before) / sum(v.numel() for v in before.values())
    assert changed > 0.9, f"only {changed:.1%} of the layer weights moved"


def test_model_init_kwargs_dtype_is_honoured(write_recipe, bf16_model):
    """The recipe can still ask for bf16 weights (TRL's model_init_kwargs); then a 1e-6 step
    rounds away on almost every weight: the stall the float32 default prevents."""
    record = _run(write_recipe, bf16_model, "sft", {"model_init_kwargs": {"dtype": "bfloat16"}})
    assert record["metrics"]["trained_dtype"] == "bfloat16"
    before, after = _weights(bf16_model), _weights(Path(record["model"]))
    changed = sum(int((after[k] != before[k]).sum()) for k in before) / sum(v.numel() for v in before.values())
    assert changed < 0.1
    assert json.loads((Path(record["model"]) / "config.json").read_text())["dtype"] == "bfloat16"
