"""Command-line gaps a new user hit (issue: tried as a new user would, point 6): tool bounds on the
command line, --tools with saved generations, --limit over a whole completions file."""

from __future__ import annotations

import json

from r1kit.cli import main
from r1kit.evaluation.benchmarks import load_benchmark
from r1kit.execution.tools import from_recipe


def test_tools_take_a_mapping_of_bounds_on_the_command_line():
    (config,) = from_recipe(["{name: python, calls: 2, timeout: 3}"], "--tools")
    assert (config.name, config.calls, config.timeout) == ("python", 2, 3)


def test_a_broken_tool_mapping_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "--benchmark", "task:addition", "--model", "m", "--output", str(out), "--tools", "{name: python, calls: [}"]) == 2
    err = capsys.readouterr().err
    assert "tools[0]: '{name: python, calls: [}' is not a YAML mapping" in err and err.count("\n") == 1
    assert main(["eval", "--benchmark", "task:addition", "--model", "m", "--output", str(out), "--tools", "{name: python, calls: 0}"]) == 2
    assert "tools[0].calls" in capsys.readouterr().err


def completions(tmp_path, n: int):
    ids = [p.id for p in load_benchmark("task:addition", task_args={"n": n}).problems]
    path = tmp_path / "gen.jsonl"
    path.write_text("".join(json.dumps({"id": i, "completion": "The answer is \\boxed{0}."}) + "\n" for i in ids))
    return path


def test_tools_with_saved_generations_are_refused_not_ignored(tmp_path, capsys):
    args = ["eval", "--benchmark", "task:addition", "--task-arg", "n=6", "--completions", str(completions(tmp_path, 6)), "--output", str(tmp_path / "o")]
    assert main([*args, "--tools", "python"]) == 2
    assert "--tools runs code while sampling; --completions scores saved generations" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_limit_scores_the_first_problems_of_a_whole_completions_file(tmp_path, capsys):
    args = ["eval", "--benchmark", "task:addition", "--task-arg", "n=6", "--completions", str(completions(tmp_path, 6)), "--samples", "1"]
    assert main([*args, "--limit", "2", "--output", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["problems"] == 2 and summary["limit"] == 2  # recorded, and said beside the printed figures:
    assert "measured with: 2 problems (the first 2 only: --limit), 1 sample each, scored from" in capsys.readouterr().out
    assert len((tmp_path / "o" / "samples.jsonl").read_text().splitlines()) == 2


def test_a_problem_without_an_answer_is_said_beside_the_figures(tmp_path, capsys):
    """A benchmark row without `answer` left the table at `problems 1` of 2 with only a log line."""
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n{"id": "b", "problem": "2+2?", "answer": null}\n')
    gen = tmp_path / "gen.jsonl"
    gen.write_text('{"id": "a", "completion": "\\\\boxed{2}"}\n{"id": "b", "completion": "\\\\boxed{4}"}\n')
    assert main(["eval", "--benchmark", str(bench), "--completions", str(gen), "--samples", "1", "--output", str(tmp_path / "o")]) == 0
    assert "measured with: 1 problems (1 more without a usable reference answer, left out), 1 sample each" in capsys.readouterr().out


def test_ratings_are_said_and_a_clipped_one_is_a_bound(tmp_path, capsys):
    """Rating and percentile were missing from the printed table, and percentile 100.0 stood beside
    rating_clipped: true as if measured; --rating-table on a benchmark without ratings was ignored."""
    from r1kit.evaluation.evaluate import figure_lines
    from r1kit.evaluation.suite import load_suite, table

    assert figure_lines({"rating": 1432.3, "rating_clipped": False, "percentile": 61.23}) == ["estimated rating 1432, percentile 61.2"]
    assert figure_lines({"rating": 4000.0, "rating_clipped": True})[0] == (
        "estimated rating 4000, no percentile (give --rating-table FILE) (a bound: the estimate reached the end of its range)")
    summaries = {"aime24": {"pass@1": 0.25}, "math500": {"pass@1": 0.8}, "gpqa_diamond": {"pass@1": 0.3}, "livecodebench": {"pass@1": 0.1},
                 "codeforces": {"pass@1": 1.0, "rating": 4000.0, "rating_clipped": True, "percentile": 100.0}}
    text = table(load_suite("r1"), "m", summaries)[0]
    assert "| 100.0 | >= 4000 | >= 100.0 |" in text and "- codeforces: estimated rating 4000, percentile 100.0 (a bound" in text
    rating_table = tmp_path / "table.json"
    rating_table.write_text(json.dumps([[1000, 50], [1500, 30]]))
    assert main(["eval", "--benchmark", "task:addition", "--model", "m", "--output", str(tmp_path / "o"), "--rating-table", str(rating_table)]) == 2
    assert "--rating-table gives Codeforces' rating distribution, but no problem here has a rating" in capsys.readouterr().err
