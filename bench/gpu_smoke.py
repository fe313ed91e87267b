"""The GPU check: every stage kind on the tiny model on one CUDA GPU in a few minutes, with a CPU
mode that the test suite runs so the script cannot rot.

    python bench/gpu_smoke.py                  # on a CUDA GPU: bf16 mixed precision
    python bench/gpu_smoke.py --cpu --steps 2  # anywhere (tests/test_gpu_smoke.py runs this)
    bash bench/gpu_smoke.sh WHEELS_DIR         # a bare GPU machine: install the wheels, then run

One recipe, run through r1kit.pipeline in this process: ``cold_start`` (sft) → ``rl`` (grpo,
transformers generation) → ``rl_vllm`` (grpo with vLLM colocated; only with CUDA and vLLM) →
``rejection`` → ``sft`` → ``rl2`` (grpo, math_accuracy plus a tiny random reward model) →
``eval`` (transformers) → ``eval_vllm`` (only when vLLM imports). On a GPU the training stages
run in bf16 mixed precision (``bf16: true``; the master weights stay float32).

Per stage it records wall time, tokens per second (training: TRL's ``num_tokens`` over the train
runtime; eval: generated tokens over the stage's wall time), peak GPU memory
(``torch.cuda.max_memory_allocated``, reset at the stage's start), the memory still allocated
when the stage starts, and whether it used vLLM. Checks, each a named boolean: no CPU default
was applied on a GPU; master weights are float32 and compute is bf16 (GPU); each stage starts
with the device's memory free (under 64 MiB allocated); every logged loss is finite. The figures
go to ``gpu_smoke.json`` in ``$OUT`` when it is set, else in the current folder (or ``--out``);
the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import time
from pathlib import Path

FREE_MIB = 64


def recipe(work: Path, model: str, rm: str, steps: int, gpu: bool, vllm: bool) -> dict:
    precision = {"bf16": True} if gpu else {}
    train = {"per_device_train_batch_size": 16, "logging_steps": 1, "save_strategy": "no", **precision}
    grpo = {**train, "max_steps": steps, "num_generations": 8, "max_completion_length": 32, "learning_rate": 5.0e-4}
    task = {"source": "task:addition", "task": {"n": 64, "digits": 1}}
    rl = {"kind": "grpo", "template": "plain", "data": task, "rewards": [{"name": "math_accuracy"}], "trainer": grpo}
    stages = [
        {"name": "cold_start", "kind": "sft", "format": "prompt_completion", "data": task,
         "trainer": {**train, "max_steps": 4 * steps, "learning_rate": 5.0e-3}},
        {"name": "rl", **rl},
    ]
    if vllm:
        stages.append({"name": "rl_vllm", **rl, "trainer": {**grpo, "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}})
    stages += [
        {"name": "rejection", "kind": "rejection", "template": "plain", "data": task, "samples": 4, "max_tokens": 32,
         "rewards": [{"name": "math_accuracy"}], "min_total": 0.0, "backend": "transformers"},  # keeps rows whatever the tiny model knows
        {"name": "sft", "kind": "sft", "data": {"source": "rejection"}, "trainer": {**train, "max_steps": steps}},
        {"name": "rl2", **rl, "rewards": [{"name": "math_accuracy"}, {"name": "reward_model", "model": rm, "weight": 0.1}]},
        {"name": "eval", "kind": "eval", "benchmarks": ["task:addition"], "task": {"n": 16, "digits": 1}, "samples": 2,
         "max_tokens": 32, "template": "plain", "backend": "transformers"},
    ]
    if vllm:
        stages.append({**stages[-1], "name": "eval_vllm", "backend": "vllm", "backend_options": {"gpu_memory_utilization": 0.3}})
    return {"model": model, "output_dir": str(work / "run"), "seed": 0, "stages": stages}


class Probe:
    """Wraps each stage kind's run and each training stage's train_and_save to record figures."""

    def __init__(self, gpu: bool):
        self.gpu, self.stages, self.training = gpu, {}, {}

    def install(self) -> None:
        from r1kit import stages as registry

        for kind in registry.kinds():
            module = importlib.import_module(f"r1kit.stages.{'evaluate' if kind == 'eval' else kind}")
            module.STAGE = dataclasses.replace(module.STAGE, run=self._timed(module.STAGE.run))
            if hasattr(module, "train_and_save"):
                module.train_and_save = self._training(module.train_and_save)

    def _timed(self, run):
        import torch

        def timed(ctx):
            if self.gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            at_start = torch.cuda.memory_allocated() / 2**20 if self.gpu else 0.0
            start = time.perf_counter()
            result = run(ctx)
            if self.gpu:
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            self.stages[ctx.stage.name] = {
                "kind": ctx.stage.kind,
                "wall_s": round(wall, 2),
                "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if self.gpu else None,
                "allocated_at_start_mib": round(at_start, 1),
                "vllm": bool((getattr(ctx.stage, "trainer", None) or {}).get("use_vllm")) or getattr(ctx.stage, "backend", None) == "vllm",
            }
            import gc

            gc.collect()
            if self.gpu:
                torch.cuda.empty_cache()
            return result

        return timed

    def _training(self, train_and_save):
        def probed(trainer, ctx):
            params = [p for p in trainer.model.parameters() if p.requires_grad]
            self.training[ctx.stage.name] = {
                "master_dtype": str(params[0].dtype).removeprefix("torch."),
                "bf16": bool(trainer.args.bf16),
                "use_cpu": bool(trainer.args.use_cpu),
            }
            return train_and_save(trainer, ctx)

        return probed


def figures(run: Path, probe: Probe, records: dict) -> dict:
    """Per stage: the probe's figures, tokens/s and whether every logged loss is finite."""
    out = {}
    for name, fig in probe.stages.items():
        metrics = [json.loads(line) for line in (run / name / "metrics.jsonl").read_text().splitlines()] if (run / name / "metrics.jsonl").exists() else []
        losses = [m["loss"] for m in metrics if "loss" in m]
        tokens, runtime = None, None
        if metrics:
            tokens = max((m["num_tokens"] for m in metrics if "num_tokens" in m), default=None)
            runtime = next((m["train_runtime"] for m in metrics if "train_runtime" in m), None)
        if fig["kind"] == "eval":
            summaries = [json.loads(p.read_text()) for p in (run / name).glob("*/summary.json")]
            tokens = sum(s["mean_tokens"] * s["samples"] * s["problems"] for s in summaries)
            runtime = fig["wall_s"]
        out[name] = {
            **fig,
            "tokens_per_s": round(tokens / runtime, 1) if tokens and runtime else None,
            "losses_finite": all(math.isfinite(x) for x in losses),
            **probe.training.get(name, {}),
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="CPU mode (no bf16, no vLLM): what the test suite runs")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per GRPO stage")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), help="folder for gpu_smoke.json")
    p.add_argument("--work", type=Path, help="run folder (default: a new temporary folder)")
    args = p.parse_args()

    import tempfile

    import torch

    from r1kit import pipeline
    from r1kit.recipe import load_recipe
    from r1kit.tiny import build_tiny_model, build_tiny_reward_model

    gpu = torch.cuda.is_available() and not args.cpu
    if not gpu and not args.cpu:
        raise SystemExit("no CUDA GPU here; run with --cpu for the CPU mode")
    vllm = gpu and importlib.util.find_spec("vllm") is not None
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    model = str(build_tiny_model(work / "tiny", seed=0))
    rm = str(build_tiny_reward_model(model, work / "rm"))
    path = work / "recipe.json"
    path.write_text(json.dumps(recipe(work, model, rm, args.steps, gpu, vllm)))
    probe = Probe(gpu)
    probe.install()
    start = time.perf_counter()
    records = pipeline.run(load_recipe(path))
    stages = figures(work / "run", probe, records)
    training = [s for s in stages.values() if "master_dtype" in s]
    checks = {
        "no_cpu_defaults_on_gpu": not gpu or all(not s["use_cpu"] for s in training),
        "master_weights_float32": all(s["master_dtype"] == "float32" for s in training),
        "bf16_compute_on_gpu": not gpu or all(s["bf16"] for s in training),
        "memory_free_at_each_stage_start": all(s["allocated_at_start_mib"] < FREE_MIB for s in stages.values()),
        "losses_finite": all(s["losses_finite"] for s in stages.values()),
    }
    result = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch.__version__,
        "vllm": vllm,
        "total_s": round(time.perf_counter() - start, 1),
        "stages": stages,
        "checks": checks,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_smoke.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'stage':<12}{'kind':<11}{'wall s':>8}{'tokens/s':>10}{'peak GPU MiB':>14}  vLLM")
    for name, s in stages.items():
        peak = "-" if s["peak_gpu_mib"] is None else f"{s['peak_gpu_mib']:.0f}"
        print(f"{name:<12}{s['kind']:<11}{s['wall_s']:>8.1f}{s['tokens_per_s'] or '-':>10}{peak:>14}  {'yes' if s['vllm'] else 'no'}")
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()))
    print(f"figures: {args.out / 'gpu_smoke.json'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
