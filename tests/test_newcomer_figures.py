"""Figures that were silently partial or mislabelled (issue: tried as a new user would, points 5-7):
samples.jsonl names the reference beside the prediction, a null subject is a group of its own,
mean tokens over part of the samples is said, prose with no program is "no program", and a
suite's task benchmark takes its arguments in the suite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1kit.cli import main
from r1kit.errors import EvalError
from r1kit.evaluation.benchmarks import load_benchmark
from r1kit.execution import judge as judging
from r1kit.execution.sandbox import Limits

GPQA_ROWS = [{"Record ID": f"r{i}", "Question": f"Q{i}?", "Correct Answer": "yes", "Incorrect Answer 1": "no", "Incorrect Answer 2": "maybe",
              "Incorrect Answer 3": "never", "High-level domain": domain} for i, domain in enumerate(["Physics", None, "Physics"])]


def scored_gpqa(tmp_path, completion=lambda p: f"Answer: {p.answer}", tokens=lambda i: 10) -> tuple[dict, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / "gpqa.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in GPQA_ROWS))
    bench = load_benchmark("gpqa_diamond", data_file=str(copy))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": completion(p), "tokens": tokens(i)}) + "\n"
                           for i, p in enumerate(bench.problems)))
    out = tmp_path / "e"
    assert main(["eval", "--benchmark", "gpqa_diamond", "--data-file", str(copy), "--completions", str(gen), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), rows


def test_samples_name_the_reference_and_the_choices_as_shown(tmp_path):
    _, rows = scored_gpqa(tmp_path, completion=lambda p: "Answer: yes")  # the correct text, whatever its letter
    for row in rows:
        assert row["reference"] in "ABCD" and row["choices"][("ABCD").index(row["reference"])] == "yes"
        assert row["answer"] == row["reference"] and row["correct"] is True
        assert sorted(row["choices"]) == ["maybe", "never", "no", "yes"]


def test_a_null_subject_is_a_group_of_its_own(tmp_path, capsys):
    summary, _ = scored_gpqa(tmp_path)
    assert summary["breakdown"]["subject"] == {"(none)": {"problems": 1, "pass@1": 1.0}, "Physics": {"problems": 2, "pass@1": 1.0}}
    assert "(none) 100.0 (1)" in capsys.readouterr().out


def test_mean_tokens_over_part_of_the_samples_is_said(tmp_path, capsys):
    summary, _ = scored_gpqa(tmp_path, tokens=lambda i: None if i == 1 else 10)
    assert summary["mean_tokens"] == 10 and summary["samples_without_tokens"] == 1
    assert "mean tokens over the samples with a token count only: 1 have none" in capsys.readouterr().out
    summary, _ = scored_gpqa(tmp_path / "all")
    assert "samples_without_tokens" not in summary


def test_prose_without_a_program_is_no_program_and_broken_code_a_syntax_error():
    tests = judging.Tests(tests="assert add(2, 3) == 5\n")
    prose, broken, unfenced = judging.judge(["The function adds its two arguments and returns the sum.",
                                     "def add(a, b) return a + b\n", "I would write add(a, b): return a + b"], [tests] * 3, limits=Limits())
    assert prose.reason == "no program" and broken.reason == "syntax error"
    assert unfenced.reason == "no program"  # prose that quotes code is still prose


def test_a_suites_task_benchmark_takes_its_arguments_in_the_suite_file(tiny_model, tmp_path, capsys):
    suite = tmp_path / "mine.yaml"
    suite.write_text("name: mine\nprotocol: {max_tokens: 4}\nbenchmarks:\n"
                     "  - {benchmark: 'task:last_digit', samples: 1, task: {n: 3, terms: 2}}\n")
    assert main(["eval", "--suite", str(suite), "--model", str(tiny_model), "--output", str(tmp_path / "o"), "--backend", "transformers"]) == 0
    summaries = list((tmp_path / "o").rglob("summary.json"))
    assert len(summaries) == 1 and json.loads(summaries[0].read_text())["problems"] == 3
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nbenchmarks:\n  - {benchmark: aime24, task: {n: 3}}\n")
    assert main(["eval", "--suite", str(bad), "--model", str(tiny_model), "--output", str(tmp_path / "b")]) == 2
    assert "benchmarks[0].task: arguments of a task:NAME benchmark; aime24 is not one" in capsys.readouterr().err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: u\nbenchmarks:\n  - {benchmark: 'task:last_digit', task: {nn: 3}}\n")
    assert main(["eval", "--suite", str(unknown), "--model", str(tiny_model), "--output", str(tmp_path / "u")]) == 2
    err = capsys.readouterr().err
    assert "benchmarks[0].task" in err and len(err.strip().splitlines()) == 1
    assert main(["eval", "--suite", str(suite), "--model", str(tiny_model), "--output", str(tmp_path / "t"), "--task-arg", "n=3"]) == 2
    assert "set it in the suite file (its benchmarks' task: {KEY: VALUE})" in capsys.readouterr().err


def test_a_suites_saved_generations_are_scored_and_a_subset_run(tiny_model, tmp_path, capsys):
    """--suite with --completions scores a folder of saved generations (a suite's own output
    folder, or NAME.jsonl files); --only runs some of a suite's benchmarks."""
    suite = tmp_path / "two.yaml"
    suite.write_text("name: two\nprotocol: {max_tokens: 4}\nbenchmarks:\n"
                     "  - {benchmark: 'task:last_digit', samples: 1, task: {n: 3, terms: 2}}\n"
                     "  - {benchmark: 'task:addition', samples: 2, report: [pass@1, cons@2], task: {n: 2}}\n")
    run = ["eval", "--suite", str(suite), "--output"]
    assert main([*run, str(tmp_path / "one"), "--model", str(tiny_model), "--backend", "transformers", "--only", "last_digit"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir() if p.is_dir()) == ["last_digit"]
    assert main([*run, str(tmp_path / "sampled"), "--model", str(tiny_model), "--backend", "transformers"]) == 0
    sampled = json.loads((tmp_path / "sampled" / "suite.json").read_text())
    capsys.readouterr()
    assert main([*run, str(tmp_path / "rescored"), "--completions", str(tmp_path / "sampled")]) == 0
    assert capsys.readouterr().out.startswith("| model | last_digit pass@1 | addition pass@1 | addition cons@2 |")
    rescored = json.loads((tmp_path / "rescored" / "suite.json").read_text())
    for name in ("last_digit", "addition"):
        a, b = (json.loads((tmp_path / d / name / "summary.json").read_text()) for d in ("sampled", "rescored"))
        assert a["pass@1"] == b["pass@1"] and a["problems"] == b["problems"]
    assert rescored["protocol"] is not None and sampled["protocol"] is not None
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "last_digit.jsonl").write_text((tmp_path / "sampled" / "last_digit" / "samples.jsonl").read_text())
    assert main([*run, str(tmp_path / "partial"), "--completions", str(flat), "--only", "last_digit"]) == 0
    assert main([*run, str(tmp_path / "missing"), "--completions", str(flat)]) == 2
    assert "no addition.jsonl or addition/samples.jsonl for benchmark addition" in capsys.readouterr().err


