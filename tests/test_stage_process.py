"""Each stage in its own process (r1kit.stage_process, the default on CUDA machines, forced here
with R1KIT_STAGE_PROCESS=1): the same records as running in one process, nothing of a stage left
in the pipeline's process, errors as before, no stage outliving a killed run, and distributed
stages each in a process group of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import interruptible

from r1kit.cli import main

ROOT = Path(__file__).parents[1]
TASK = {"source": "task:addition", "task": {"n": 32, "digits": 1}}
STAGES = [
    {"name": "sft", "kind": "sft", "format": "prompt_completion", "data": TASK,
     "trainer": {"max_steps": 4, "per_device_train_batch_size": 8, "learning_rate": 3.0e-3, "save_strategy": "no"}},
    {"name": "rl", "kind": "grpo", "template": "plain", "data": TASK, "rewards": [{"name": "format", "mode": "lenient"}],
     "trainer": {"max_steps": 2, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 8, "save_strategy": "no"}},
    {"name": "rs", "kind": "rejection", "template": "plain", "data": {**TASK, "task": {"n": 8, "digits": 1}},
     "rewards": [{"name": "format", "mode": "lenient"}], "samples": 2, "max_tokens": 8, "min_total": 0.0, "backend": "transformers"},
    {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "task": {"n": 8, "digits": 1}, "samples": 2, "max_tokens": 8,
     "template": "plain", "backend": "transformers"},
]

# Runs the pipeline in a process of its own and reports what that process holds afterwards.
PIPELINE = """
import gc, json, sys
from r1kit import pipeline
from r1kit.recipe import load_recipe
records = pipeline.run(load_recipe(sys.argv[1]))
gc.collect()
import torch
models = sum(isinstance(o, torch.nn.Module) and any(True for _ in o.parameters()) for o in gc.get_objects())
tensors = sum(isinstance(o, torch.Tensor) and o.numel() > 1000 for o in gc.get_objects())
print(json.dumps({"models": models, "tensors": tensors, "metrics": {name: r["metrics"] for name, r in records.items()}}))
"""


def _pipeline(recipe: Path, isolate: str) -> dict:
    env = {**os.environ, "R1KIT_STAGE_PROCESS": isolate, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PIPELINE, str(recipe)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _timeless(metrics: dict) -> dict:
    return {stage: {k: v for k, v in m.items() if "seconds" not in k} for stage, m in metrics.items()}


def test_stages_in_their_own_processes_give_the_same_records_and_leave_nothing_behind(write_recipe, tiny_model, tmp_path):
    own = _pipeline(write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "own"), "stages": STAGES}, "own.yaml"), "1")
    one = _pipeline(write_recipe({"model": str(tiny_model), "output_dir": str(tmp_path / "one"), "stages": STAGES}, "one.yaml"), "0")
    assert _timeless(own["metrics"]) == _timeless(one["metrics"])
    # Nothing with weights is left in the pipeline's process (in one process, a GRPO stage's
    # trainer, models and reward closures are all reachable until the garbage collector runs).
    assert own["models"] == 0 and own["tensors"] == 0
    for name in ("sft", "rl", "rs", "ev"):
        assert json.loads((tmp_path / "own" / name / "DONE.json").read_text())["model" if name in ("sft", "rl") else "dataset" if name == "rs" else "metrics"]


def test_errors_in_a_stage_process_are_one_line_or_name_the_stage(write_recipe, tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("R1KIT_STAGE_PROCESS", "1")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    bad = {**STAGES[1], "data": {"source": str(rows)}}  # no prompt column: found when the stage loads its data
    assert main(["run", str(write_recipe({"model": str(tiny_model), "stages": [bad]}))]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("r1kit: error: ") and "'prompt'" in err
    monkeypatch.setenv("R1KIT_STAGE_PROCESS", "maybe")
    assert main(["run", str(write_recipe({"model": str(tiny_model), "stages": [bad]}))]) == 2
    assert "R1KIT_STAGE_PROCESS='maybe': set 1" in capsys.readouterr().err


def test_a_crash_in_a_stage_process_names_the_stage(write_recipe, tiny_model, monkeypatch):
    from r1kit import pipeline
    from r1kit.recipe import load_recipe
    from r1kit.stage_process import StageProcessError

    monkeypatch.setenv("R1KIT_STAGE_PROCESS", "1")
    crash = {**STAGES[1], "rewards": [{"name": "test_stage_process:crash"}]}
    with pytest.raises(StageProcessError, match=r"rl: the stage's process failed \(exit status 3\)"):
        pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [crash]})))


def crash(completions, **columns):
    os._exit(3)  # the stage's process dies as a segfault or the OOM killer would end it


def test_a_killed_run_leaves_no_stage_running_and_resumes(write_recipe, tiny_model, tmp_path, hold, wait_gone, monkeypatch):
    sft = {**STAGES[0], "trainer": {**STAGES[0]["trainer"], "max_steps": 6, "save_strategy": "steps", "save_steps": 2}}
    path = write_recipe({"model": str(tiny_model), "stages": [sft]})
    env = {**hold.env(step=2, output_dir=tmp_path / "run" / "sft" / "checkpoints"), "R1KIT_STAGE_PROCESS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    held = hold.wait(proc)
    assert proc.pid not in held  # the stage holds in its own process
    os.kill(proc.pid, signal.SIGKILL)  # only the pipeline's process
    proc.wait()
    wait_gone(held)  # the stage's process ends with it
    assert (tmp_path / "run" / "sft" / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    monkeypatch.setenv("R1KIT_STAGE_PROCESS", "1")
    assert main(["run", str(path)]) == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6 and json.loads((tmp_path / "run" / "sft" / "DONE.json").read_text())["model"]


def test_ctrl_c_is_one_line_from_the_pipeline_and_none_from_the_stage(write_recipe, tiny_model, tmp_path, hold, wait_gone):
    """Issue 66, point 3: Ctrl-C printed the stage process's traceback ending in KeyboardInterrupt."""
    sft = {**STAGES[0], "trainer": {**STAGES[0]["trainer"], "max_steps": 6, "save_strategy": "steps", "save_steps": 2}}
    path = write_recipe({"model": str(tiny_model), "stages": [sft]})
    env = {**hold.env(step=2, output_dir=tmp_path / "run" / "sft" / "checkpoints"), "R1KIT_STAGE_PROCESS": "1"}
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(path)], env=env, stdout=log, stderr=log, start_new_session=True,
                                preexec_fn=interruptible)
        try:
            held = hold.wait(proc)
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: the whole foreground group
            assert proc.wait(120) == 130
        finally:  # a failed test leaves nothing running
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    wait_gone(held)
    said = (tmp_path / "run.log").read_text()
    assert said.rstrip().endswith("r1kit: interrupted; run the same command again to resume from what finished")
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said


