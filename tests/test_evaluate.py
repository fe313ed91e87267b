"""Evaluation with the R1 protocol: the metrics on literal answers, resume after an interruption,
scoring given completions, the one-line errors, the CLI on the tiny model (transformers, and vLLM
when installed), and an eval stage before and after training in a recipe."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from r1kit.evaluation import benchmarks

from r1kit.evaluation import metrics
from r1kit.evaluation import evaluate as ev
from r1kit import pipeline
from r1kit.cli import main
from r1kit.errors import EvalError
from r1kit.recipe import load_recipe
from r1kit.sampling import Completion

# ---------------------------------------------------------------------------------------------
# Metrics


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 0, 1, 0.0),
        (5, 1, 1, 0.2),
        (5, 5, 3, 1.0),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (4, 1, 4, 1.0),  # fewer wrong samples than k: a correct one is always drawn
        (64, 1, 16, 0.25),  # 1 - C(63,16)/C(64,16) = 16/64
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert math.isclose(metrics.pass_at_k(n, c, k), expected)


def test_a_problem_without_a_reference_answer_is_unscorable(tmp_path):
    """A null answer is no answer: not the string "None", which \\boxed{None} would match."""
    (tmp_path / "b.jsonl").write_text('{"id": "a", "problem": "?", "answer": null}\n{"id": "b", "problem": "1 + 2", "answer": 3}\n')
    bench = benchmarks.load_benchmark(str(tmp_path / "b.jsonl"))
    assert [p.answer for p in bench.problems] == [None, "3"]
    (tmp_path / "gen.jsonl").write_text('{"id": "a", "completion": "\\\\boxed{None}"}\n{"id": "b", "completion": "\\\\boxed{3}"}\n')
    summary = ev.score_completions(bench, tmp_path / "gen.jsonl", tmp_path / "out")
    assert (summary["problems"], summary["unscorable"], summary["pass@1"]) == (1, 1, 1.0)


@pytest.mark.parametrize("n, c, k", [(4, 0, 8), (4, 4, 0)])
def test_pass_at_k_beyond_the_samples_is_refused(n, c, k):
    with pytest.raises(ValueError, match="0 < k <= n"):
        metrics.pass_at_k(n, c, k)


def test_majority_vote_clusters_equivalent_answers_and_breaks_ties_by_first_appearance():
    votes = metrics.majority_votes(
        [
            ["2", "0.5", "\\frac12", "2", "1/2", "3"],  # {0.5, \frac12, 1/2} outvotes {2, 2}
            ["3", "2", "2", "3"],  # tie: the cluster seen first
            ["\\frac{1}{2}", "2", "0.5", "2"],  # tie between a cluster of two forms and a repeated answer
            [None, None, "7"],  # no answer, no vote
            [None, None],
            ["025", "25", "1,450,000", "1450000", "1450000"],
        ]
    )
    assert votes == [1, 0, 0, 2, None, 2]


def test_a_vote_over_an_unparseable_answer_warns_of_no_reference(caplog):
    """Issue 66, point 8: a leading answer plays the reference of the vote's comparisons, and the
    reward warned "reference 're1(x):1x5+1 ,3\ufffd' cannot be parsed" of a model's answer."""
    from r1kit.rewards.math import math_accuracy

    garbled = "re1(x):1x5+1 ,3\ufffd"
    with caplog.at_level("WARNING"):
        assert metrics.majority_votes([[garbled, "0", "0"]]) == [1]
    assert "cannot be parsed" not in caplog.text
    with caplog.at_level("WARNING"):
        assert math_accuracy(["\\boxed{0}"], answer=[garbled]) == [None]  # a dataset's reference is still warned of
    assert f"reference {garbled!r} cannot be parsed" in caplog.text


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def bench_file(tmp_path) -> Path:
    rows = [
        {"id": "p1", "problem": "first", "answer": "25", "subject": "Algebra", "level": 1},
        {"id": "p2", "problem": "second", "answer": "1450000", "subject": "Geometry", "level": 2},
        {"id": "p3", "problem": "third", "answer": "\\frac43", "subject": "Algebra", "level": 2},
    ]
    return write_jsonl(tmp_path / "bench.jsonl", rows)


COMPLETIONS = {
    "p1": ["\\boxed{025}", "\\boxed{24}", "so \\boxed{24}", "no answer"],  # 1 right; the vote picks 24
    "p2": ["\\boxed{1,450,000}", "<answer> 1450000 </answer>", "\\boxed{7}", "\\boxed{7}"],  # 2 right; tie -> first
    "p3": ["\\boxed{4/3}", "\\boxed{\\frac{4}{3}}", "\\boxed{5}", "<answer>$\\frac43$</answer>"],  # 3 right
}


