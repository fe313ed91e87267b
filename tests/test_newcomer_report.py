"""The same run gives the same report after a resume (issue: tried as a new user would, point 8):
a finished stage's record is read back from DONE.json with its metrics' keys sorted, and the
report listed that stage's benchmarks in another order than an uninterrupted run's."""

from __future__ import annotations

import json

from r1kit.report import accuracy_rows


def record(order):
    figures = {"last_digit": 0.9, "functions": 0.8}
    metrics = {f"{b}/{k}": v for b in order for k, v in (("pass@1", figures[b]), ("domain", "math"))}
    return {"config": {"stage": {"benchmarks": ["task:last_digit", "task:functions"]}}, "input_model": "m", "metrics": metrics}


def test_eval_rows_keep_the_stages_order_whether_or_not_the_record_was_read_back():
    fresh = {"eval": record(["last_digit", "functions"])}
    read_back = json.loads(json.dumps(fresh, sort_keys=True))  # as pipeline.write_json_atomic writes DONE.json
    assert [r["benchmark"] for r in accuracy_rows(read_back)] == [r["benchmark"] for r in accuracy_rows(fresh)] == ["last_digit", "functions"]


def test_the_run_reports_table_says_how_each_eval_stage_sampled():
    from r1kit.report import accuracy_table

    rec = record(["last_digit", "functions"])
    rec["config"]["stage"] |= {"samples": 4, "temperature": 0.6, "top_p": 0.95, "max_tokens": 64, "template": "plain", "limit": 50}
    text = accuracy_table(accuracy_rows({"eval": rec}))
    assert text.endswith("Measured with:\neval: 4 samples each at temperature 0.6, top-p 0.95, max_tokens 64, template plain, "
                         "the first 50 problems only (limit)")


def test_the_run_reports_line_names_the_engine_the_fallback_and_the_choice_seed():
    """Issue 66, point 4: what changed a figure (the backend, the endpoint, chat, the answer
    fallback, the choice seed) was left out of the line that says how it was measured."""
    from r1kit.report import accuracy_table

    rec = record(["last_digit", "functions"])
    rec["metrics"]["functions/domain"] = "choice"
    rec["config"]["stage"] |= {"samples": 4, "temperature": 0.6, "top_p": 0.95, "max_tokens": 64, "template": "chat", "backend": "endpoint",
                               "endpoint": {"url": ["http://h:8000/v1"], "name": "r1", "chat": True}, "answer_fallback": "last_number", "choice_seed": 3}
    text = accuracy_table(accuracy_rows({"eval": rec}))
    shared = "eval: 4 samples each at temperature 0.6, top-p 0.95, max_tokens 64, template chat, endpoint backend serving r1 at http://h:8000/v1, chat messages, answer fallback last_number"
    assert text.endswith(f"Measured with:\n{shared}\n{shared}, choices shuffled with seed 3")


def broken(completions, **columns):
    raise ValueError("boom")


def test_a_failed_run_writes_the_report_of_what_finished(write_recipe, tiny_model, tmp_path, capsys):
    """Issue 66, point 13: a run that failed wrote no report.md; a partial run's tables could only be read from DONE.json files."""
    from r1kit.cli import main

    task = {"source": "task:addition", "task": {"n": 4, "digits": 1}}
    ev = {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "task": task["task"], "samples": 2, "max_tokens": 8,
          "template": "plain", "backend": "transformers"}
    rej = {"name": "rej", "kind": "rejection", "template": "plain", "data": task, "rewards": [{"name": f"{__name__}:broken"}],
           "samples": 2, "max_tokens": 8, "backend": "transformers"}
    path = write_recipe({"model": str(tiny_model), "stages": [ev, rej]})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    report = tmp_path / "run" / "report.md"
    assert f"report of the finished stages: {report}" in err and "boom" in err.strip().splitlines()[-1]
    assert "ev: 2 samples each at temperature 0.6" in report.read_text() and "| start | addition |" in report.read_text()
