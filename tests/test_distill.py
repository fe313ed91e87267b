"""Distillation: the distill stage's loss is the per-token reverse KL on the student's own tokens
(checked by hand), only the student learns, a killed stage resumes, a teacher with another
tokenizer is refused before any model loads; off-policy distillation hands a teacher's verified
samples to a different student (rejection -> sft); tiny:NAME students."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from r1kit import pipeline
from r1kit.cli import main
from r1kit.recipe import load_recipe
from r1kit.stages import StageContext
from r1kit.stages import distill

ROOT = Path(__file__).resolve().parents[1]
STUDENT = {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128}
DATA = {"source": "task:addition", "task": {"n": 32, "digits": 1}}
TRAINER = {"max_steps": 2, "per_device_train_batch_size": 8, "max_completion_length": 8, "learning_rate": 1.0e-3, "logging_steps": 1}


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "distill" / "metrics.jsonl").read_text().splitlines()]


def distill_stage(**changes) -> dict:
    return {"name": "distill", "kind": "distill", "model": "tiny:student", "teacher": "tiny", "template": "plain", "data": DATA,
            "trainer": TRAINER, **changes}


def recipe(write_recipe, *stages, **top) -> Path:
    return write_recipe({"model": "tiny", "tiny_models": {"student": STUDENT}, "stages": list(stages), **top})


def test_loss_is_the_reverse_kl_on_student_tokens_and_only_the_student_learns(write_recipe, tmp_path):
    rec = load_recipe(recipe(write_recipe, distill_stage()))
    stage = rec.stages[0]
    from r1kit.models import resolve

    ctx = StageContext(recipe=rec, stage=stage, dir=tmp_path / "run" / "distill", model=resolve("tiny:student", rec), datasets={})
    ctx.dir.mkdir(parents=True)
    trainer, _ = distill.build(ctx)
    student, teacher = trainer.model, trainer.teacher_model
    torch.manual_seed(0)
    with torch.no_grad():  # the tiny models start near uniform: spread the teacher so the KL is large
        for p in teacher.parameters():
            p.mul_(8.0)
    prompt = torch.tensor([[5, 6, 7, 8], [12, 9, 10, 11]])
    completion = torch.tensor([[20, 21, 22], [30, 31, 0]])  # the second row ended after two tokens
    inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
              "completion_ids": completion, "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    loss, _, n = trainer._compute_loss(student, inputs, None)

    ids = torch.cat([prompt, completion], dim=1)
    with torch.no_grad():  # logits at positions 3..5 predict the completion's tokens 0..2
        s = student(input_ids=ids).logits[:, 3:-1].log_softmax(-1)
        t = teacher(input_ids=ids).logits[:, 3:-1].log_softmax(-1)
    per_token = (s.exp() * (s - t)).sum(-1)  # KL(student || teacher) at each completion token's position
    by_hand = per_token[inputs["completion_mask"].bool()].mean()
    assert int(n) == 5 and by_hand > 0.05
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-4, atol=1e-5)

    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    # The masked position (after the second row's end) changes nothing: only the student's own tokens count.
    inputs["completion_ids"] = torch.tensor([[20, 21, 22], [30, 31, 99]])
    torch.testing.assert_close(trainer._compute_loss(student, inputs, None)[0].detach(), loss.detach())


def test_distill_stage_lowers_the_divergence_and_hands_on_the_student(write_recipe, tmp_path):
    path = recipe(write_recipe, distill_stage(trainer={**TRAINER, "max_steps": 12, "learning_rate": 5.0e-3}))
    done = pipeline.run(load_recipe(path))["distill"]
    assert done["input_model"].endswith("_models/tiny-student")
    assert done["metrics"]["trainer_paths"] == {"r1kit_decoding_loop": "on"}  # the student samples with r1kit's loop
    config = json.loads((Path(done["model"]) / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 64  # the student, not the teacher
    losses = [m["loss"] for m in metrics(tmp_path / "run") if "loss" in m]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3])


def test_teacher_with_another_tokenizer_is_refused_before_any_model_loads(write_recipe, tmp_path, capsys, monkeypatch):
    from transformers import AutoTokenizer

    from r1kit.offline.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other")
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra_token>"])
    tokenizer.save_pretrained(other)
    loaded = []
    monkeypatch.setattr("r1kit.trainers.trl_overrides.DistillationTrainer", lambda *a, **k: loaded.append(a))  # where the models would load
    path = recipe(write_recipe, distill_stage(teacher=str(other)))
    for command in ("validate", "run"):  # both known before the run (a folder, a tiny model's): refused when the recipe is read
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"r1kit: error: {path}: distill.teacher: the teacher {other} and the student tiny:student (built) "
                              "have different tokenizers"), err
    assert loaded == [] and not (tmp_path / "run" / "distill" / "checkpoints").exists()


@pytest.mark.parametrize(
    "stage, message",
    [
        ({"teacher": "tiny:big"}, "distill.teacher: 'tiny:big' names no entry of tiny_models (defined: student)"),
        ({"teacher": "later"}, "distill.teacher: stage 'later' runs after 'distill'"),
        ({"teacher": None}, "distill: missing required key 'teacher'"),
        ({"trainer": {**TRAINER, "beta": 2.0}}, "beta"),
    ],
)
def test_bad_distill_stages_fail_validation(write_recipe, capsys, stage, message):
    later = {"name": "later", "kind": "sft", "data": {"source": "task:addition", "task": {"n": 8}}, "format": "prompt_completion", "trainer": {"max_steps": 1}}
    fields = {k: v for k, v in distill_stage(**stage).items() if v is not None}
    assert main(["validate", str(recipe(write_recipe, fields, later))]) == 2
    assert message in capsys.readouterr().err


def test_off_policy_distillation_hands_a_teachers_samples_to_another_student(write_recipe, tmp_path):
    teacher_samples = {"name": "teacher_samples", "kind": "rejection", "template": "plain", "data": DATA,
                       "rewards": [{"name": "format", "weight": 1.0}], "min_total": 0.0, "samples": 2, "max_kept_per_prompt": 1,
                       "max_tokens": 8, "backend": "transformers"}
    student_sft = {"name": "student_sft", "kind": "sft", "model": "tiny:student", "data": {"source": "teacher_samples"},
                   "format": "prompt_completion", "trainer": {"max_steps": 2, "per_device_train_batch_size": 8}}
    records = pipeline.run(load_recipe(recipe(write_recipe, teacher_samples, student_sft)))
    assert records["teacher_samples"]["input_model"].endswith("_models/tiny")  # sampled by the run's model, the teacher
    assert records["student_sft"]["input_model"].endswith("_models/tiny-student")
    kept = [json.loads(line) for line in Path(records["teacher_samples"]["dataset"]).read_text().splitlines()]
    assert kept and records["student_sft"]["metrics"]["rows"] == len(kept)
    config = json.loads((Path(records["student_sft"]["model"]) / "config.json").read_text())
    assert config["num_hidden_layers"] == 1


def _run_cli(recipe_path: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(recipe_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env)


def test_sigkill_mid_distill_resumes_from_its_checkpoint(write_recipe, tmp_path, caplog, hold, wait_gone):
    trainer = {**TRAINER, "max_steps": 6, "save_steps": 3}
    path = recipe(write_recipe, distill_stage(trainer=trainer))
    proc = _run_cli(path, hold.env(step=3, output_dir=tmp_path / "run" / "distill" / "checkpoints"))
    pids = hold.wait(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_gone(pids)
    assert not (tmp_path / "run" / "distill" / "DONE.json").exists()
    caplog.set_level("INFO", logger="r1kit")
    assert main(["run", str(path)]) == 0
    assert "distill: resuming from" in caplog.text and "checkpoint-3" in caplog.text
    steps = [m["step"] for m in metrics(tmp_path / "run") if "loss" in m]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_shipped_distillation_recipes_validate(capsys):
    for name in ("r1_distill.yaml", "distill_demo.yaml"):
        assert main(["validate", str(ROOT / "recipes" / name)]) == 0


def test_tiny_models_are_checked_and_rebuilt_when_changed(write_recipe, tmp_path, capsys):
    from r1kit.models import resolve

    bad = write_recipe({"model": "tiny", "tiny_models": {"student": {"hiden_size": 64}}, "stages": [distill_stage()]})
    assert main(["validate", str(bad)]) == 2
    assert "tiny_models.student: unknown key 'hiden_size' (did you mean 'hidden_size'?)" in capsys.readouterr().err
    rec = load_recipe(recipe(write_recipe, distill_stage()))
    path = Path(resolve("tiny:student", rec))
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 1
    rec.tiny_models["student"] = {**STUDENT, "num_layers": 2}
    assert json.loads((Path(resolve("tiny:student", rec)) / "config.json").read_text())["num_hidden_layers"] == 2


def test_a_stage_that_failed_before_any_work_runs_after_the_fix_with_no_flag(write_recipe, tmp_path, capsys, monkeypatch):
    """A distill stage refused at its start (a teacher with another tokenizer, known only then, as
    a hub model's is: the check when the recipe is read is switched off here) leaves nothing to
    resume: once the recipe names a fitting teacher, the same command runs it, no --restart-from."""
    import dataclasses

    from transformers import AutoTokenizer

    from r1kit.offline.tiny import build_tiny_model
    from r1kit.stages import distill

    monkeypatch.setattr(distill, "STAGE", dataclasses.replace(distill.STAGE, local_check=None))

    other = build_tiny_model(tmp_path / "other")
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra_token>"])
    tokenizer.save_pretrained(other)
    assert main(["run", str(recipe(write_recipe, distill_stage(teacher=str(other), trainer={**TRAINER, "max_steps": 2})))]) == 2
    assert (tmp_path / "run" / "distill" / pipeline.STARTED).is_file()  # it started, and stopped before any work
    capsys.readouterr()
    fixed = recipe(write_recipe, distill_stage(trainer={**TRAINER, "max_steps": 2}))
    assert main(["run", str(fixed)]) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "distill" / pipeline.MARKER).is_file()


def test_tiny_teacher_and_student_with_other_tokenizers_are_refused_before_the_run(write_recipe, tmp_path, capsys):
    """Two tiny models the run would build, or a stage trained from one: their tokenizers follow
    from the recipe's arguments, so a pair that cannot share tokens is refused by validate, in one
    line, before anything is built."""
    sft = {"name": "sft", "kind": "sft", "model": "tiny:student", "data": {"source": "task:addition", "task": {"n": 8}},
           "format": "prompt_completion", "trainer": {"max_steps": 1}}
    for stages in ([distill_stage(teacher="tiny:other")], [sft, distill_stage(model="sft", teacher="tiny:other")]):
        path = write_recipe({"model": "tiny", "tiny_models": {"student": STUDENT, "other": {**STUDENT, "vocab_size": 300}},
                             "output_dir": str(tmp_path / "run"), "stages": stages})
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "distill.teacher: the teacher tiny:other (built) and the student tiny:student (built) have different tokenizers" in err
        assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()
    same = write_recipe({"model": "tiny", "tiny_models": {"student": STUDENT, "other": {**STUDENT, "num_layers": 1}},
                         "stages": [distill_stage(teacher="tiny:other")]})
    assert main(["validate", str(same)]) == 0  # the same tokenizer arguments: one tokenizer
