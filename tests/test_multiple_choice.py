"""Multiple choice: the letter read from answers as models write them (hedges score 0), the seeded
shuffle recorded in summary.json, GPQA's hub schema from a local copy, the gated hub's message,
cons@k over letters, and the multiple_choice reward through a grpo stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1kit import pipeline

from r1kit.evaluation import choices
from r1kit.evaluation.benchmarks import load_benchmark
from r1kit.cli import main
from r1kit.errors import EvalError, RewardError
from r1kit.evaluation.evaluate import score_completions
from r1kit.recipe import load_recipe

DATA = Path(__file__).parent / "data"
GPQA = str(DATA / "gpqa_diamond.jsonl")
CHOICES = ["42 kJ", "17 kJ", "3.5 mol", "none of these"]


@pytest.mark.parametrize(
    "completion, letter",
    [
        ("<think>17 is too small.</think>\nAnswer: C", "C"),
        ("Working...\n**Answer:** (B)", "B"),
        ("So the answer is (C).", "C"),
        ("Final Answer: $\\boxed{B}$", "B"),
        ("\\boxed{\\text{(D)}}", "D"),
        ("<think>...</think><answer>B</answer>", "B"),
        ("Answer: 17 kJ", "B"),  # the choice's own text
        ("Answer: B. 17 kJ", "B"),
        ("C) 3.5 mol", "C"),
        ("(C)", "C"),
        ("answer: c", "C"),
        ("the correct option is D", "D"),
        ("So the answer is A, since 42 kJ is what the table gives.", "A"),
        ("Answer: Option B", "B"),
        ("The correct answer is option C.", "C"),
        ("Answer: Choice C", "C"),
        ("answer: The answer is (D)", "D"),
        ("Answer: C\n\nThe answer isn't A because 42 kJ is too much.", "C"),  # the Answer: line, not a later phrase
        ("Answer: C (A and B are ruled out)", "C"),  # letters in a justification are no hedge
        ("Answer: \\(B\\)", "B"),
        ("Answer: b) 17 kJ", "B"),
        # A letter of another order before a choice's exact text: the text says which was meant.
        ("The answer is A = 3.5 mol", "C"),
        ("Answer: B) 42 kJ", "A"),
        ("Answer: D - 17 kJ", "B"),
        # Hedges and non-answers score 0.
        ("Answer: A or B", None),
        ("It is either B or C.", None),
        ("\\boxed{A, C}", None),
        ("Answer: C, or maybe D", None),
        ("Answer: A/B", None),
        ("Answer: (A) and (B)", None),
        ("I think it is B", None),  # no final answer statement
        ("Answer: E", None),  # not one of the four
        ("<think>Answer: A</think> I am not sure.", None),  # only in the reasoning
        ("```python\nprint('C')\n```\n```output\nAnswer: C\n```", None),  # a tool's output is not the answer
        ("A catalyst lowers the activation energy.", None),  # prose that starts with a capital
        ("<answer>A catalyst is required</answer>", None),
        ("<think>Let me see. Perhaps the answer is B. Hmm, but wait", None),  # cut off inside the reasoning
        ("The answer is \\boxed{B} or \\boxed{C}", None),  # boxes naming two letters
    ],
)
def test_the_letter_is_read_from_the_final_answer(completion, letter):
    assert choices.answer_letter(completion, CHOICES) == letter


def test_a_prompt_that_opened_think_leaves_no_answer_until_it_closes():
    assert choices.answer_letter("The answer is B, probably", CHOICES, prefilled=True) is None
    assert choices.answer_letter("17 kJ fits.</think>\nAnswer: B", CHOICES, prefilled=True) == "B"
    ten = [str(n) for n in range(10)]
    assert choices.answer_letter("I think the answer must involve kinetics.", ten) is None


def test_gpqa_choices_are_shuffled_by_seed_and_the_prompt_letters_them():
    first = load_benchmark("gpqa_diamond", data_file=GPQA, choice_seed=0)
    again = load_benchmark("gpqa_diamond", data_file=GPQA, choice_seed=0)
    other = load_benchmark("gpqa_diamond", data_file=GPQA, choice_seed=1)
    rows = [json.loads(line) for line in open(GPQA)]
    assert first.domain == "choice" and [p.choices for p in first.problems] == [p.choices for p in again.problems]
    assert [p.choices for p in first.problems] != [p.choices for p in other.problems]
    assert len({p.answer for p in first.problems}) > 1  # the gold position is not fixed
    for p, row in zip(first.problems, rows):
        gold = "ABCD".index(p.answer)
        assert p.choices[gold] == row["Correct Answer"] and sorted(p.choices) == sorted([row["Correct Answer"], *(row[f"Incorrect Answer {i}"] for i in (1, 2, 3))])
        assert f"\n{p.answer}) {row['Correct Answer']}" in p.problem and p.problem.rstrip().endswith(f"D) {p.choices[3]}")
        assert "Answer: LETTER" in p.problem and row["Question"] in p.problem


def test_scoring_reads_letters_votes_and_records_the_seed(tmp_path):
    bench = load_benchmark("gpqa_diamond", data_file=GPQA, choice_seed=3, limit=2)
    a, b = bench.problems
    wrong = next(letter for letter in "ABCD" if letter != a.answer)
    rows = [
        *({"id": a.id, "completion": text} for text in (f"Answer: {a.answer}", f"Answer: {wrong}", f"Answer: {a.answer}", "Answer: A or B")),
        *({"id": b.id, "completion": text} for text in (f"Answer: {b.choices['ABCD'.index(b.answer)]}", "no idea", "no idea", "no idea")),
    ]
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = score_completions(bench, gen, tmp_path / "eval")
    assert summary["domain"] == "choice" and summary["choice_seed"] == 3
    assert summary["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert summary["cons@4"] == pytest.approx(1.0)  # a: the right letter wins 2-1; b: its one answer wins
    assert summary["no_answer"] == pytest.approx(4 / 8)
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert [s["answer"] for s in samples[:4]] == [a.answer, wrong, a.answer, None]


def test_a_local_file_with_choices_and_bad_rows(tmp_path):
    good = tmp_path / "mc.jsonl"
    good.write_text(json.dumps({"id": "q1", "problem": "2+2?", "choices": ["3", "4", "5"], "answer": "4"}) + "\n")
    bench = load_benchmark(str(good))
    assert bench.domain == "choice" and bench.problems[0].choices[["A", "B", "C"].index(bench.problems[0].answer)] == "4"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "q1", "problem": "2+2?", "choices": ["3", "4"], "answer": "E"}) + "\n")
    with pytest.raises(EvalError, match=r"bad.jsonl: row 1: answer must be one of A, B, the text of one choice or its 0-based index"):
        load_benchmark(str(bad))
    with pytest.raises(EvalError, match="data_file is for built-in benchmarks"):
        load_benchmark(str(good), data_file=GPQA)


def test_gated_hub_access_is_one_line_that_says_how(monkeypatch):
    from r1kit import data

    class GatedRepoError(Exception):
        pass

    def refuse(*args, **kwargs):
        raise GatedRepoError("Access to dataset Idavidrein/gpqa is restricted. You must have access to it.")

    monkeypatch.setattr(data, "load_source", refuse)
    with pytest.raises(EvalError, match=r"Idavidrein/gpqa is gated: accept its terms at https://huggingface.co/datasets/Idavidrein/gpqa"):
        load_benchmark("gpqa_diamond")


@pytest.mark.network
def test_gpqa_diamond_loads_from_the_hub():
    bench = load_benchmark("gpqa_diamond")
    assert len(bench.problems) == 198 and bench.domain == "choice"


def test_multiple_choice_reward_scores_letters_and_skips_unanswerable_rows():
    from r1kit import reward_registry

    reward = reward_registry.build("multiple_choice", {})
    scores = reward(["Answer: B", "Answer: A or B", "Answer: 3.5 mol", "Answer: A"],
                    answer=["B", "B", "C", "nonsense"], choices=[CHOICES] * 4)
    assert scores == [1.0, 0.0, 1.0, None]
    assert reward(["Answer: C"], answer=[2], choices=[CHOICES]) == [1.0]  # a 0-based index, as MMLU's
    with pytest.raises(RewardError, match="column 'choices' must hold a list of choice texts per row"):
        reward(["Answer: C"], answer=["C"], choices=['["42 kJ", "17 kJ"]'])


def test_multiple_choice_reward_trains_in_a_grpo_stage(write_recipe, tiny_model, tmp_path):
    rows = [{"prompt": choices.prompt(f"Which is number {n}?", ["one", "two", "three", "four"]), "choices": ["one", "two", "three", "four"],
             "answer": "ABCD"[n - 1]} for n in (1, 2, 3, 4)] * 4
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = {"max_steps": 2, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 8, "logging_steps": 1}
    rl = {"name": "rl", "kind": "grpo", "template": "plain", "data": {"source": str(data)}, "rewards": [{"name": "multiple_choice"}], "trainer": trainer}
    path = write_recipe({"model": str(tiny_model), "stages": [rl]})
    pipeline.run(load_recipe(path))
    steps = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    scored = [m["rewards/multiple_choice/mean"] for m in steps if "rewards/multiple_choice/mean" in m]
    assert len(scored) == 2 and all(0.0 <= s <= 1.0 for s in scored)


def test_eval_cli_reads_a_gpqa_copy(tmp_path, capsys):
    gen = tmp_path / "gen.jsonl"
    bench = load_benchmark("gpqa_diamond", data_file=GPQA)
    gen.write_text("".join(json.dumps({"id": p.id, "completion": f"Answer: {p.answer}"}) + "\n" for p in bench.problems))
    assert main(["eval", "--benchmark", "gpqa_diamond", "--data-file", GPQA, "--completions", str(gen), "--output", str(tmp_path / "e")]) == 0
    assert "| gpqa_diamond | 6 | 1 | 100.0 | 100.0 |" in capsys.readouterr().out


def test_a_file_mixing_math_and_multiple_choice_rows(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"id": "m1", "problem": "1+1?", "gold": "2"}) + "\n"
                     + json.dumps({"id": "c1", "problem": "Pick two.", "choices": ["1", "2"], "gold": "2"}) + "\n")
    bench = load_benchmark(str(mixed), answer_field="gold")
    math, choice = bench.problems
    assert bench.domain == "mixed" and (math.domain, math.answer) == ("math", "2")
    assert choice.domain == "choice" and choice.choices["AB".index(choice.answer)] == "2"