def test_distributed_stages_each_get_a_process_group_of_their_own(write_recipe, tiny_model, tmp_path):
    stages = [STAGES[0], STAGES[1], STAGES[3]]
    path = write_recipe({"model": str(tiny_model), "stages": stages})
    env = {**os.environ, "R1KIT_STAGE_PROCESS": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "r1kit.cli", "run", str(path), "--accelerate-config", str(ROOT / "recipes/accelerate/cpu_ddp.yaml")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert log.count("sft: running") == 2 and log.count("rl: running") == 2 and log.count("ev: running") == 2
    assert "in its own process" in log
    assert json.loads((tmp_path / "run" / "ev" / "DONE.json").read_text())["metrics"]


def test_the_pipeline_processes_of_a_distributed_run_join_no_group_to_check_a_recipe(write_recipe, tiny_model):
    """Building the trainer configs for the recipe checks sets up accelerate's state; in the
    pipeline's own process of a distributed run it must join no process group (on a GPU it would
    be NCCL, with a CUDA context on the device the stages need): rank 0 of a world of two checks
    its recipe alone, without waiting for a rank 1 that never comes."""
    path = write_recipe({"model": str(tiny_model), "stages": STAGES[:2]})
    code = ("import torch.distributed as dist; from r1kit.recipe import load_recipe; "
            f"load_recipe({str(path)!r}); print('initialized', dist.is_initialized())")
    env = {**os.environ, "R1KIT_STAGE_PROCESS": "1", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "initialized False" in done.stdout
