"""What the first GPU run must pass and no CPU test can show, marked ``gpu`` (tests/conftest.py
skips them without CUDA). On a CUDA machine:

    pytest -m gpu tests/         # these, on one GPU, in a few minutes
    bash bench/gpu_smoke.sh      # every stage kind through the pipeline, its figures and checks

together the GPU check (docs/performance.md). Each test here, on the offline tiny model:

- a grpo stage on the GPU in bf16 mixed precision trains float32 master weights and moves them,
  with finite losses, on TRL's own paths (r1kit's CPU paths and patches say why they are off);
- r1kit's patches of TRL and transformers (r1kit.trainers.trl_patches) leave CUDA tensors to TRL's
  and SDPA's own kernels: same outputs as without them;
- r1kit's decoding loop (the transformers backend, GRPO rollouts) gives ``model.generate``'s greedy
  tokens on the GPU, and the vLLM backend (where vLLM imports) the transformers backend's;
- the reward model is loaded onto the GPU and scores there as on a CPU.

Not here: several GPUs (TRL's asynchronous trainer with its server on a second GPU; FSDP, ZeRO-3):
bench/gpu_smoke.py runs what the machine has.
"""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

from r1kit import pipeline
from r1kit.recipe import load_recipe

pytestmark = pytest.mark.gpu

PROMPTS = ["What is 3 + 4?", "What is 8 + 1?", "Compute 12 * 3 and then add 7 to it.", "Hi"]


def test_a_grpo_stage_in_bf16_on_the_gpu_moves_float32_master_weights(write_recipe, cold_start, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = {"max_steps": 4, "per_device_train_batch_size": 16, "num_generations": 8, "max_completion_length": 32,
               "learning_rate": 5.0e-4, "logging_steps": 1, "beta": 0.0, "bf16": True}
    stage = {"name": "rl", "kind": "grpo", "template": "plain", "data": {"source": "task:addition", "task": {"n": 16, "digits": 1}},
             "rewards": [{"name": "math_accuracy"}], "trainer": trainer}
    record = pipeline.run(load_recipe(write_recipe({"model": str(cold_start), "stages": [stage]})))["rl"]
    given = json.loads((tmp_path / "run" / "rl" / "trainer_config.json").read_text())
    assert given["bf16"] is True and given["use_cpu"] is False  # no CPU default on a GPU
    assert record["metrics"]["trained_dtype"] == "float32"
    paths = record["metrics"]["trainer_paths"]
    assert paths["r1kit_decoding_loop"] == paths["whole_vocab_log_probs"] == paths["short_attention_in_math"] == "off: not on a CPU"
    logged = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in logged if "loss" in m]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    start = AutoModelForCausalLM.from_pretrained(cold_start).state_dict()
    end = AutoModelForCausalLM.from_pretrained(record["model"]).state_dict()
    assert any(not torch.equal(start[k], end[k]) for k in start)


def test_r1kits_patches_leave_cuda_tensors_to_trls_and_sdpas_kernels(tiny_model, monkeypatch):
    import trl.trainer.utils as trl_utils
    from torch.nn.attention import _cur_sdpa_kernel_backends
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from r1kit.hardware import cpu
    from r1kit.trainers import trl_patches

    cuda = torch.device("cuda")
    assert set(trl_patches.taken(cuda).values()) == {"off: not on a CPU"}
    ours, kernels = [], []  # calls of r1kit's CPU log-probabilities; SDPA's allowed kernels at each call
    apply = cpu.WholeVocabLogProbs.apply
    monkeypatch.setattr(cpu.WholeVocabLogProbs, "apply", lambda *a: ours.append(a) or apply(*a))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: kernels.append(set(_cur_sdpa_kernel_backends())) or sdpa(*a, **kw))
    everything = set(_cur_sdpa_kernel_backends())
    model = AutoModelForCausalLM.from_pretrained(tiny_model).to(cuda)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 20), device=cuda)  # 20 positions: the math kernel's length on a CPU
    labels = ids.clone()
    labels[:, :12] = -100
    outside = model(input_ids=ids, labels=labels, fused_lm_head=True)
    triton = trl_utils._use_triton(cuda)
    with trl_patches.log_probs_on_cpu(), trl_patches.short_attention_in_math(model):
        assert trl_utils._use_triton(cuda) == triton
        inside = model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert ours == [] and kernels and all(k == everything for k in kernels)
    torch.testing.assert_close(inside.log_probs, outside.log_probs)


def test_the_decoding_loop_gives_generates_greedy_tokens_on_the_gpu(cold_start):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from r1kit.sampling.decode import decode
    from r1kit.sampling.draws import greedy

    tokenizer = AutoTokenizer.from_pretrained(cold_start, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(cold_start, dtype=torch.float32).to("cuda").eval()
    eos = tokenizer.pad_token_id
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
    out = model.generate(**enc, max_new_tokens=48, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    expected = [row[: row.index(eos) + 1] if eos in row else row for row in out[:, enc["input_ids"].shape[1]:].tolist()]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert decode(model, ids, [2, 1, 1, 1], 48, greedy, {eos}, eos) == [expected[0]] * 2 + expected[1:]


def test_vllms_greedy_samples_equal_the_transformers_backends(cold_start):
    pytest.importorskip("vllm")
    from r1kit.sampling import SamplingParams, load_sampler

    def samples(sampler) -> list[list[tuple]]:
        out = sampler.generate_full(PROMPTS, n=2, params=SamplingParams(temperature=0.0, max_tokens=48))
        return [[(c.text, c.tokens, c.truncated) for c in row] for row in out]

    hf = load_sampler(str(cold_start), backend="transformers")
    assert hf.model.device.type == "cuda"
    expected = samples(hf)
    vllm = load_sampler(str(cold_start), backend="vllm", dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
    assert samples(vllm) == expected


def test_the_reward_model_scores_on_the_gpu_as_on_a_cpu(tiny_model, tmp_path, monkeypatch):
    from r1kit.offline.tiny import build_tiny_reward_model
    from r1kit.rewards.reward_model import load, reward_model

    rm = str(build_tiny_reward_model(tiny_model, tmp_path / "rm"))
    score = functools.partial(reward_model, ["It is 42.", "<think> 40 + 2 </think> 41"], model=rm, prompt=["What is 40 + 2?"] * 2)
    load.cache_clear()
    on_gpu = score()
    assert load(rm)[1].device.type == "cuda"
    load.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    on_cpu = score()
    assert load(rm)[1].device.type == "cpu"
    load.cache_clear()
    assert on_gpu == pytest.approx(on_cpu, abs=1e-3) and on_gpu[0] != on_gpu[1]
