"""Environments (r1kit.environments): the contract's checks, r1kit's turn loop with an
environment as its world (scripted model turns, so each assertion is about the loop, not a
model), the guard's bounds, routing, TRL's face of the same class, and eval end to end."""

from __future__ import annotations

import json
import threading
import time

import pytest

from r1kit.environments import from_recipe
from r1kit.environments.episodes import Episodes, trl_class, trl_reward
from r1kit.errors import RecipeError
from r1kit.offline.tiny import build_tokenizer
from r1kit.sampling import tool_loop


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def call(number) -> str:
    return f'<tool_call>{{"name": "guess", "arguments": {{"number": {json.dumps(number)}}}}}</tool_call><|im_end|>'


def play(tok, specs, rows, scripts, max_tokens=600):
    """r1kit's turn loop over `rows` with `scripts[r]` as rollout r's turns (the last one repeated)."""
    episodes = Episodes(specs, tok)
    prompts = episodes.start(rows, ["Find it."] * len(rows), "plain")
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    turns = [0] * len(rows)

    def step(turn_prompts, counts, budget, stop=None):
        out = []
        for p in turn_prompts:
            r = next(r for r, i in enumerate(ids) if p[: len(i)] == i and (len(ids) == 1 or p[len(i):] == transcripts_so_far[r]))
            text = scripts[r][min(turns[r], len(scripts[r]) - 1)]
            turns[r] += 1
            out.append(tok(text, add_special_tokens=False)["input_ids"][:budget])
        return out

    transcripts_so_far = [[] for _ in rows]  # each rollout's tokens so far, to tell the rollouts' prompts apart
    original_reply = episodes.reply

    def reply(turn):
        answers = original_reply(turn)
        for (t, _, _), a in zip(turn, answers):
            transcripts_so_far[t.index] = t.ids + (a or [])
        return answers

    episodes.reply = reply
    out = tool_loop.rollouts(step, ids, [1] * len(ids), max_tokens, episodes, tok, {tok.eos_token_id})
    return episodes, out, episodes.records([t.turns for t in out])


def guess(**bounds):
    return from_recipe({"name": "guess", **bounds}, "environment")


def test_a_multi_turn_episode_is_played_scored_and_masked(tok):
    eps, [t], [record] = play(tok, guess(), [{"secret": 5}], [[call(8), call(4), call(5), "done<|im_end|>"]])
    text = tok.decode(t.ids)
    assert text.count("<|im_start|>tool\n") == 3 and "lower" in text and "higher" in text and "correct" in text
    assert record == {"environment": "guess", "calls": {"guess": 3}, "tool_errors": 0, "failure": None, "reward": 1.0, "turns": 4}
    # the environment's tokens are masked out, the model's kept: exactly the tool turns' tokens are 0
    written = tok.decode([i for i, m in zip(t.ids, t.mask) if m == 0])
    assert "lower" in written and "guess" not in written
    kept = tok.decode([i for i, m in zip(t.ids, t.mask) if m == 1])
    assert kept.count("<tool_call>") == 3 and "lower" not in kept


def test_a_turn_without_a_call_ends_the_episode_unscored(tok):
    _, [t], [record] = play(tok, guess(), [{"secret": 5}], [["I give up<|im_end|>", call(5)]])
    assert t.turns == 1 and record["reward"] == 0.0 and record["calls"] == {}


def test_malformed_and_unknown_calls(tok):
    # a cut JSON is no call (the text stays the model's); an unknown tool is answered with the error
    _, [t], [record] = play(tok, guess(), [{"secret": 5}], [['<tool_call>{"name": "guess", "argu<|im_end|>']])
    assert t.turns == 1 and record["calls"] == {} and record["tool_errors"] == 0
    bad = '<tool_call>{"name": "peek", "arguments": {}}</tool_call><|im_end|>'
    _, [t], [record] = play(tok, guess(), [{"secret": 5}], [[bad, call(5), "ok<|im_end|>"]])
    assert record["tool_errors"] == 1 and "no tool named 'peek'" in tok.decode(t.ids) and record["reward"] == 1.0


