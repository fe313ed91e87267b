"""bench/gpu_smoke.py, the prepared GPU check, in its CPU mode: every stage kind runs and its
figures and checks land in gpu_smoke.json; a non-finite loss fails the check."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "bench" / "gpu_smoke.py"


def test_the_gpu_check_runs_every_stage_in_cpu_mode(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--steps", "2", "--out", str(tmp_path), "--work", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_smoke.json").read_text())
    assert result["device"] == "cpu" and result["vllm"] is False
    stages = result["stages"]
    assert list(stages) == ["cold_start", "rl", "rejection", "sft", "rl2", "eval"]
    assert {s["kind"] for s in stages.values()} == {"sft", "grpo", "rejection", "eval"}
    for name in ("cold_start", "rl", "sft", "rl2", "eval"):
        assert stages[name]["tokens_per_s"] > 0, name
    for name in ("cold_start", "rl", "sft", "rl2"):
        assert stages[name]["master_dtype"] == "float32" and stages[name]["use_cpu"] is True
    assert all(result["checks"].values()), result["checks"]
    assert "checks: no_cpu_defaults_on_gpu ok" in proc.stdout


def test_a_non_finite_loss_fails_the_check(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    probe = smoke.Probe(gpu=False)
    probe.stages["rl"] = {"kind": "grpo", "wall_s": 1.0, "peak_gpu_mib": None, "allocated_at_start_mib": 0.0, "vllm": False}
    (tmp_path / "rl").mkdir()
    rows = [{"step": 1, "loss": 0.5, "num_tokens": 100.0}, {"step": 2, "loss": float("nan")}, {"step": 2, "train_runtime": 2.0}]
    (tmp_path / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = smoke.figures(tmp_path, probe, {})["rl"]
    assert got["losses_finite"] is False and got["tokens_per_s"] == 50.0
