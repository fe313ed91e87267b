"""reasoning-gym's tasks in r1kit: the ``reasoning_gym`` reward agrees with reasoning-gym's own
scorer on five tasks (right, wrong, partly right and missing answers); ``reasoning_gym:NAME`` rows
are decided by their seed, bad settings are one-line errors; on the tiny model a grpo stage trains
on them, a rejection stage keeps rows the reward scored and an eval stage reports the
``reasoning_gym`` domain; ``r1kit eval --completions`` scores known answers exactly."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.utils import extract_answer  # noqa: E402

from r1kit import pipeline, reward_registry  # noqa: E402
from r1kit.cli import main  # noqa: E402
from r1kit.config import DataConfig  # noqa: E402
from r1kit.data import load_rows  # noqa: E402
from r1kit.environments import reasoning_gym as rg  # noqa: E402
from r1kit.errors import DataError  # noqa: E402
from r1kit.evaluation.benchmarks import benchmark_name, load_benchmark  # noqa: E402
from r1kit.recipe import load_recipe  # noqa: E402

EASY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
        "allow_parentheses": False, "allow_negation": False}
"""basic_arithmetic: a + b or a - b of one-digit numbers."""
TASKS = {"basic_arithmetic": EASY, "chain_sum": {}, "count_bits": {}, "spell_backward": {}, "gcd": {}}


def fresh(name: str, size: int, seed: int, config: dict):
    """reasoning-gym's own dataset, built here without r1kit."""
    return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)


def attempts(answer: str) -> list[str]:
    """Completions answering `answer` rightly, wrongly, partly and not at all."""
    return [
        f"<think>easy</think> <answer>{answer}</answer>",  # right
        f"<answer> {answer} </answer>",  # right, spaced
        f"<answer>{answer}</answer> no: <answer>{answer}0</answer>",  # the last block counts: wrong
        f"<answer>{answer}x</answer>",  # the answer and more: partial credit on these tasks
        f"<answer>{answer[:-1]}</answer>",  # cut short
        f"<answer>{answer[::-1]}!</answer>",
        f"the answer is {answer}",  # no answer block
        "",
    ]


# ---------------------------------------------------------------------------------------------
# The reward against reasoning-gym's scorer


@pytest.mark.parametrize("name", list(TASKS))
def test_the_reward_agrees_with_reasoning_gyms_own_scorer(name):
    size, seed = 12, 7
    rows = rg.rows(name, {"size": size, **TASKS[name]}, seed=seed)
    ds = fresh(name, size, seed, TASKS[name])
    assert [(r["prompt"], r["answer"]) for r in rows] == [(ds[i]["question"], ds[i]["answer"]) for i in range(size)]
    texts, metas, expected = [], [], []
    for i, row in enumerate(rows):
        for text in attempts(row["answer"]):
            texts.append(text)
            metas.append(row["reasoning_gym"])
            expected.append(ds.score_answer(extract_answer(text), ds[i]))
    reward = reward_registry.build("reasoning_gym")  # through the registry, as a recipe finds it
    got = reward(texts, reasoning_gym=metas, answer=[None] * len(texts))
    assert got == expected  # 100% agreement
    assert 1.0 in got and min(got) == 0.0 and any(0.0 < s < 1.0 for s in got)  # right, wrong and partial verdicts


def test_rows_of_another_source_are_unscorable_and_a_batch_without_the_column_is_refused():
    from r1kit.errors import RewardError
    from r1kit.rewards.reasoning_gym import reasoning_gym as reward

    row = rg.rows("gcd", {"size": 1}, seed=0)[0]
    assert reward([f"<answer>{row['answer']}</answer>"] * 2, reasoning_gym=[row["reasoning_gym"], None]) == [1.0, None]
    with pytest.raises(RewardError, match="needs the 'reasoning_gym' column"):
        reward(["<answer>1</answer>"], answer=["1"])


def test_a_mix_is_scored_by_the_task_each_row_came_from():
    mix = {"size": 12, "datasets": [{"name": "gcd", "weight": 1, "config": {}}, {"name": "spell_backward", "weight": 1, "config": {}}]}
    rows = rg.rows("composite", mix, seed=3)
    from reasoning_gym.composite import DatasetSpec

    ds = reasoning_gym.create_dataset("composite", size=12, seed=3, datasets=[DatasetSpec(d["name"], d["weight"], {}) for d in mix["datasets"]])
    assert {ds[i]["metadata"]["source_dataset"] for i in range(12)} == {"gcd", "spell_backward"}
    texts = [f"<answer>{r['answer'][:-1] or 'x'}</answer>" for r in rows]
    expected = [ds.score_answer(extract_answer(t), ds[i]) for i, t in enumerate(texts)]
    assert rg.score([extract_answer(t) for t in texts], [r["reasoning_gym"] for r in rows]) == expected


# ---------------------------------------------------------------------------------------------
# Rows and their errors