def test_turn_and_token_bounds(tok):
    _, [t], [record] = play(tok, guess(max_turns=2), [{"secret": 5}], [[call(1), call(2), call(3), call(5)]])
    assert t.turns == 2 and record["calls"] == {"guess": 1} and record["reward"] == 0.0  # the last turn's call is not answered
    long_turn = "x" * 300 + call(5)
    _, [t], [record] = play(tok, guess(turn_tokens=10), [{"secret": 5}], [[long_turn]])
    assert sum(t.mask) == 10 and record["calls"] == {}
    _, [t], _ = play(tok, guess(), [{"secret": 5}], [[call(1)] * 20], max_tokens=60)
    assert len(t.ids) == 60  # the rollout's budget holds the environment's text too


class Flaky:
    """Raises in one tool, hangs in another."""

    def reset(self, **row):
        return None

    def boom(self, x: int) -> str:
        """Raise.

        Args:
            x: anything
        """
        raise ValueError("no such thing")

    def hang(self, x: int) -> str:
        """Hang.

        Args:
            x: anything
        """
        time.sleep(30)
        return "late"

    def get_reward(self) -> float:
        return 1.0


def flaky_call(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{"x": 1}}}}</tool_call><|im_end|>'


def test_a_raising_tool_answers_the_model_and_a_hanging_one_fails_the_rollout(tok):
    specs = from_recipe({"name": "tests.test_environments:Flaky", "timeout": 0.3}, "environment")
    _, [t], [record] = play(tok, specs, [{}], [[flaky_call("boom"), "fine<|im_end|>"]])
    assert "no such thing" in tok.decode(t.ids) and record["tool_errors"] == 1 and record["failure"] is None and record["reward"] == 1.0
    start = time.monotonic()
    _, [t], [record] = play(tok, specs, [{}], [[flaky_call("hang"), "never<|im_end|>"]])
    assert time.monotonic() - start < 5
    assert t.turns == 1 and record["failure"].startswith("timeout: hang") and record["reward"] == 0.0


class Slow:
    """A tool that takes a while, and the most calls of it in flight at once."""

    running = peak = 0

    def reset(self, n: int = 0, **row):
        return f" ({n})"  # the rollouts' prompts differ

    def wait(self, x: int) -> str:
        """Wait a little.

        Args:
            x: anything
        """
        cls = type(self)
        with LOCK:
            cls.running += 1
            cls.peak = max(cls.peak, cls.running)
        time.sleep(0.05)
        with LOCK:
            cls.running -= 1
        return "done"


LOCK = threading.Lock()


def test_a_turns_calls_run_together_unless_every_call_has_been_quick(tok, monkeypatch):
    from r1kit.environments import episodes

    slow = from_recipe({"name": "tests.test_environments:Slow"}, "environment")
    play(tok, slow, [{"n": k} for k in range(6)], [[flaky_call("wait"), "ok<|im_end|>"]] * 6)
    assert slow[0].cls.peak >= 2  # the six rollouts' calls overlapped (the class as the recipe loaded it)
    quick = guess()
    play(tok, quick, [{"secret": 3}], [[call(1), call(3), "ok<|im_end|>"]])  # its first turn on threads
    assert quick[0].slowest < episodes.QUICK
    monkeypatch.setattr(episodes, "_pool", lambda workers: pytest.fail("a quick environment's turn went to threads"))
    _, [t], [record] = play(tok, quick, [{"secret": 3}], [[call(1), call(3), "ok<|im_end|>"]])
    assert record["reward"] == 1.0 and record["calls"] == {"guess": 2} and t.turns == 3


class Other:
    """A second environment: rewards 0.5 whatever happens."""

    def reset(self, **row):
        return " (other)"

    def get_reward(self) -> float:
        return 0.5