def test_completions_mode_scores_given_generations(bench_file, tmp_path, capsys):
    gen = write_jsonl(tmp_path / "gen.jsonl", [{"id": i, "completion": c} for i, cs in COMPLETIONS.items() for c in cs])
    out = tmp_path / "scored"
    assert main(["eval", "--benchmark", str(bench_file), "--completions", str(gen), "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 4 and summary["problems"] == 3 and summary["completions"] == str(gen)
    assert math.isclose(summary["pass@1"], (1 / 4 + 2 / 4 + 3 / 4) / 3)
    assert math.isclose(summary["cons@4"], 2 / 3)
    assert math.isclose(summary["pass@2"], ((1 - 3 / 6) + (1 - 1 / 6) + 1) / 3)
    assert summary["pass@4"] == 1.0
    assert math.isclose(summary["no_answer"], 1 / 12)
    assert summary["mean_tokens"] is None and summary["truncated"] is None  # not given
    assert summary["breakdown"]["subject"] == {"Algebra": {"problems": 2, "pass@1": 0.5}, "Geometry": {"problems": 1, "pass@1": 0.5}}
    assert summary["breakdown"]["level"]["2"] == {"problems": 2, "pass@1": 0.625}
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["id"], r["sample"], r["answer"], r["correct"]) for r in rows[:4]] == [
        ("p1", 0, "025", True),
        ("p1", 1, "24", False),
        ("p1", 2, "24", False),
        ("p1", 3, None, False),
    ]
    table = capsys.readouterr().out
    assert "| run | benchmark | problems | k | pass@1 | cons@k | pass@k |" in table
    assert f"| {gen} | bench | 3 | 4 | 50.0 | 66.7 | 100.0 | - | - |" in table


