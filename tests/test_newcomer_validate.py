"""What `r1kit validate` passed and `r1kit run` then failed on (issue: tried as a new user would,
point 2): each refused in one line naming the key, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from r1kit.cli import main


def write(tmp_path, stages, **top) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": stages, **top}))
    return str(path)


GRPO = {"name": "rl", "kind": "grpo", "data": {"source": "task:addition"}, "rewards": [{"name": "math_accuracy"}]}
SFT = {"name": "s", "kind": "sft", "format": "prompt_completion", "data": {"source": "task:addition"}}
EVAL = {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "max_tokens": 8}


@pytest.mark.parametrize("stages, top, says", [
    ([{**GRPO, "trainer": {"loss_type": "grpo2"}}], {},
     "rl.trainer.loss_type: 'grpo2' is not one of GRPOConfig's: grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo (did you mean 'grpo'?)"),
    ([{**SFT, "trainer": {"loss_type": "dpo"}}], {}, "s.trainer.loss_type: 'dpo' is not one of SFTConfig's: nll, dft"),
    ([EVAL], {"model": "tiny:small", "tiny_models": {"small": {"hidden_size": 32, "num_heads": 2}}},
     "tiny_models.small: hidden_size / num_heads must be a whole number of at least 32 (the head size), got 32 / 2"),
    ([EVAL], {"tiny_model": {"num_heads": 2, "num_kv_heads": 3, "hidden_size": 64}}, "tiny_model: num_heads must be a multiple of num_kv_heads"),
    ([EVAL], {"tiny_model": {"tool_vocab": "yes"}}, "tiny_model.tool_vocab: expected true or false, got 'yes'"),
    ([EVAL], {"tiny_model": {"vocab_size": True}}, "tiny_model.vocab_size: expected a whole number of at least 1, got True"),
    ([{**EVAL, "benchmarks": ["task:addition", "data/missing.jsonl"]}], {}, "ev.benchmarks[1]: no such file 'data/missing.jsonl'"),
    ([{**EVAL, "data_file": "copies/gpqa.jsonl"}], {}, "ev.data_file: no such file 'copies/gpqa.jsonl'"),
])
def test_validate_refuses_what_run_failed_on(tmp_path, capsys, stages, top, says):
    path = write(tmp_path, stages, **top)
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert main(["run", path]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_trl_values_still_pass(tmp_path, capsys):
    assert main(["validate", write(tmp_path, [{**GRPO, "trainer": {"loss_type": "dr_grpo"}}, {**SFT, "trainer": {"loss_type": "dft"}}])]) == 0


def test_validate_refuses_a_teacher_with_another_tokenizer_as_the_docs_say(tmp_path, capsys):
    """"Refused in one line before any model loads": validate passed it, run refused it later."""
    from r1kit.offline.tiny import build_tiny_model

    student = build_tiny_model(tmp_path / "student", vocab_size=400)
    teacher = build_tiny_model(tmp_path / "teacher", vocab_size=300)
    capsys.readouterr()
    distill = {"name": "d", "kind": "distill", "teacher": str(teacher), "template": "plain", "data": {"source": "task:addition"}}
    assert main(["validate", write(tmp_path, [distill], model=str(student))]) == 2
    err = capsys.readouterr().err
    assert "d.teacher: the teacher" in err and "have different tokenizers" in err and err.count("\n") == 1
    assert main(["validate", write(tmp_path, [{**distill, "teacher": str(student)}], model=str(student))]) == 0
    # the student is the sft stage's model, not written yet: training keeps the tokenizer it started with, checked as well
    after_sft = [{**SFT, "trainer": {"max_steps": 1}}, distill]
    assert main(["validate", write(tmp_path, after_sft, model=str(student))]) == 2
    assert "d.teacher: the teacher" in capsys.readouterr().err


def test_validate_says_nothing_of_triton():
    """Issue 66, point 13: validate's output began with vLLM's three lines on Triton's absence on a CPU."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    done = subprocess.run([sys.executable, "-m", "r1kit.cli", "validate", "recipes/r1_zero_async.yaml"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert "valid (1 stages" in done.stdout and "Triton" not in done.stdout + done.stderr, done.stderr