def test_rows_are_decided_by_the_seed_and_training_data_seeds_from_the_recipe():
    task = {"size": 30, **EASY}
    assert rg.rows("basic_arithmetic", task, seed=5) == rg.rows("basic_arithmetic", task, seed=5)
    assert [r["prompt"] for r in rg.rows("basic_arithmetic", task, seed=5)] != [r["prompt"] for r in rg.rows("basic_arithmetic", task, seed=6)]
    meta = json.loads(rg.rows("basic_arithmetic", task, seed=5)[3]["reasoning_gym"])
    assert meta == {"name": "basic_arithmetic", "config": {"size": 30, "seed": 5, **EASY}, "index": 3}

    ctx = SimpleNamespace(recipe=SimpleNamespace(seed=42))
    trained = load_rows(DataConfig(source="reasoning_gym:basic_arithmetic", task=task), ctx).to_list()
    assert trained == rg.rows("basic_arithmetic", task, seed=42)
    seeded = load_rows(DataConfig(source="reasoning_gym:basic_arithmetic", task={**task, "seed": 5}), ctx).to_list()
    assert seeded == rg.rows("basic_arithmetic", task, seed=5)
    # Benchmarks draw from seed 1 unless told: not the training data's problems.
    bench = load_benchmark("reasoning_gym:basic_arithmetic", task_args=task)
    assert [p.problem for p in bench.problems] == [r["prompt"] for r in rg.rows("basic_arithmetic", task, seed=1)]
    assert [p.problem for p in bench.problems] != [r["prompt"] for r in trained]
    assert bench.config["task_args"] == {"size": 30, "seed": 1, **EASY} and bench.name == benchmark_name("reasoning_gym:basic_arithmetic") == "basic_arithmetic"
    assert {p.domain for p in bench.problems} == {"reasoning_gym"} and bench.problems[0].row["reasoning_gym"] == rg.rows("basic_arithmetic", task, seed=1)[0]["reasoning_gym"]


@pytest.mark.parametrize(
    "name, task, expected",
    [
        ("basic_arithmetc", {}, "reasoning_gym:basic_arithmetc: unknown reasoning-gym task 'basic_arithmetc' (did you mean 'basic_arithmetic'?); tasks: "),
        ("basic_arithmetic", {"min_term": 2}, "reasoning_gym:basic_arithmetic: 'min_term' is no setting of reasoning-gym's basic_arithmetic "
                                               "(did you mean 'min_terms'?); it takes min_terms, "),
        ("gcd", {"min_value": -1}, "reasoning_gym:gcd: reasoning-gym refuses these settings: min_value must be positive"),
        ("gcd", {"size": 0}, "reasoning_gym:gcd: size must be a whole number of at least 1, got 0"),
        ("composite", {"datasets": [{"name": "gcd", "weight": 1, "config": {"top": 9}}]},
         "reasoning_gym:composite: datasets[0]: 'top' is no setting of reasoning-gym's gcd; it takes "),
    ],
)
def test_bad_settings_are_one_line_data_errors(name, task, expected):
    with pytest.raises(DataError) as exc:
        rg.rows(name, task, seed=0)
    assert str(exc.value).startswith(expected) and "\n" not in str(exc.value)