def test_answer_fallback_last_number_scores_unformatted_answers(bench_file, tmp_path, capsys):
    rows = [
        {"id": "p1", "completion": "5 + 20 = 25, so the answer is 25."},
        {"id": "p2", "completion": "It is 1450000 or \\boxed{7}"},  # a box still wins over the last number
        {"id": "p3", "completion": "no number at all"},
    ]
    gen = write_jsonl(tmp_path / "gen.jsonl", rows)
    strict, lenient = tmp_path / "strict", tmp_path / "lenient"
    assert main(["eval", "--benchmark", str(bench_file), "--completions", str(gen), "--output", str(strict)]) == 0
    argv = ["eval", "--benchmark", str(bench_file), "--completions", str(gen), "--output", str(lenient), "--answer-fallback", "last_number"]
    assert main(argv) == 0
    assert json.loads((strict / "summary.json").read_text())["pass@1"] == 0.0
    assert math.isclose(json.loads((lenient / "summary.json").read_text())["pass@1"], 1 / 3)
    answers = [json.loads(line)["answer"] for line in (lenient / "samples.jsonl").read_text().splitlines()]
    assert answers == ["25", "7", None]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*argv[:-2], "--answer-fallback", "first_number"])
    assert exc.value.code == 2
    assert "invalid choice: 'first_number'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{"id": "p1", "completion": "\\boxed{25}"}, {"id": "p9", "completion": "x"}, {"id": "p7", "completion": "x"}], "2 ids are not in benchmark bench: p7, p9"),
        ([{"id": "p1", "completion": "\\boxed{25}"}], "2 of 3 problems of bench have no completions: p2, p3"),
        ([{"id": "p1", "text": "\\boxed{25}"}], "row 1 needs an 'id' and a string 'completion'"),
        (
            [{"id": p, "completion": "x"} for p in ("p1", "p1", "p2", "p2", "p3")],
            "problems have different numbers of samples (1, 2); e.g. 'p3' has 1 where most have 2; give every problem the same k",
        ),
        (
            [{"id": p, "sample": 0, "completion": "x"} for p in ("p1", "p2", "p3", "p3")],
            "row 4: sample 0 of id 'p3' appears twice",
        ),
        ([{"id": "p1", "completion": "x", "tokens": "12"}], "row 1: tokens must be a whole number of tokens or null, got '12'"),
        ([{"id": "p1", "completion": "x", "truncated": "no"}], "row 1: truncated must be true, false or null, got 'no'"),
    ],
)
def test_bad_completions_are_one_line_errors(bench_file, tmp_path, capsys, rows, expected):
    gen = write_jsonl(tmp_path / "gen.jsonl", rows)
    assert main(["eval", "--benchmark", str(bench_file), "--completions", str(gen), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_a_model_that_cannot_load_leaves_the_folder_unclaimed(bench_file, tmp_path, capsys):
    out = tmp_path / "o"
    missing = tmp_path / "no_such_model"
    assert main(["eval", "--benchmark", str(bench_file), "--model", str(missing), "--output", str(out)]) != 0
    capsys.readouterr()
    assert not (out / "settings.json").exists()
    ev.evaluate(addition(2), out, SETTINGS, model="m", sampler=ScriptedSampler)  # the corrected command is not refused
    assert (out / "settings.json").exists()


# ---------------------------------------------------------------------------------------------
# Generation with a scripted sampler: resume


class ScriptedSampler:
    """Answers "What is a + b?": right on even samples, off by one on odd ones."""

    backend = "scripted"
    tokenizer = None

    def __init__(self, fail_on_call: int | None = None):
        self.prompts: list[str] = []
        self.calls = 0
        self.fail_on_call = fail_on_call

    def generate_full(self, prompts, n, params):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt  # as if the run were stopped here
        self.prompts += prompts
        out = []
        for p in prompts:
            a, b = map(int, re.findall(r"\d+", p))
            out.append([Completion(f"<answer> {a + b + j % 2} </answer>", tokens=5 + j, truncated=j == 3) for j in range(n)])
        return out


def addition(limit: int = 6):
    return benchmarks.load_benchmark("task:addition", task_args={"digits": 2, "n": 8}, limit=limit)


SETTINGS = ev.Settings(samples=4, template="plain", max_tokens=16)


def test_an_interrupted_run_resumes_with_only_the_missing_problems(tmp_path, monkeypatch):
    monkeypatch.setattr(ev, "SEQUENCES_PER_CALL", 8)  # two problems per generate call
    bench = addition()
    ref = ScriptedSampler()
    expected = ev.evaluate(bench, tmp_path / "ref", SETTINGS, model="m", sampler=lambda: ref)
    assert ref.calls == 3 and expected["pass@1"] == 0.5 and expected["cons@4"] == 1.0 and expected["truncated"] == 0.25

    out = tmp_path / "run"
    first = ScriptedSampler(fail_on_call=2)
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(bench, out, SETTINGS, model="m", sampler=lambda: first)
    samples, journal = out / "samples.jsonl", out / "journal.jsonl"
    # A header, then the first call's line: its 2 problems' 4 samples each; nothing merged yet.
    assert [len(json.loads(line).get("records", [])) for line in journal.read_text().splitlines()] == [0, 8]
    assert not samples.exists() and not (out / "summary.json").exists()
    with open(journal, "a") as f:  # a kill in the middle of the next call's line
        row = {"id": bench.problems[2].id, "sample": 0, "completion": "x", "answer": None, "correct": False, "tokens": 1, "truncated": False}
        f.write('{"chunk": 1, "start": 2, "stop": 4, "records": [' + json.dumps(row) + ', {"id": "' + bench.problems[3].id + '", "sam')

    second = ScriptedSampler()
    summary = ev.evaluate(bench, out, SETTINGS, model="m", sampler=lambda: second)
    assert second.prompts == [p.problem for p in bench.problems[2:]]
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted((p.id, j) for p in bench.problems for j in range(4))
    assert summary == expected

    def must_not_load():
        raise AssertionError("nothing is left to generate")

    assert ev.evaluate(bench, out, SETTINGS, model="m", sampler=must_not_load) == expected
    # A longer benchmark (a larger limit) generates only the new problems.
    third = ScriptedSampler()
    longer = addition(8)
    assert longer.problems[:6] == bench.problems
    ev.evaluate(longer, out, SETTINGS, model="m", sampler=lambda: third)
    assert third.prompts == [p.problem for p in longer.problems[6:]]


def test_shards_of_a_distributed_eval_merge_into_the_single_process_rows(tmp_path, monkeypatch):
    """Shard 1 of 2 samples calls 1 (and 3, ...) into a file of its own; the merging call samples
    what no shard did (shard 0's calls here: its process was killed) and writes samples.jsonl in
    problem order, the rows and summary of one process."""
    monkeypatch.setattr(ev, "SEQUENCES_PER_CALL", 8)  # two problems per generate call: 3 calls
    bench = addition()
    expected = ev.evaluate(bench, tmp_path / "ref", SETTINGS, model="m", sampler=ScriptedSampler)
    out = tmp_path / "run"
    one = ScriptedSampler()
    assert ev.evaluate(bench, out, SETTINGS, model="m", sampler=lambda: one, shard=1, shards=2) is None
    assert one.prompts == [p.problem for p in bench.problems[2:4]] and not (out / "summary.json").exists()
    assert [len(json.loads(line).get("records", [])) for line in (out / "journal.shard1.jsonl").read_text().splitlines()] == [0, 8]
    merged = ScriptedSampler()
    assert ev.evaluate(bench, out, SETTINGS, model="m", sampler=lambda: merged) == expected
    assert merged.prompts == [p.problem for p in bench.problems[:2] + bench.problems[4:]]  # what shard 0 did not
    assert (out / "samples.jsonl").read_text() == (tmp_path / "ref" / "samples.jsonl").read_text()
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["journal.jsonl", "journal.shard1.jsonl", "samples.jsonl"]
    later = ScriptedSampler()  # a benchmark after one of a single call, in one eval stage: its calls start at 1
    ev.evaluate(bench, tmp_path / "later", SETTINGS, model="m", sampler=lambda: later, shard=1, shards=2, first_call=1)
    assert later.prompts == [p.problem for p in bench.problems[:2] + bench.problems[4:]]


def test_a_folder_with_other_settings_is_refused(tmp_path):
    ev.evaluate(addition(2), tmp_path, SETTINGS, model="m", sampler=ScriptedSampler)
    with pytest.raises(EvalError, match=r"other settings \(changed: temperature\)"):
        ev.evaluate(addition(2), tmp_path, ev.Settings(samples=4, template="plain", max_tokens=16, temperature=1.0), model="m", sampler=ScriptedSampler)


# ---------------------------------------------------------------------------------------------
# Benchmarks and errors


def test_gsm8k_reference_is_the_number_after_the_marks():
    assert benchmarks.gsm8k_answer("She sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072") == "1072"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--benchmark", "aime2024"], "unknown benchmark 'aime2024'; use one of aime24, aime25, math500, amc23, gsm8k, humaneval, mbpp, livecodebench, codeforces, gpqa_diamond, task:NAME"),
        (["--benchmark", "{bench}", "--samples", "0"], "samples must be at least 1, got 0"),
        (["--benchmark", "{bench}", "--answer-field", "solution"], "{bench}: row 1 has no field 'solution'"),
        (["--benchmark", "{bench}", "--template", "Q:"], "unknown template 'Q:'"),
        (["--benchmark", "{missing}"], "{missing}: no such data file"),
        (["--benchmark", "task:addition", "--task-arg", "size=3"], "task:addition: got an unexpected keyword argument 'size'; it takes n, digits, seed, direct"),
    ],
)
def test_bad_input_is_a_one_line_error(bench_file, tmp_path, capsys, argv, expected):
    names = {"bench": str(bench_file), "missing": str(tmp_path / "nope.jsonl")}
    argv = [a.format(**names) for a in argv]
    assert main(["eval", "--model", "m", "--output", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert expected.format(**names) in err and err.count("\n") == 1


def test_model_or_completions_is_required(bench_file, tmp_path, capsys):
    assert main(["eval", "--benchmark", str(bench_file), "--output", str(tmp_path)]) == 2
    assert "either --model (or --endpoint) or --completions" in capsys.readouterr().err


@pytest.mark.network
@pytest.mark.parametrize("name", list(benchmarks.BENCHMARKS))
def test_builtin_benchmarks_load(name):
    bench = benchmarks.load_benchmark(name)
    assert len(bench.problems) >= 30 and all(p.problem and p.answer for p in bench.problems)
    if name == "gsm8k":
        assert all("####" not in p.answer for p in bench.problems)
    if name == "math500":
        assert {"subject", "level"} <= set(bench.problems[0].groups)


# ---------------------------------------------------------------------------------------------
# Real models


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_tiny_model_eval_from_the_command_line(tiny_model, tmp_path, capsys, backend):
    if backend == "vllm":
        pytest.importorskip("vllm")
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model), "--benchmark", "task:addition", "--task-arg", "n=5", "--samples", "3"]
    assert main([*argv, "--max-tokens", "12", "--backend", backend, "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {"pass@1", "cons@3", "pass@3", "mean_tokens", "truncated"} <= set(summary)
    assert summary["model"] == str(tiny_model) and summary["samples"] == 3 and summary["max_tokens"] == 12
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 15 and all(1 <= r["tokens"] <= 12 for r in rows)
    assert summary["truncated"] == sum(r["truncated"] for r in rows) / 15
    assert f"| {tiny_model} | addition | 5 | 3 |" in capsys.readouterr().out


def eval_stage(name: str) -> dict:
    return {
        "name": name,
        "kind": "eval",
        "benchmarks": ["task:addition"],
        "task": {"digits": 1, "n": 16},
        "samples": 4,
        "max_tokens": 48,
        "template": "plain",
        "backend": "transformers",
    }


def test_eval_stages_around_training_report_per_stage(write_recipe, tiny_model, tmp_path, capsys):
    sft = {
        "name": "sft",
        "kind": "sft",
        "format": "prompt_completion",
        "data": {"source": "task:addition", "task": {"n": 80, "digits": 1}},
        "trainer": {"max_steps": 100, "per_device_train_batch_size": 32, "learning_rate": 5.0e-3, "warmup_steps": 10},
    }
    path = write_recipe({"model": str(tiny_model), "stages": [eval_stage("before"), sft, eval_stage("after")]})
    records = pipeline.run(load_recipe(path))
    run = tmp_path / "run"
    assert records["sft"]["input_model"] == str(tiny_model)  # an eval stage hands on the model it evaluated
    assert records["after"]["input_model"] == records["sft"]["model"]
    before, after = records["before"]["metrics"], records["after"]["metrics"]
    assert set(after) == {f"addition/{k}" for k in ("pass@1", "cons@4", "pass@4", "mean_tokens", "truncated", "domain")}
    # Each eval stage measured its own model: the trained one finishes answers the random one does not.
    assert after["addition/truncated"] < before["addition/truncated"]
    for stage in ("before", "after"):
        summary = json.loads((run / stage / "addition" / "summary.json").read_text())
        assert summary["pass@1"] == records[stage]["metrics"]["addition/pass@1"]
        assert f"| {stage} | addition | 16 | 4 |" in (run / stage / "results.md").read_text()
    capsys.readouterr()
    assert main(["eval", "compare", str(run / "before"), str(run / "after")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[4:] == ["", "measured with: 16 problems, 4 samples each at temperature 0.6, top-p 0.95, max_tokens 48, template plain, "
                             "transformers backend"]
    assert table[2].startswith(f"| {run / 'before' / 'addition'} |") and table[3].startswith(f"| {run / 'after' / 'addition'} |")


def test_bad_eval_stage_is_a_recipe_error(write_recipe, tiny_model, capsys):
    stage = {**eval_stage("eval"), "benchmarks": ["task:addition", "aime_24"]}
    assert main(["validate", str(write_recipe({"model": str(tiny_model), "stages": [stage]}))]) == 2
    assert "eval.benchmarks[1]: unknown benchmark 'aime_24'" in capsys.readouterr().err


def test_the_report_gives_each_eval_stage_its_own_cons_at_k():
    """Two eval stages at different k: a cons@k column for each, every figure in its row."""
    from r1kit.report import accuracy_rows, accuracy_table

    def figures(k, cons):
        return {"aime24/pass@1": 0.1, f"aime24/cons@{k}": cons, "aime24/mean_tokens": 9.0, "aime24/truncated": 0.0, "aime24/domain": "math"}

    records = {"base": {"input_model": "m", "metrics": figures(4, 0.25)}, "late": {"input_model": "m", "metrics": figures(16, 0.5)}}
    lines = accuracy_table(accuracy_rows(records)).splitlines()
    assert lines[0] == "| eval | model | benchmark | domain | pass@1 | cons@4 | cons@16 | mean_tokens | truncated |"  # one model, two evals
    assert "| 0.250 |  |" in lines[2] and "|  | 0.500 |" in lines[3]


def test_scored_completions_keep_their_sample_numbers(tmp_path):
    """Rows listed out of sample order: samples.jsonl numbers them as given, and cons@k breaks its
    tie (5, 7, 7, 5 in sample order) by the first sample, not the first row."""
    (tmp_path / "b.jsonl").write_text(json.dumps({"id": "a", "problem": "q", "answer": "5"}) + "\n")
    given = [(2, 7), (0, 5), (1, 7), (3, 5)]
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps({"id": "a", "sample": j, "completion": f"\\boxed{{{x}}}"}) + "\n" for j, x in given))
    summary = ev.score_completions(benchmarks.load_benchmark(str(tmp_path / "b.jsonl")), tmp_path / "gen.jsonl", tmp_path / "out")
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [(r["sample"], r["answer"]) for r in rows] == [(0, "5"), (1, "7"), (2, "7"), (3, "5")]
    assert summary["cons@4"] == 1.0
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "a", "sample": "first", "completion": "x"}) + "\n")
    with pytest.raises(EvalError, match="row 1: sample must be a whole number or null"):
        ev.score_completions(benchmarks.load_benchmark(str(tmp_path / "b.jsonl")), tmp_path / "bad.jsonl", tmp_path / "out2")
