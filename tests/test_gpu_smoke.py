"""bench/gpu_smoke.py, the prepared GPU check, in its CPU mode: every stage kind runs (asynchronous
GRPO on r1kit's generator among them) and its figures and checks land in gpu_smoke.json; a
non-finite loss fails the check; the GPU-only checks say "n/a" here, where they could not fail;
the asynchronous step says why it is left out on a GPU machine that cannot run TRL's
asynchronous trainer. What a GPU run must show is in tests/test_gpu.py (``pytest -m gpu``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "bench" / "gpu_smoke.py"
GPU_ONLY = {"no_cpu_defaults_on_gpu", "bf16_compute_on_gpu", "memory_free_at_each_stage_start"}


def test_the_gpu_check_runs_every_stage_in_cpu_mode(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--steps", "2", "--out", str(tmp_path), "--work", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_smoke.json").read_text())
    assert result["device"] == "cpu" and result["vllm"] is False
    stages = result["stages"]
    assert list(stages) == ["cold_start", "rl", "rl_async", "rejection", "sft", "rl2", "eval"]
    assert {s["kind"] for s in stages.values()} == {"sft", "grpo", "rejection", "eval"}
    for name in ("cold_start", "rl", "rl_async", "sft", "rl2", "eval"):
        assert stages[name]["tokens_per_s"] > 0, name
    assert result["rl_async"] == "r1kit's generator process (CPU)" and "rl_async: r1kit's generator process" in proc.stdout
    for name in ("cold_start", "rl", "rl_async", "sft", "rl2"):
        assert stages[name]["trained_dtype"] == "float32" and stages[name]["use_cpu"] is True  # from a bf16 checkpoint
    assert result["checks"] == {**{name: "n/a" for name in GPU_ONLY}, "master_weights_float32": True, "losses_finite": True,
                                "reward_model_whole_under_fsdp": True, "reward_model_whole_under_zero3": True}, result["checks"]
    assert "checks: no_cpu_defaults_on_gpu n/a, master_weights_float32 ok" in proc.stdout


def test_gpu_only_checks_say_n_a_on_a_cpu_and_can_fail_on_a_gpu():
    """On a CPU the GPU-only checks are neither passed nor failed; the same stages fail them on a GPU."""
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    cpu_stage = {"kind": "grpo", "losses_finite": True, "trained_dtype": "float32", "bf16": False, "use_cpu": True,
                 "gpu_free_at_start_mib": None}
    stages, sharded = {"rl": cpu_stage}, {"fsdp": True, "zero3": True}
    on_cpu, on_gpu = smoke.checks(stages, gpu=False, sharded=sharded), smoke.checks(stages, gpu=True, sharded=sharded)
    assert {name for name, result in on_cpu.items() if result == "n/a"} == GPU_ONLY
    assert {name for name, result in on_gpu.items() if result is False} == GPU_ONLY
    assert all(on_cpu[name] is True and on_gpu[name] is True for name in on_cpu if name not in GPU_ONLY)


def test_a_non_finite_loss_fails_the_check(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    (tmp_path / "rl").mkdir()
    rows = [{"step": 1, "loss": 0.5, "num_tokens": 100.0}, {"step": 2, "loss": float("nan")}, {"step": 2, "train_runtime": 2.0}]
    (tmp_path / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = {"rl": {"config": {"stage": {"kind": "grpo", "trainer": {}}}, "metrics": {}, "wall_s": 3.0}}
    got = smoke.figures(tmp_path, records)
    assert got["rl"]["losses_finite"] is False and got["rl"]["tokens_per_s"] == 50.0
    assert smoke.checks(got, gpu=False, sharded={"fsdp": True, "zero3": True})["losses_finite"] is False


def test_memory_left_by_an_earlier_stage_fails_the_check():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    stage = {"kind": "eval", "losses_finite": True}
    clean = {"a": {**stage, "gpu_free_at_start_mib": 140_000}, "b": {**stage, "gpu_free_at_start_mib": 139_800}}
    left = {"a": {**stage, "gpu_free_at_start_mib": 140_000}, "b": {**stage, "gpu_free_at_start_mib": 120_000}}
    assert smoke.checks(clean, gpu=True, sharded={"fsdp": True, "zero3": True})["memory_free_at_each_stage_start"] is True
    assert smoke.checks(left, gpu=True, sharded={"fsdp": True, "zero3": True})["memory_free_at_each_stage_start"] is False


def test_the_async_step_says_why_a_gpu_machine_leaves_it_out(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    engine, why = smoke.async_engine(gpu=True, vllm=False)
    assert engine is None and why.startswith("left out: TRL's asynchronous trainer needs vllm") and why.endswith("a second GPU for the vLLM server")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    from r1kit.stages import async_grpo

    monkeypatch.setattr(async_grpo, "flash_attention_problems", lambda where: [f"{where}: FlashAttention-3 does not load here"])
    assert smoke.async_engine(gpu=True, vllm=True) == (None, "left out: rl_async.kind: FlashAttention-3 does not load here")
    monkeypatch.setattr(async_grpo, "flash_attention_problems", lambda where: [])
    assert smoke.async_engine(gpu=True, vllm=True)[0] == "trl"
    monkeypatch.undo()
    recipe = smoke.recipe(tmp_path, "tiny", "tiny", 2, gpu=True, vllm=True, engine="trl")
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    from r1kit.recipe import load_recipe

    stage = {s.name: s for s in load_recipe(tmp_path / "recipe.json").stages}["rl_async"]  # a valid recipe
    assert (stage.kind, stage.server_gpus, stage.trainer["max_staleness"]) == ("async_grpo", [1], 1)
