"""R1-Zero on a CPU: the reflection metric, the base model's corpus (it never shows the template, its
<think>/<answer> layout or a held-out problem), pretraining, and the report's RL trends."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from r1kit import reward_registry

from r1kit.offline import corpus
from r1kit.cli import main
from r1kit.errors import RewardError
from r1kit.recipe import load_recipe
from r1kit.report import rise_together, trend_table, write_report
from r1kit.offline.tasks import _is_test
from r1kit.templates import R1_ZERO

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text, share, count",
    [
        ("<think> 3*3=8 . Wait, 3*3=9 , 9+5=14 </think> <answer> 4 </answer>", 1.0, 1),
        ("7+6=13 . Let me check: 7+6=13 . Yes. It is 3.", 1.0, 1),
        ("That was a MISTAKE, and it is wrong; I verify again.", 1.0, 3),
        ("however you add it, but twice: retry, error, evaluate", 1.0, 5),
        ("The waiter brought butter on a checkered cloth, awaited and unchecked.", 0.0, 0),  # no whole word
        ("They await a rebut; recheck later.", 0.0, 0),  # nor a word that ends in one
        ("It is 4.", 0.0, 0),
        ("wait-listed? no: checks, verifying, errors", 0.0, 0),  # other word forms are other words
        ("<think> ```python\nprint(1/0)\n```\n```output\nZeroDivisionError: division by zero\n``` </think> 1", 0.0, 0),  # the tool's words
    ],
)
def test_reflection_counts_the_r1_papers_words_as_whole_words(text, share, count):
    shares = reward_registry.build("reflection", {})([text])
    counts = reward_registry.build("reflection", {"count": True})([text])
    assert (shares, counts) == ([share], [float(count)])


def test_reflection_phrases_are_configurable_and_checked():
    mine = reward_registry.build("reflection", {"phrases": ["let me check", "hmm"], "count": True})
    assert mine(["Let me\n  check. Hmm, hmm.", "let me see; check", "wait"]) == [3.0, 0.0, 0.0]
    with pytest.raises(RewardError, match="reflection: phrases must be a non-empty list"):
        reward_registry.build("reflection", {"phrases": []})(["x"])
    with pytest.raises(RewardError, match="parameter 'phrases' must be list"):
        reward_registry.build("reflection", {"phrases": "wait"})


SUM = r"\(\(\d \+ \d\) \+ \d\) \+ \d"  # a corpus puzzle as written: ((3 + 4) + 8) + 9


def test_the_corpus_never_shows_the_template_its_layout_or_a_held_out_problem():
    docs = corpus.documents(20_000, seed=3)
    text = "\n".join(docs)
    for sentence in re.split(r"(?<=[.,])\s+", R1_ZERO.replace("{prompt}", "")):
        if len(sentence) > 12:
            assert sentence not in text, sentence  # no line of the template's preamble
    assert "User:" not in text and "Assistant:" not in text and "A conversation between" not in text
    assert "<think>" not in text and "</think>" not in text  # never the template's layout
    sums = [re.findall(SUM, d) for d in docs]
    assert all(sums)
    keys = {"".join(re.findall(r"[\d+]", e)) for doc in sums for e in doc}
    assert not any(_is_test(k) for k in keys)  # training problems only
    assert len(keys) > 1000


def test_the_corpus_mixes_documents_as_documented_and_reflection_only_where_it_belongs():
    docs = corpus.documents(20_000, seed=0)
    assert docs == corpus.documents(20_000, seed=0) and docs != corpus.documents(20_000, seed=1)
    n = len(docs)
    found = reward_registry.build("reflection", {})(docs)
    worked = [bool(re.search(r"\d\+\d=\d", d)) for d in docs]
    asked = [bool(re.search(r"(What is the|Find the|^The|: The) last digit of " + SUM + r"[?.] ", d)) for d in docs]
    share = {k: sum(v) / n for k, v in {"found": found, "worked": worked, "asked": asked}.items()}
    mix = corpus.MIX
    assert share["found"] == pytest.approx(mix["checked"] + mix["corrected"] + mix["rechecked"], abs=0.01)
    assert share["worked"] == pytest.approx(sum(mix[k] for k in corpus.EXERCISES) + mix["rechecked"], abs=0.01)
    assert share["asked"] == pytest.approx(1 - sum(mix[k] for k in corpus.EXERCISES), abs=0.01)
    assert all(w for w, f in zip(worked, found) if f)  # reflection only beside a working
    # Asked a question, a writer works the sum out only to check a quick answer.
    questions_worked = [d for d, w, a in zip(docs, worked, asked) if w and a]
    assert questions_worked and all(re.search(r"is \d\. Wait, (let me )?(check|verify) " + SUM + " : ", d) for d in questions_worked)
    assert len(questions_worked) / sum(asked) < 0.1
    said = [re.findall(r"(The last digit of " + SUM + r" is|The last digit is|It is|Answer:) \d\.", d) for d, w in zip(docs, worked) if not w]
    dominant = sum(s[-1].startswith("The last digit of") for s in said if s) / sum(1 for s in said if s)
    assert dominant == pytest.approx(5 / 8, abs=0.015)  # one phrasing dominates, as documented


def test_a_rechecked_answer_restates_the_sum_works_it_out_and_ends_on_the_right_answer():
    rng = random.Random(0)
    wrong_guesses = 0
    for _ in range(300):
        doc = corpus.document("rechecked", rng)
        asked, guessed, checked = re.findall(SUM, doc)
        assert asked == guessed == checked, doc
        terms = [int(t) for t in re.findall(r"\d", asked)]
        steps = re.findall(r"(\d)\+(\d)=(\d+)", doc)
        assert [int(s[0]) for s in steps] == [terms[0]] + [int(s[2]) % 10 for s in steps[:-1]], doc
        assert [int(s[1]) for s in steps] == terms[1:] and all(int(a) + int(b) == int(r) for a, b, r in steps), doc
        guess = int(re.search(r"is (\d)\. Wait", doc).group(1))
        final = int(re.findall(r"\d", doc)[-1])
        assert final == sum(terms) % 10, doc
        wrong_guesses += guess != final
    assert 0.8 < wrong_guesses / 300 < 0.97  # the quick answer is a guess, the check corrects it


def test_a_corrected_exercise_fixes_the_wrong_step_and_keeps_the_right_answer():
    rng = random.Random(0)
    for _ in range(200):
        doc = corpus.document("corrected", rng)
        steps = re.findall(r"(\d)([+*])(\d)=(\d+)", doc)
        wrong = [s for s in steps if int(s[3]) != (int(s[0]) + int(s[2]) if s[1] == "+" else int(s[0]) * int(s[2]))]
        assert len(wrong) == 1, doc  # one wrong step, then its correction
        assert re.search(r"(Wait|mistake)", doc)
        terms = [int(t) for t in re.findall(r"\d", re.search(SUM, doc).group())]
        assert int(re.findall(r"\d", doc)[-1]) == sum(terms) % 10, doc
    with pytest.raises(ValueError, match="unknown document kind 'noted'; kinds: worked, checked"):
        corpus.document("noted", rng)


def test_pretraining_lowers_the_loss_and_is_recorded_in_the_build(tmp_path):
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from r1kit.offline.tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer(extra=corpus.documents(200))
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    losses = corpus.pretrain(Qwen2ForCausalLM(config), tokenizer, steps=60, batch_size=16)
    assert losses[-1] < 0.6 * losses[0]
    plain = build_tiny_model(tmp_path / "plain")
    based = build_tiny_model(tmp_path / "base", pretrain_steps=2, pretrain_batch_size=4)
    # The base model's tokenizer also learned the corpus; the plain one is the tiny model's as ever.
    doc = corpus.documents(1)[0]
    assert len(AutoTokenizer.from_pretrained(based)(doc)["input_ids"]) < len(AutoTokenizer.from_pretrained(plain)(doc)["input_ids"])


def _records(acc, length, reflection=None):
    rows = []
    for i, (a, n) in enumerate(zip(acc, length)):
        row = {"step": i + 1, "reward": a, "rewards/math_accuracy/mean": a, "rewards/format/mean": 0.8, "completions/mean_length": n, "completions/max_length": 2 * n}
        if reflection is not None:
            row["rewards/reflection/mean"] = reflection[i]
        rows.append(row)
    return rows


def test_rise_together_marks_where_accuracy_and_length_have_both_made_half_their_rise():
    flat, up = [0.1] * 10, [0.1] * 10
    acc = flat + [0.6] * 10                      # accuracy jumps at step 11
    length = [10.0] * 14 + [30.0] * 6            # length only at step 15
    assert rise_together(_records(acc, length)) == 17  # smoothed over 5 steps, both past half way
    assert rise_together(_records(acc, [10.0] * 20)) is None   # length did not rise
    assert rise_together(_records(flat + up, [10.0] * 10 + [30.0] * 10)) is None  # accuracy did not
    assert rise_together(_records([0.1, 0.9], [5.0, 50.0])) is None  # too few steps to tell


def test_the_report_shows_what_rl_changed(tmp_path, write_recipe, tiny_model):
    path = write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [
        {"name": "rl", "kind": "grpo", "template": "r1_zero", "data": {"source": "task:last_digit", "task": {"n": 20}},
         "rewards": [{"name": "math_accuracy"}, {"name": "format"}, {"name": "reflection", "weight": 0.0}]}]})
    recipe = load_recipe(path)
    (tmp_path / "run" / "rl").mkdir(parents=True)
    rows = _records([0.1] * 10 + [0.6] * 10, [10.0] * 10 + [30.0] * 10, [0.0] * 10 + [0.4] * 10)
    (tmp_path / "run" / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = trend_table(recipe, tmp_path / "run")
    assert "| rl | 0.100 → 0.600 | 10.0 → 30.0 | 0.000 → 0.400 | 0.200 → 0.200 | - | 13 |" in table
    report = write_report(recipe, {}).read_text()
    assert "## What RL changed" in report and table in report
    assert (tmp_path / "run" / "plots" / "rl.png").is_file()


def test_grpo_logs_the_reflection_share_each_step(write_recipe, tiny_model, tmp_path):
    path = write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [
        {"name": "rl", "kind": "grpo", "template": "r1_zero", "data": {"source": "task:last_digit", "task": {"n": 16}},
         "rewards": [{"name": "math_accuracy", "fallback": "last_number"}, {"name": "format", "weight": 0.5},
                     {"name": "reflection", "weight": 0.0}],
         "trainer": {"max_steps": 2, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16, "logging_steps": 1}}]})
    assert main(["run", str(path)]) == 0
    steps = [json.loads(x) for x in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s]
    assert len(steps) == 2 and all(0.0 <= s["rewards/reflection/mean"] <= 1.0 for s in steps)
    assert "## What RL changed" in (tmp_path / "run" / "report.md").read_text()


def test_the_r1_zero_cpu_recipe_validates_and_builds_its_base_by_pretraining(capsys):
    assert main(["validate", str(ROOT / "recipes" / "r1_zero_cpu.yaml")]) == 0
    recipe = load_recipe(ROOT / "recipes" / "r1_zero_cpu.yaml")
    assert recipe.tiny_model["pretrain_steps"] >= 1
    assert [s.kind for s in recipe.stages] == ["eval", "grpo", "eval"]  # no SFT
    rl = recipe.stages[1]
    assert {r["name"] for r in rl.rewards} == {"math_accuracy", "format", "reflection"}  # R1-Zero: accuracy and format only


def test_last_digit_sums_share_the_split_and_refuse_unknown_operations():
    from r1kit.errors import DataError
    from r1kit.offline.tasks import generate, last_digit

    sums = last_digit(n=200, ops="+", split="test")
    assert all("*" not in r["prompt"] for r in sums)
    assert all(_is_test("".join(re.findall(r"[\d+]", r["prompt"]))) for r in sums)
    assert {r["answer"] for r in sums} == {str(d) for d in range(10)}
    assert last_digit(n=50) == last_digit(n=50, ops="+*")  # the default is the demo's task, unchanged
    with pytest.raises(DataError, match=r"task:last_digit: ops must be '\+', '\*' or '\+\*', got '-'"):
        generate("last_digit", "train", {"ops": "-"})