def test_without_reasoning_gym_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` fails
    with pytest.raises(DataError, match=r"pip install 'r1kit\[environments\]'$"):
        rg.rows("gcd", {}, seed=0)


def test_validate_refuses_an_unknown_task_of_an_eval_stage_in_one_line(write_recipe, tiny_model, capsys):
    stage = {"name": "eval", "kind": "eval", "benchmarks": ["reasoning_gym:chain_summ"], "template": "plain"}
    assert main(["validate", str(write_recipe({"model": str(tiny_model), "stages": [stage]}))]) == 2
    err = capsys.readouterr().err.strip()
    assert ": eval.benchmarks[0]: reasoning_gym:chain_summ: unknown reasoning-gym task 'chain_summ' (did you mean 'chain_sum'?)" in err
    assert err.startswith("r1kit: error: ") and "\n" not in err
    stage = {**stage, "benchmarks": ["reasoning_gym:chain_sum", "task:addition"], "task": {"chain_sum": {"terms": 3}, "addition": {}}}
    assert main(["validate", str(write_recipe({"model": str(tiny_model), "stages": [stage]}))]) == 2
    assert "eval.benchmarks[0]: reasoning_gym:chain_sum: 'terms' is no setting of reasoning-gym's chain_sum" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Stages on the tiny model, and scoring given completions


def test_grpo_rejection_and_eval_stages_run_on_reasoning_gym_tasks(write_recipe, tiny_model, tmp_path):
    data = {"source": "reasoning_gym:basic_arithmetic", "task": {"size": 8, **EASY}}
    rl = {"name": "rl", "kind": "grpo", "template": "plain", "data": data, "rewards": [{"name": "reasoning_gym"}],
          "trainer": {"max_steps": 1, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 16, "logging_steps": 1}}
    off = {k: False for k in ("truncated", "mixed_language", "code_in_cot", "repetition", "exact_duplicates", "near_duplicates")}
    rej = {"name": "rej", "kind": "rejection", "template": "plain", "data": {**data, "task": {**data["task"], "size": 4}},
           "rewards": [{"name": "reasoning_gym"}], "samples": 2, "min_total": 0.0, "max_kept_per_prompt": None, "filters": off,
           "backend": "transformers", "max_tokens": 16}
    ev = {"name": "eval", "kind": "eval", "benchmarks": ["reasoning_gym:basic_arithmetic"], "task": {"size": 4, **EASY},
          "samples": 2, "max_tokens": 16, "template": "plain", "backend": "transformers"}
    records = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [rl, rej, ev]})))
    run = tmp_path / "run"

    steps = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    scores = [m["rewards/reasoning_gym/mean"] for m in steps if "rewards/reasoning_gym/mean" in m]
    assert len(scores) == 1 and 0.0 <= scores[0] <= 1.0

    kept = [json.loads(line) for line in Path(records["rej"]["dataset"]).read_text().splitlines()]
    ds = fresh("basic_arithmetic", 4, 42, EASY)  # the recipe's seed, 42
    entries = {f"basic_arithmetic-{i}": ds[i] for i in range(4)}
    assert len(kept) == 4 * 2  # min_total 0 and no filters: every sample, each scored by the reward
    for r in kept:
        assert r["prompt"] == entries[r["id"]]["question"]
        assert r["rewards"] == {"reasoning_gym": ds.score_answer(extract_answer(r["completion"]), entries[r["id"]])}

    metrics = records["eval"]["metrics"]
    assert metrics["basic_arithmetic/domain"] == "reasoning_gym" and 0.0 <= metrics["basic_arithmetic/pass@1"] <= 1.0
    samples = [json.loads(line) for line in (run / "eval" / "basic_arithmetic" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(s["correct"] == (s["score"] == 1.0) for s in samples)


def test_given_completions_are_scored_exactly(tmp_path, capsys):
    ds = fresh("basic_arithmetic", 3, 1, EASY)  # the benchmark's seed, 1
    a = [ds[i]["answer"] for i in range(3)]
    completions = {
        0: [f"<answer>{a[0]}</answer>", f"<answer>{a[0]}</answer>", "<answer>99</answer>", "no answer"],  # 2 right
        1: [f"<answer>{a[1]}x</answer>", "<answer>99</answer>", "<answer>99</answer>", f"<answer>{a[1]}</answer>"],  # 1 right; 99 wins the vote
        2: ["<answer>98</answer>", "<answer>97</answer>", "", f"<answer>{a[2]}x</answer>"],  # none right, one partly
    }
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": f"basic_arithmetic-{i}", "completion": c}) + "\n" for i, cs in completions.items() for c in cs))
    args = [f"--task-arg={k}={json.dumps(v)}" for k, v in {"size": 3, **EASY}.items()]
    out = tmp_path / "scored"
    assert main(["eval", "--benchmark", "reasoning_gym:basic_arithmetic", *args, "--completions", str(gen), "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["domain"] == "reasoning_gym" and summary["task_args"] == {"size": 3, "seed": 1, **EASY}
    assert summary["problems"] == 3 and math.isclose(summary["pass@1"], (2 / 4 + 1 / 4 + 0) / 3)
    assert math.isclose(summary["cons@4"], 1 / 3) and math.isclose(summary["no_answer"], 2 / 12)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    expected = [(i, extract_answer(c), ds.score_answer(extract_answer(c), ds[i])) for i, cs in completions.items() for c in cs]
    assert [(int(r["id"].rsplit("-", 1)[1]), r["answer"], r["score"]) for r in rows] == expected
    assert [r["correct"] for r in rows] == [s == 1.0 for _, _, s in expected]
    assert 0.0 < rows[4]["score"] < 1.0 and rows[4]["correct"] is False  # partly right is not correct
    assert "| basic_arithmetic | 3 | 4 |" in capsys.readouterr().out


def test_the_chain_sum_cold_start_works_reasoning_gyms_problems_and_its_scorer_agrees():
    """task:chain_sum: reasoning-gym's chain_sum problems, each demonstration's steps the running
    sum and its answer the one reasoning-gym's scorer gives full marks; `direct` answers without
    working; the test split draws other problems."""
    from r1kit.offline.tasks import chain_sum

    rows = chain_sum(n=200, terms=4, seed=3, direct=0.4)
    assert [r["prompt"] for r in rows] == [str(e["question"]) for e in fresh("chain_sum", 200, 3, {"min_terms": 4, "max_terms": 4, "min_digits": 1, "max_digits": 1})]
    assert reward_registry.build("reasoning_gym")([r["completion"] for r in rows], reasoning_gym=[r["reasoning_gym"] for r in rows]) == [1.0] * 200
    worked = [r for r in rows if "<think> </think>" not in r["completion"]]
    assert 0.5 < len(worked) / len(rows) < 0.7
    for row in worked:
        steps = row["completion"].split("<think> ")[1].split(" </think>")[0].split(" , ")
        assert len(steps) == 3 and steps[-1].endswith(f"={row['answer']}")
        for step in steps:
            left, result = step.rsplit("=", 1)
            assert eval(left) == int(result)  # noqa: S307 - digits and one operator
    assert [r["prompt"] for r in chain_sum(n=50, terms=4, seed=3, split="test")] != [r["prompt"] for r in rows[:50]]
