"""The pipeline on the tiny model: SFT learns, stages hand off, finished stages are kept, and a
run killed with SIGKILL resumes from its checkpoint to the same result as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from r1kit.cli import main
from r1kit.recipe import load_recipe
from r1kit import pipeline

TRAINER = {
    "max_steps": 30,
    "per_device_train_batch_size": 8,
    "learning_rate": 3.0e-3,
    "logging_steps": 5,
    "save_steps": 10,
}


def sft_stage(name="sft", **extra):
    return {
        "name": name,
        "kind": "sft",
        "data": {"source": "task:addition", "task": {"n": 400, "digits": 2}},
        "format": "prompt_completion",
        "trainer": dict(TRAINER),
        **extra,
    }


def weights(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def test_sft_learns_and_hands_off_to_the_next_stage(write_recipe, tiny_model, tmp_path):
    path = write_recipe({"model": str(tiny_model), "stages": [sft_stage("a"), sft_stage("b", model="a")]})
    records = pipeline.run(load_recipe(path))
    a, b = records["a"], records["b"]
    assert a["metrics"]["last_loss"] < a["metrics"]["first_loss"] * 0.7
    assert b["input_model"] == a["model"] == str(tmp_path / "run" / "a" / "model")
    assert b["metrics"]["first_loss"] < a["metrics"]["first_loss"]  # b starts where a ended
    # the saved model reloads and generates
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(b["model"])
    model = AutoModelForCausalLM.from_pretrained(b["model"])
    prompt = tok("What is 12 + 34?", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    # The stage folder says exactly what TRL was given: recipe fields, r1kit's, and every default.
    given = json.loads((tmp_path / "run" / "a" / "trainer_config.json").read_text())
    assert given["learning_rate"] == 3.0e-3 and given["max_steps"] == 30 and given["seed"] == 42
    assert given["output_dir"] == str(tmp_path / "run" / "a" / "checkpoints")
    assert given["use_cpu"] is (not torch.cuda.is_available()) and "warmup_steps" in given
    metrics = [json.loads(l) for l in (tmp_path / "run" / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [5, 10, 15, 20, 25, 30]
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["seed"] == 42 and "trl" in run_json["versions"]

    # finished stages are skipped; a changed finished stage is refused; --restart-from redoes it
    mtime = (tmp_path / "run" / "a" / "DONE.json").stat().st_mtime
    again = pipeline.run(load_recipe(path))
    assert again["a"]["finished_at"] == a["finished_at"]
    assert (tmp_path / "run" / "a" / "DONE.json").stat().st_mtime == mtime
    assert main(["run", str(path), "b.trainer.learning_rate=1e-3"]) == 2
    assert main(["run", str(path), "b.trainer.learning_rate=1e-3", "--restart-from", "b"]) == 0
    redone = json.loads((tmp_path / "run" / "b" / "DONE.json").read_text())
    assert redone["config"]["stage"]["trainer"]["learning_rate"] == 1e-3
    assert json.loads((tmp_path / "run" / "a" / "DONE.json").read_text())["finished_at"] == a["finished_at"]


def test_changed_finished_stage_message_names_the_change(write_recipe, tiny_model, capsys):
    path = write_recipe({"model": str(tiny_model), "stages": [sft_stage(trainer={**TRAINER, "max_steps": 2})]})
    assert main(["run", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "sft.trainer.max_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "stage 'sft' already finished" in err and "stage.trainer.max_steps" in err and "--restart-from sft" in err


def _run_cli(recipe: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "r1kit.cli", "run", str(recipe)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def test_sigkill_mid_stage_resumes_from_checkpoint_to_the_same_result(write_recipe, tiny_model, tmp_path, caplog, hold, wait_gone):
    stages = [sft_stage("first", trainer={**TRAINER, "max_steps": 10}), sft_stage("second", model="first")]
    killed = write_recipe({"model": str(tiny_model), "stages": stages, "output_dir": str(tmp_path / "killed")}, "k.yaml")
    clean = write_recipe({"model": str(tiny_model), "stages": stages, "output_dir": str(tmp_path / "clean")}, "c.yaml")

    # The run holds right after saving checkpoint-10 of the second stage (of 30 steps) until killed.
    proc = _run_cli(killed, hold.env(step=10, output_dir=tmp_path / "killed" / "second" / "checkpoints"))
    pids = hold.wait(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_gone(pids)
    assert (tmp_path / "killed" / "second" / "checkpoints" / "checkpoint-10" / "trainer_state.json").is_file()
    assert not (tmp_path / "killed" / "second" / "DONE.json").exists()
    first_done = (tmp_path / "killed" / "first" / "DONE.json").read_text()

    caplog.set_level("INFO", logger="r1kit")
    assert main(["run", str(killed)]) == 0
    assert "first: finished earlier, skipped" in caplog.text
    assert "second: resuming from" in caplog.text and "checkpoint-" in caplog.text
    assert (tmp_path / "killed" / "first" / "DONE.json").read_text() == first_done  # not redone
    metrics = [json.loads(l) for l in (tmp_path / "killed" / "second" / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics if "loss" in m]
    assert steps == sorted(set(steps)), "resumed metrics must not repeat steps"

    assert main(["run", str(clean)]) == 0
    resumed, uninterrupted = weights(tmp_path / "killed" / "second" / "model"), weights(tmp_path / "clean" / "second" / "model")
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_only_the_first_unfinished_stage_keeps_its_partial_work(write_recipe, tiny_model, tmp_path):
    quick = {**TRAINER, "max_steps": 2}
    path = write_recipe({"model": str(tiny_model), "stages": [sft_stage("a", trainer=quick), sft_stage("b", trainer=quick)]})
    pipeline.run(load_recipe(path))
    run = tmp_path / "run"
    (run / "b" / "DONE.json").unlink()
    (run / "b" / "partial.txt").write_text("work in progress")
    pipeline.run(load_recipe(path))  # b is the first unfinished stage: it resumes, its folder kept
    assert (run / "b" / "partial.txt").exists()
    (run / "b" / "DONE.json").unlink()
    pipeline.run(load_recipe(path), restart_from="a")  # a changes, so b's partial work is stale
    assert not (run / "b" / "partial.txt").exists() and (run / "b" / "DONE.json").exists()


def test_a_checkpoint_cut_short_by_a_kill_is_not_resumed_from(tmp_path):
    from types import SimpleNamespace

    from r1kit.trainers.training import last_checkpoint

    ctx = SimpleNamespace(dir=tmp_path)
    folder = tmp_path / "checkpoints"
    for step, complete in [(8, True), (16, True), (24, False)]:
        (folder / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            (folder / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert last_checkpoint(ctx) == str(folder / "checkpoint-16")
    assert last_checkpoint(SimpleNamespace(dir=tmp_path / "none")) is None


def test_a_stage_is_not_taken_as_done_or_resumed_when_what_it_was_made_from_changed(write_recipe, tiny_model, tmp_path):
    """A finished stage whose earlier stages were removed or reordered (its input model would
    differ), and an interrupted stage whose config changed (its checkpoints were made under the
    old one), are refused with the way out, as a finished stage whose own config changed is."""
    from r1kit.errors import RecipeError

    quick = {**TRAINER, "max_steps": 2}
    a, b = sft_stage("a", trainer=quick), sft_stage("b", trainer=quick)
    path = write_recipe({"model": str(tiny_model), "stages": [a, b]})
    pipeline.run(load_recipe(path))
    for stages in ([b], [b, a]):
        with pytest.raises(RecipeError, match=r"stage 'b' already finished in .* after stages \['a'\], and the recipe now runs it after"):
            pipeline.plan(load_recipe(write_recipe({"model": str(tiny_model), "stages": stages}, "other.yaml")))
    (tmp_path / "run" / "b" / pipeline.MARKER).unlink()  # as if b had been killed
    assert pipeline.plan(load_recipe(path)).resume == "b"
    changed = write_recipe({"model": str(tiny_model), "stages": [a, sft_stage("b", trainer={**quick, "learning_rate": 1e-3})]}, "changed.yaml")
    with pytest.raises(RecipeError, match=r"stage 'b' did not finish \(interrupted or failed\) .* \(changed: stage.trainer.learning_rate\).* --restart-from b"):
        pipeline.plan(load_recipe(changed))
    assert pipeline.plan(load_recipe(changed), restart_from="b").resume is None


def test_a_metrics_log_cut_short_by_a_kill_is_read_and_resumed(tmp_path):
    from r1kit.trainers.training import make_metrics_log, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 0.9}\n{"step": 30, "lo')
    assert [r["step"] for r in read_metrics(path)] == [10, 20]
    make_metrics_log(path, resume_step=20, is_main=True)
    assert path.read_text() == '{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 0.9}\n'
