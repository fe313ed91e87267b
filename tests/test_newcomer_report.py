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