def test_rows_are_routed_to_their_environment_and_rewarded_by_it(tok):
    specs = from_recipe([{"name": "guess", "key": "game"}, {"name": "tests.test_environments:Other", "key": "other"}], "environment")
    rows = [{"environment": "game", "secret": 3}, {"environment": "other"}, {"environment": "game", "secret": 9}]
    eps, out, records = play(tok, specs, rows, [[call(3), "ok<|im_end|>"], ["hi<|im_end|>"], [call(3), "ok<|im_end|>"]])
    assert [r["environment"] for r in records] == ["game", "other", "game"]  # figures go by the routing key
    assert [r["reward"] for r in records] == [1.0, 0.5, 0.0]
    assert "(other)" in tok.decode(eps.prompts[1]) and "Tools:" not in tok.decode(eps.prompts[1])
    # TRL's side routes the same way: each environment's reward function scores its own rollouts only
    faces = [trl_class(specs[0])(), trl_class(specs[1])()]
    faces[0].reset(secret=2), faces[1].reset()
    faces[0].guess(number=2)
    figures = {}
    assert trl_reward(specs[0], figures)(environments=faces, completions=[[], []]) == [1.0, None]
    assert trl_reward(specs[1], figures)(environments=faces, completions=[[], []]) == [None, 0.5]
    assert figures["env/reward/game"] == 1.0


def test_trls_face_has_the_same_tools_and_the_guard(tok):
    from transformers.utils import get_json_schema

    [spec] = guess()
    face = trl_class(spec)()
    assert get_json_schema(face.guess) == get_json_schema(spec.cls().guess)
    assert not hasattr(face, "get_reward")  # r1kit weighs it: TRL must not add its own at weight 1
    [flaky] = from_recipe({"name": "tests.test_environments:Flaky", "timeout": 0.2}, "environment")
    face = trl_class(flaky)()
    face.reset()
    assert "timeout" in face.hang(x=1) and face.guarded.episode.failure and face.guarded.reward() == 0.0


class NoReset:
    def guess(self, n: int) -> str:
        """x

        Args:
            n: y
        """


class Undocumented:
    def reset(self, **row):
        return None

    def act(self, n):
        return "?"


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown environment 'nope'"),
    ("tests.test_environments:NoReset", "has no reset method"),
    ("tests.test_environments:Undocumented", "tool Undocumented.act cannot be described"),
    ({"name": "guess", "max_turns": 0}, "max_turns must be above 0"),
    ({"name": "guess", "turn_tokens": 0}, "turn_tokens must be a number of tokens"),
    ({"name": "guess", "args": {"colour": 1}}, "does not take"),
    ([{"name": "guess"}, {"name": "guess"}], "two environments answer to 'guess'"),
])
def test_contract_refusals(spec, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(")):
        from_recipe(spec, "rl.environment")


def test_a_template_without_tool_calls_is_refused(tok):
    from r1kit.environments import template_problem

    plain = build_tokenizer()
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert "cannot render tool calls" in template_problem(guess(), plain)
    assert template_problem(guess(), tok) is None


def test_a_tokenizer_with_tool_vocab_spells_a_call_in_few_tokens_and_reads_it_back():
    """`tool_vocab`: <tool_call> is one token and the call's JSON has merges, so a call takes under
    a third of the tokens (17, not 61); the template renders the same text and parses the call
    back; without it the tokenizer is the one every other recipe uses, unchanged."""
    from transformers.utils import get_json_schema
    from trl.chat_template_utils import parse_response

    from r1kit.environments.guess import Guess

    tools = [get_json_schema(Guess.guess)]
    chat = [{"role": "user", "content": "Find it."},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "guess", "arguments": {"number": 4}}}]},
            {"role": "tool", "name": "guess", "content": "higher"}]
    plain, known = build_tokenizer(), build_tokenizer(vocab_size=512, tool_vocab=True)
    text = plain.apply_chat_template(chat, tools=tools, tokenize=False)
    assert known.apply_chat_template(chat, tools=tools, tokenize=False) == text
    short, long = len(known(text)["input_ids"]), len(plain(text)["input_ids"])
    assert short < 0.7 * long, (short, long)
    assert known.convert_tokens_to_ids("<tool_call>") != known.unk_token_id
    assert len(known("<tool_call>")["input_ids"]) == 1 and len(plain("<tool_call>")["input_ids"]) > 5
    ids = known(call(6))["input_ids"]
    assert 3 * len(ids) < len(plain(call(6))["input_ids"])
    assert known.decode(ids, skip_special_tokens=True) == call(6).replace("<|im_end|>", "")
    prompt = known.apply_chat_template(chat, tools=tools, add_generation_prompt=True)
    turn = parse_response(known, ids, prefix=prompt, tools=tools)
    assert turn["tool_calls"][0]["function"] == {"name": "guess", "arguments": {"number": 6}}
    assert "<tool_call>" not in plain.get_vocab() and len(plain) == 404


