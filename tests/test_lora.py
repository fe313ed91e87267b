"""LoRA in the sft and grpo stages on the tiny model: a LoRA grpo stage raises its reward while
only adapter weights change; the merged model computes what base + adapter compute; a killed
LoRA stage resumes from its adapter checkpoint to the same adapter; a LoRA sft stage hands its
merged model to a grpo stage (a fresh adapter) and an eval stage; bad peft: and quantization:
blocks are refused, and QLoRA on a machine without CUDA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import r1kit.hardware
import r1kit.trainers.lora
from r1kit import pipeline
from r1kit.cli import main
from r1kit.errors import RecipeError
from r1kit.recipe import load_recipe
from r1kit.report import write_report

ROOT = Path(__file__).resolve().parents[1]
LORA = {"r": 8, "lora_alpha": 16}


def sft(name="sft", **extra) -> dict:
    trainer = {"max_steps": 20, "per_device_train_batch_size": 8, "learning_rate": 1.0e-2, "logging_steps": 5, "save_steps": 10}
    return {
        "name": name,
        "kind": "sft",
        "format": "prompt_completion",
        "data": {"source": "task:addition", "task": {"n": 200, "digits": 2}},
        "peft": LORA,
        "trainer": trainer | extra.pop("trainer", {}),
        **extra,
    }


def grpo(name="rl", **extra) -> dict:
    trainer = {"max_steps": 2, "per_device_train_batch_size": 16, "num_generations": 8, "max_completion_length": 32, "learning_rate": 5.0e-3}
    return {
        "name": name,
        "kind": "grpo",
        "template": "plain",
        "data": {"source": "task:addition", "task": {"n": 16, "digits": 1}},
        "rewards": [{"name": "math_accuracy"}],
        "peft": LORA,
        "trainer": trainer | extra.pop("trainer", {}),
        **extra,
    }


def load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)


def test_a_lora_grpo_stage_raises_its_reward_and_trains_only_the_adapter(write_recipe, cold_start, tmp_path, monkeypatch):
    trained = {}
    save = r1kit.trainers.lora.save_merged

    def keep(trainer, ctx, tokenizer=None):  # what training left in the model, before anything is merged
        trained.update({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
        return save(trainer, ctx, tokenizer)

    monkeypatch.setattr(r1kit.trainers.lora, "save_merged", keep)
    # As the full-weight test in test_grpo.py, at a LoRA learning rate (6x the full one): the rise
    # is about +0.11 here against step-to-step noise of about 0.02 on a 15-step mean.
    stage = grpo(
        data={"source": "task:addition", "task": {"n": 16, "digits": 1}},
        trainer={"max_steps": 60, "per_device_train_batch_size": 128, "num_generations": 16, "loss_type": "dapo", "beta": 0.0,
                 "logging_steps": 1, "learning_rate": 3.0e-3},
    )
    recipe = load_recipe(write_recipe({"model": str(cold_start), "stages": [stage]}))
    records = pipeline.run(recipe)
    record = records["rl"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    acc = [r["rewards/math_accuracy/mean"] for r in rows if "rewards/math_accuracy/mean" in r]
    assert len(acc) == 60
    first, last = sum(acc[:15]) / 15, sum(acc[-15:]) / 15
    assert last > first + 0.05, (first, last)

    start = load(cold_start).state_dict()
    lora = {k: v for k, v in trained.items() if "lora_" in k}
    base = {k: v for k, v in trained.items() if "lora_" not in k}
    assert lora and all("lora_B" not in k or v.abs().sum() > 0 for k, v in lora.items())  # B starts at 0: it moved
    for key, value in base.items():  # every base weight is the start model's, untouched
        name = key.removeprefix("base_model.model.").replace(".base_layer", "")
        torch.testing.assert_close(value, start[name], rtol=0, atol=0, msg=key)
    metrics = record["metrics"]
    assert metrics["trainable_params"] == sum(v.numel() for v in lora.values())
    assert metrics["total_params"] == sum(v.numel() for v in trained.values()) > metrics["trainable_params"]
    report = write_report(recipe, records).read_text()
    assert f"| rl | grpo | {metrics['trainable_params']:,} of {metrics['total_params']:,} |" in report


def test_the_merged_model_computes_base_plus_adapter(write_recipe, tiny_model, tmp_path):
    from peft import PeftModel

    record = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [sft()]})))["sft"]
    stage = tmp_path / "run" / "sft"
    assert record["model"] == str(stage / "model") and (stage / "adapter" / "adapter_config.json").is_file()
    assert json.loads((stage / "adapter" / "adapter_config.json").read_text())["target_modules"]  # all-linear, resolved
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 11]])
    with torch.no_grad():
        unmerged = PeftModel.from_pretrained(load(tiny_model), str(stage / "adapter"))(ids).logits
        merged = load(stage / "model")(ids).logits
        before = load(tiny_model)(ids).logits
    torch.testing.assert_close(merged, unmerged, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(merged, before, atol=1e-3)  # the adapter changed what the model computes
    assert not any("lora" in k for k in load(stage / "model").state_dict())  # a plain model folder


def test_a_killed_lora_stage_resumes_from_its_adapter_checkpoint(write_recipe, tiny_model, tmp_path, caplog, hold, wait_gone):
    killed = write_recipe({"model": str(tiny_model), "stages": [sft()], "output_dir": str(tmp_path / "killed")}, "k.yaml")
    clean = write_recipe({"model": str(tiny_model), "stages": [sft()], "output_dir": str(tmp_path / "clean")}, "c.yaml")
    env = hold.env(step=10, output_dir=tmp_path / "killed" / "sft" / "checkpoints")
    proc = subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(killed)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = hold.wait(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_gone(pids)
    checkpoint = tmp_path / "killed" / "sft" / "checkpoints" / "checkpoint-10"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    assert not (tmp_path / "killed" / "sft" / "DONE.json").exists()

    caplog.set_level("INFO", logger="r1kit")
    assert main(["run", str(killed)]) == 0
    assert "sft: resuming from" in caplog.text and "checkpoint-10" in caplog.text
    assert main(["run", str(clean)]) == 0
    from safetensors.torch import load_file

    resumed = load_file(tmp_path / "killed" / "sft" / "adapter" / "adapter_model.safetensors")
    uninterrupted = load_file(tmp_path / "clean" / "sft" / "adapter" / "adapter_model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_a_lora_sft_stage_hands_its_merged_model_to_grpo_and_eval(write_recipe, tiny_model, tmp_path):
    evaluate = {"name": "eval", "kind": "eval", "benchmarks": ["task:addition"], "task": {"digits": 1, "n": 4},
                "samples": 2, "max_tokens": 16, "template": "plain", "backend": "transformers"}
    stages = [sft(trainer={"max_steps": 4}), grpo(), evaluate]
    records = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": stages})))
    run = tmp_path / "run"
    assert records["rl"]["input_model"] == records["sft"]["model"] == str(run / "sft" / "model")
    adapter = json.loads((run / "rl" / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(run / "sft" / "model")  # a fresh adapter on the merged model
    assert records["eval"]["input_model"] == records["rl"]["model"] == str(run / "rl" / "model")
    assert "addition/pass@1" in records["eval"]["metrics"]


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"peft": {"rank": 8}}, "sft.peft: 'rank' is not a field of peft.LoraConfig"),
        ({"peft": {"r": "eight"}}, "sft.peft.r: expected int, got 'eight'"),
        ({"peft": {"bias": "some"}}, "sft.peft.bias: 'some' is not allowed; choose one of 'none', 'all', 'lora_only'"),
        # LoraConfig's own check, with r1kit's default target_modules (all-linear)
        ({"peft": {"layers_to_transform": [0]}}, "sft.peft: `layers_to_transform` cannot be used when `target_modules` is a str."),
        ({"peft": None, "quantization": {"load_in_4bit": True}}, "sft.quantization: quantized weights are frozen; add a peft: block"),
        ({"quantization": {"load_in_4bits": True}}, "sft.quantization: 'load_in_4bits' is not a field of transformers.BitsAndBytesConfig (did you mean 'load_in_4bit'?)"),
        ({"quantization": {"bnb_4bit_quant_type": "nf4"}}, "sft.quantization: set load_in_4bit: true (QLoRA) or load_in_8bit: true"),
        ({"quantization": {"load_in_4bit": True, "bnb_4bit_compute_dtype": "bf16"}}, "sft.quantization: "),  # a dtype torch lacks
    ],
)
def test_bad_peft_and_quantization_blocks_are_refused(write_recipe, tmp_path, capsys, change, expected):
    path = write_recipe({"model": "tiny", "stages": [{**sft(), **change}]})
    for argv in (["validate", str(path)], ["run", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_qlora_is_refused_on_a_machine_without_cuda(write_recipe, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(r1kit.hardware, "has_gpu", lambda: False)
    path = write_recipe({"model": "tiny", "stages": [grpo(quantization={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})]})
    assert main(["validate", str(path)]) == 0  # written for a GPU machine: validate notes it
    assert "note: not runnable on this machine" in capsys.readouterr().err
    for argv in (["validate", "--here", str(path)], ["run", str(path)]):
        assert main(argv) == 2
        assert "rl.quantization: 4- and 8-bit weights (bitsandbytes) need a CUDA GPU, and this machine has none" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_qlora_beside_trl_vllm_generation_is_refused(write_recipe, tmp_path, capsys, mode):
    """TRL 1.16 merges the adapter into the 4-bit base and sends vLLM dequantized weights its loader
    refuses (TRL issue 4973): refused when the recipe is read, on any machine."""
    path = write_recipe({"model": "tiny", "stages": [grpo(quantization={"load_in_4bit": True},
                                                          trainer={"max_steps": 1, "use_vllm": True, "vllm_mode": mode})]})
    for argv in (["validate", str(path)], ["run", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "rl.quantization: not with trainer.use_vllm: TRL merges the adapter into the 4-bit base" in err
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_lora_recipe_validates_and_its_qlora_variant_as_its_header_says():
    """The shipped recipe's QLoRA line (generation without vLLM) validates; QLoRA beside its vLLM does not."""
    recipe = ROOT / "recipes/r1_zero_lora.yaml"
    assert "rl.quantization.load_in_4bit=true rl.trainer.use_vllm=false" in recipe.read_text()
    load_recipe(recipe, ["rl.quantization.load_in_4bit=true", "rl.trainer.use_vllm=false"])
    with pytest.raises(RecipeError, match=r"rl\.quantization: not with trainer\.use_vllm"):
        load_recipe(recipe, ["rl.quantization.load_in_4bit=true"])


def test_a_recipe_model_init_kwargs_keeps_lora_dtype_default(write_recipe):
    """r1kit's defaults and the recipe's trainer block merge key by key, inside mappings too: a
    recipe's ``model_init_kwargs: {revision: ...}`` keeps the LoRA base's ``dtype: auto``."""
    from r1kit.trainers.training import trainer_fields
    from r1kit.stages import grpo as grpo_stage

    rec = load_recipe(write_recipe({"model": "tiny", "stages": [grpo(trainer={"max_steps": 1, "model_init_kwargs": {"revision": "main"}})]}))
    st = rec.stages[0]
    fields, _ = trainer_fields(st, rec, grpo_stage.trainer_defaults(st))
    assert fields["model_init_kwargs"] == {"dtype": "auto", "revision": "main"}
    assert fields["max_steps"] == 1 and fields["beta"] == 0.001  # the recipe's over the paper's, top-level too
