"""GPQA Diamond read in the hub schema has a per-subject breakdown (issue: tried as a new user
would, point 5): the official export's ``High-level domain`` column was not mapped."""

from __future__ import annotations

import json

from r1kit.cli import main
from r1kit.evaluation.benchmarks import load_benchmark


def test_the_hub_schemas_high_level_domain_is_the_breakdown(tmp_path):
    rows = [{"Record ID": f"r{i}", "Question": f"Q{i}?", "Correct Answer": "yes", "Incorrect Answer 1": "no", "Incorrect Answer 2": "maybe",
             "Incorrect Answer 3": "never", "High-level domain": domain, "Subdomain": f"Some {domain}"}
            for i, domain in enumerate(["Physics", "Chemistry", "Physics"])]
    copy = tmp_path / "gpqa.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = load_benchmark("gpqa_diamond", data_file=str(copy))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": f"Answer: {p.answer}"}) + "\n" for p in bench.problems))
    assert main(["eval", "--benchmark", "gpqa_diamond", "--data-file", str(copy), "--completions", str(gen), "--output", str(tmp_path / "e")]) == 0
    breakdown = json.loads((tmp_path / "e" / "summary.json").read_text())["breakdown"]
    assert breakdown["subject"] == {"Chemistry": {"problems": 1, "pass@1": 1.0}, "Physics": {"problems": 2, "pass@1": 1.0}}


def test_the_printed_table_shows_the_breakdown(tmp_path, capsys):
    test_the_hub_schemas_high_level_domain_is_the_breakdown(tmp_path)
    assert "gpqa_diamond: pass@1 by subject (problems): Chemistry 100.0 (1), Physics 100.0 (2)" in capsys.readouterr().out
