"""One environment class, three ways, one greedy transcript: r1kit's turn loop on its decoding
loop, TRL's GRPOTrainer on its environment_factory path with TRL's own generation, and (in
test_served, beside the vLLM server it starts) the endpoint backend against a served model."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1kit.environments import from_recipe
from r1kit.environments.episodes import Episodes, trl_factory, trl_reward
from r1kit.sampling.base import SamplingParams
from conftest import taught

QUESTION = "Find the secret number from 1 to 8."
SECRET = 2


def game(tokenizer) -> str:
    """The whole game the model is taught: guess 4 (lower), guess 2 (correct), say so."""
    from transformers.utils import get_json_schema

    from r1kit.environments.guess import Guess

    def call(n):
        return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "guess", "arguments": {"number": n}}}]}

    messages = [{"role": "user", "content": QUESTION}, call(4), {"role": "tool", "name": "guess", "content": "lower"},
                call(SECRET), {"role": "tool", "name": "guess", "content": "correct"}, {"role": "assistant", "content": "Found it."}]
    return tokenizer.apply_chat_template(messages, tools=[get_json_schema(Guess.guess)], tokenize=False)


@pytest.fixture(scope="module")
def model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model trained on `game`, so that a greedy rollout plays it turn after turn."""
    from transformers import AutoTokenizer

    return taught(tiny_model, [game(AutoTokenizer.from_pretrained(tiny_model))], tmp_path_factory.mktemp("player") / "model", steps=200)


def specs():
    return from_recipe({"name": "guess", "max_turns": 4}, "environment")


def play(sampler) -> tuple[str, dict]:
    """One greedy episode through r1kit's turn loop on `sampler`: the transcript and its record."""
    episodes = Episodes(specs(), sampler.tokenizer)
    prompts = episodes.start([{"secret": SECRET}], [QUESTION], "plain")
    (completion,), = sampler.generate_full(prompts, 1, SamplingParams(temperature=0.0, max_tokens=240), tools=episodes)
    return completion.text, episodes.records([completion.turns])[0]


@pytest.fixture(scope="module")
def here(model):
    from r1kit.sampling import load_sampler

    return play(load_sampler(str(model), "transformers"))


def test_r1kits_loop_plays_the_game_it_was_taught(here):
    text, record = here
    assert text.count("<tool_call>") == 2 and "lower" in text and "correct" in text and text.endswith("Found it.")
    assert record["reward"] == 1.0 and record["calls"] == {"guess": 2} and record["turns"] == 3


def test_trls_environment_loop_with_its_own_generation_writes_the_same_transcript(model, here, tmp_path):
    import datasets
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from r1kit.trainers import trl_overrides

    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    [spec] = specs()
    figures = {}
    rows = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": QUESTION}], "secret": SECRET}] * 2)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=240, report_to="none", max_tool_calling_iterations=3, beta=0.0, learning_rate=0.0,
                      generation_kwargs={"do_sample": False})  # TRL's own generation (r1kit's loop stands in for sampling only)
    trainer = trl_overrides.GRPOTrainer(model=str(model), reward_funcs=[trl_reward(spec, figures)], args=args, train_dataset=rows,
                                        processing_class=tok, environment_factory=trl_factory([spec]))
    assert trainer.paths["r1kit_decoding_loop"].startswith("off: generation_kwargs")
    seen = {}
    original = trainer._compute_loss
    trainer._compute_loss = lambda model, inputs: seen.update(inputs) or original(model, inputs)
    trainer.train()
    ids = seen["completion_ids"][0][seen["completion_mask"][0] == 1]
    assert tok.decode(ids, skip_special_tokens=True) == here[0]
    assert figures["env/reward/guess"] == 1.0 and figures["env/calls/guess"] == 2.0