def test_validate_refuses_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    from r1kit.cli import main

    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model: tiny\noutput_dir: out\nstages:\n  - name: rl\n    kind: grpo\n    data: {source: x.jsonl}\n"
        "    template: plain\n    environment: {name: guess, timeout: -1}\n")

    def validate() -> tuple[int, str]:
        try:
            code = main(["validate", str(recipe)])
        except SystemExit as exit:
            code = exit.code
        return code, capsys.readouterr().err

    code, err = validate()
    assert code == 2 and not (tmp_path / "out").exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "rl.environment.timeout must be above 0" in lines[0]
    recipe.write_text(recipe.read_text().replace("{name: guess, timeout: -1}", "guess").replace("template: plain", "template: r1_zero"))
    code, err = validate()
    assert code == 2 and "rl.template: r1_zero continues plain text" in err


def test_eval_plays_episodes_and_a_rerun_resumes(tiny_model, tmp_path):
    from r1kit.evaluation.benchmarks import load_benchmark
    from r1kit.evaluation.evaluate import Settings, evaluate

    bench_file = tmp_path / "guess.jsonl"
    bench_file.write_text("".join(json.dumps({"id": str(i), "problem": "Find it.", "secret": i}) + "\n" for i in (3, 7)))
    bench = load_benchmark(str(bench_file), environment=True)
    settings = Settings(samples=2, max_tokens=32, template="plain", environment={"name": "guess", "max_turns": 2})
    summary = evaluate(bench, tmp_path / "ev", settings, model=str(tiny_model), backend="transformers")
    assert summary["domain"] == "environment" and summary["problems"] == 2 and "env/turns_per_rollout" in summary
    rows = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["episode"]["environment"] == "guess" and r["correct"] == (r["reward"] >= 1) for r in rows)
    calls = []
    again = evaluate(bench, tmp_path / "ev", settings, model=str(tiny_model), backend="transformers", sampler=lambda: calls.append(1))
    assert again["pass@1"] == summary["pass@1"] and calls == []  # every episode journaled: nothing played twice


def test_a_gym_style_environment_skyrl_gym_multi_turn_gsm8k(tok):
    """skyrl-gym's multi-turn GSM8K through `step`: a wrong answer is answered with the next
    instruction as a user turn, the right one ends the episode; the reward is the steps' sum."""
    specs = from_recipe({"name": "skyrl_gym", "args": {"env_id": "gsm8k_multi_turn", "extras": {"max_turns": 3}}}, "environment")
    eps, [t], [record] = play(tok, specs, [{"answer": "7"}], [["I think #### 5<|im_end|>", "So #### 7<|im_end|>", "more<|im_end|>"]])
    text = tok.decode(t.ids)
    assert t.turns == 2 and "<|im_start|>user\nPlease provide your step-by-step reasoning" in text
    assert record["reward"] == pytest.approx(1.0 + 0.2 / 3) and record["failure"] is None  # one formatted miss, then right
    assert [m["role"] for m in eps.conversations[0]] == ["user", "assistant", "user", "assistant"]
    written = tok.decode([i for i, m in zip(t.ids, t.mask) if m == 0])
    assert "step-by-step" in written and "#### 5" not in written and "#### 7" not in written