# Issue 66, points 1 and 4: every setting that changes what is sampled or how it is scored is in
# the folder's fingerprint (a changed one is refused) and in the line that says how figures were measured.


def _long_cot(tmp_path):
    """A benchmark whose completions state their answers without a box: 0 without --answer-fallback, 1 with it."""
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n{"id": "b", "problem": "2+2?", "answer": "4"}\n')
    gen = tmp_path / "gen.jsonl"
    gen.write_text('{"id": "a", "completion": "so it is 2"}\n{"id": "b", "completion": "so it is 4"}\n')
    return ["eval", "--benchmark", str(bench), "--completions", str(gen)]


def test_a_changed_answer_fallback_is_refused_and_named_beside_the_figures(tmp_path, capsys):
    args = _long_cot(tmp_path)
    assert main([*args, "--output", str(tmp_path / "plain")]) == 0
    assert main([*args, "--output", str(tmp_path / "plain"), "--answer-fallback", "last_number"]) == 2
    assert "(changed: answer_fallback)" in capsys.readouterr().err
    assert main([*args, "--output", str(tmp_path / "fallback"), "--answer-fallback", "last_number"]) == 0
    capsys.readouterr()
    assert main(["eval", "compare", str(tmp_path / "plain"), str(tmp_path / "fallback")]) == 0
    out = capsys.readouterr().out
    assert "measured with:" not in out  # 0.0 and 100.0 do not share one line
    assert f"scored from {tmp_path / 'gen.jsonl'}, answer fallback last_number" in out


def test_a_changed_choice_seed_is_refused_and_named_beside_the_figures(tmp_path, capsys):
    copy = tmp_path / "gpqa.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in GPQA_ROWS))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": r["Record ID"], "completion": "Answer: yes"}) + "\n" for r in GPQA_ROWS))
    args = ["eval", "--benchmark", "gpqa_diamond", "--data-file", str(copy), "--completions", str(gen), "--output", str(tmp_path / "e")]
    assert main(args) == 0
    assert "choices shuffled with seed 0" in capsys.readouterr().out
    assert main([*args, "--choice-seed", "1"]) == 2
    assert "(changed: benchmark.choice_seed)" in capsys.readouterr().err


def test_the_rating_table_is_recorded_refused_when_changed_and_named(tmp_path, capsys):
    from r1kit.evaluation.evaluate import protocol_line, score_completions

    cf = str(Path(__file__).parent / "data" / "codeforces.jsonl")
    tables = [tmp_path / "r1.json", tmp_path / "codeelo.json"]
    tables[0].write_text(json.dumps([[1000, 50], [1500, 30], [2000, 20]]))
    tables[1].write_text(json.dumps([[1000, 80], [1500, 15], [2000, 5]]))
    bench = load_benchmark("codeforces", data_file=cf, rating_table=str(tables[0]))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": "no program"}) + "\n" for p in bench.problems))
    summary = score_completions(bench, gen, tmp_path / "e")
    assert summary["rating_table"] == str(tables[0]) and json.loads((tmp_path / "e" / "settings.json").read_text())["benchmark"]["rating_table"] == str(tables[0])
    assert protocol_line(summary).endswith(f", percentile from {tables[0]}")
    with pytest.raises(EvalError, match=r"\(changed: benchmark.rating_table\)"):
        score_completions(load_benchmark("codeforces", data_file=cf, rating_table=str(tables[1])), gen, tmp_path / "e")
