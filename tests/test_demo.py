"""A shortened run of the README's main demo recipe: every R1 stage runs on the tiny model, each
stage consumes the previous one's output, the run report (table and plots) is written, and a
second run with the same seed prints the same table."""

from __future__ import annotations

from pathlib import Path

from r1kit.cli import main

ROOT = Path(__file__).resolve().parents[1]

SHORT = [
    "cold_start.trainer.max_steps=20",
    "cold_start.data.task.last_digit.n=200",
    "cold_start.data.task.functions.n=200",
    "rl.trainer.max_steps=2",
    "rl.trainer.per_device_train_batch_size=16",
    "rejection.data.task.last_digit.n=8",
    "rejection.data.task.functions.n=8",
    "rejection.samples=4",
    "rejection.min_total=0.0",  # keep whatever the barely trained model writes: this checks plumbing
    "sft.trainer.max_steps=2",
    "rl2.trainer.max_steps=2",
    "rl2.trainer.per_device_train_batch_size=16",
] + [f"{e}.task.{t}.n=12" for e in ("eval_cold_start", "eval_rl", "eval_sft", "eval_rl2") for t in ("last_digit", "functions")] + [
    f"{e}.samples=2" for e in ("eval_cold_start", "eval_rl", "eval_sft", "eval_rl2")
]


def test_short_demo_runs_every_stage_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["run", str(ROOT / "recipes" / "demo.yaml"), f"output_dir={out}", *SHORT]) == 0
    printed = capsys.readouterr().out
    for stage in ("cold_start", "eval_cold_start", "rl", "eval_rl", "rejection", "sft", "eval_sft", "rl2", "eval_rl2"):
        assert (out / stage / "DONE.json").is_file(), stage
    report = (out / "report.md").read_text()
    for evaluated in ("| cold_start |", "| rl |", "| sft |", "| rl2 |"):
        assert evaluated in report and evaluated in printed
    assert "pass@1" in report and "cons@2" in report
    # pass@1 per domain after each stage, and what the rewards cost in each RL stage.
    assert "| model | last_digit (math) | functions (code) |" in report
    assert "| cold_start | functions | code |" in report and "| rl2 | last_digit | math |" in report
    assert "## Reward time" in report and "| rl |" in report.split("## Reward time")[1]
    assert (out / "plots" / "rl.png").stat().st_size > 1000
    assert (out / "plots" / "rl2.png").stat().st_size > 1000
    assert f"report: {out / 'report.md'}" in printed

    # Same recipe, same seed, another folder: the same table, to the last digit.
    again = tmp_path / "again"
    assert main(["run", str(ROOT / "recipes" / "demo.yaml"), f"output_dir={again}", *SHORT]) == 0
    table = printed[printed.index("| model |") : printed.index("report:")]
    assert table in capsys.readouterr().out
    for ev in ("eval_cold_start", "eval_rl", "eval_sft", "eval_rl2"):
        for bench in ("last_digit", "functions"):
            first = (out / ev / bench / "samples.jsonl").read_text()
            assert first == (again / ev / bench / "samples.jsonl").read_text(), (ev, bench)