def test_guess_games_and_their_cold_start_turns():
    from r1kit.environments.guess import Guess
    from r1kit.offline.tasks import guess as games

    episodes = games(50)
    assert {r["prompt"] for r in episodes} == {"Find the secret number from 1 to 8."} and {r["secret"] for r in episodes} <= set(range(1, 9))
    assert games(50) == episodes and games(50, seed=1) != episodes
    turns = games(400, demos=True)
    schema = json.loads(turns[0]["tools"])[0]
    assert schema["function"]["name"] == "guess"
    for row in turns:  # each turn follows the conversation so far; the game's replies are the environment's own
        env = Guess()
        calls = [m["tool_calls"][0]["function"]["arguments"]["number"] for m in row["prompt"] if m.get("tool_calls")]
        replies = [m["content"] for m in row["prompt"] if m["role"] == "tool"]
        assert len(calls) == len(replies) and "correct" not in replies[:-1]
        done = replies[-1:] == ["correct"]
        assert (row["completion"][0].get("tool_calls") is None) == done
        secret = next(s for s in range(1, 9) if (env.reset(secret=s), [env.guess(c) for c in calls])[1] == replies)
        if not done:
            number = row["completion"][0]["tool_calls"][0]["function"]["arguments"]["number"]
            assert number == len(calls) + 1 and secret is not None  # counting up from 1, whatever the replies
    halving = games(400, demos=True, informed=1.0)
    for row in halving:  # every guess the middle of what the replies allow; every game won
        calls = [m["tool_calls"][0]["function"]["arguments"]["number"] for m in row["prompt"] if m.get("tool_calls")]
        replies = [m["content"] for m in row["prompt"] if m["role"] == "tool"]
        low = max([c + 1 for c, r in zip(calls, replies) if r == "higher"], default=1)
        top = min([c - 1 for c, r in zip(calls, replies) if r == "lower"], default=8)
        if row["completion"][0].get("tool_calls"):
            assert row["completion"][0]["tool_calls"][0]["function"]["arguments"]["number"] == (low + top) // 2 and len(calls) < 4
    won, played = sum(not r["completion"][0].get("tool_calls") for r in halving), sum(len(r["prompt"]) == 1 for r in halving)
    assert played - won <= 1  # the last game may be cut short by the 400 rows


def won_games(turns: list[dict]) -> list[dict]:
    """Whole games as conversations (``messages``, ``tools``) from the cold-start turns of
    `task:guess`: each game's closing turn, after its conversation so far."""
    return [{"messages": t["prompt"] + t["completion"], "tools": t["tools"]} for t in turns if not t["completion"][0].get("tool_calls")]


def test_sft_on_a_games_conversations_trains_the_models_turns_only(tiny_model, tmp_path):
    """The tiny model's chat template marks the model's turns, so TRL's assistant-only loss (on
    by default in an sft stage whose conversations hold an environment's turns, not in others) leaves the
    question and the game's replies out of the labels the trainer uses, and keeps each call and
    its end-of-turn token."""
    import datasets
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from r1kit.offline.tasks import guess as games
    from r1kit.stages.sft import from_an_environment, marks_problem

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = won_games(games(40, demos=True, informed=1.0))[:4]
    assert from_an_environment(datasets.Dataset.from_list(rows), "messages") and marks_problem(tok) is None
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}, {"role": "assistant", "content": "b"}]
    assert not from_an_environment(datasets.Dataset.from_list([{"messages": chat}]), "messages")  # a chat of several turns is not
    assert from_an_environment(datasets.Dataset.from_list([{"messages": chat, "episode": {"turns": 2}}]), "messages")  # kept from episodes
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, assistant_only_loss=True, max_steps=1, report_to="none")
    trainer = SFTTrainer(model=str(tiny_model), args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=tok)
    for row, tokenized in zip(rows, trainer.train_dataset):
        trained = tok.decode([i for i, label in zip(tokenized["input_ids"], tokenized["labels"]) if label != -100])
        calls = sum(1 for m in row["messages"] if m.get("tool_calls"))
        assert trained.count("<tool_call>") == calls and trained.count("<|im_end|>") == calls + 1 and trained.endswith("<|im_end|>")
        assert "Found it" in trained and "higher" not in trained and "lower" not in trained and "correct" not in trained
        assert "Find the secret" not in trained and "Tools:" not in trained


def test_the_silent_guess_game_answers_at_random_whatever_the_secret():
    """feedback: false, the demo's control: the same words, no information about the secret."""
    from r1kit.environments.guess import Guess

    for secret in (1, 8):
        env = Guess(seed=0, feedback=False, max_guesses=100)
        env.reset(secret=secret)
        replies = [env.guess(4) for _ in range(60)]
        assert set(replies) == {"higher", "lower"} and 15 < replies.count("higher") < 45
        assert env.guess(secret) == "correct" and env.get_reward() == 1.0
    told = Guess(feedback=True)
    told.reset(secret=8)
    assert told.guess(4) == "higher"
