"""The GPU check: every stage kind on the tiny model on one CUDA GPU in a few minutes, with a CPU
mode that the test suite runs so the script cannot rot.

    python bench/gpu_smoke.py                  # on a CUDA GPU: bf16 mixed precision
    python bench/gpu_smoke.py --cpu --steps 2  # anywhere (tests/test_gpu_smoke.py runs this)
    bash bench/gpu_smoke.sh WHEELS_DIR         # a bare GPU machine: install the wheels, then run

One recipe, run through r1kit.pipeline: ``cold_start`` (sft) → ``rl`` (grpo, transformers
generation) → ``rl_vllm`` (grpo with vLLM colocated; only with CUDA and vLLM) → ``rl_async``
(asynchronous GRPO, ``max_staleness: 1``: a grpo stage on r1kit's generator process in the CPU
mode; on GPUs an async_grpo stage, TRL's asynchronous trainer with its vLLM server on GPU 1, where
vLLM, the kernels package and a second GPU are there, else left out and said why) →
``rejection`` → ``sft`` → ``rl2`` (grpo, math_accuracy plus a tiny random reward model) → ``eval``
(transformers) → ``eval_vllm`` (only when vLLM imports), from the tiny model stored in bfloat16 as
hub checkpoints are. On a GPU the training stages run in bf16 mixed precision (``bf16: true``)
and every stage in its own process (r1kit.stage_process).

Per stage it reads from the run folder: wall time, tokens per second (training: TRL's
``num_tokens`` over the train runtime; eval: generated tokens over the stage's wall time), the
device's free memory as the stage started and the stage's peak (``gpu_free_at_start_mib``,
``gpu_peak_mib`` in its record), whether vLLM generated, the dtype of the trained weights and the
trainer's precision flags. Checks, each named, True or False: no CPU default was applied on a
GPU; master weights are float32 (from bfloat16 checkpoints) and compute is bf16 (GPU); each stage
finds the device as free as the first stage did (within 512 MiB: nothing of an earlier stage is
left); every logged loss is finite; two processes loading the reward model under ZeRO-3's and
FSDP's loading conditions (tests/rm_ranks.py) each get its real weights and score alike. The
GPU-only checks (the first, the bf16 compute and the free memory) say "n/a" in the CPU mode: there
they prove nothing. The figures go to ``gpu_smoke.json`` in ``$OUT`` when it is set, else in the
current folder (or ``--out``); the exit status is 1 when a check fails. What a GPU run must show
beyond these figures (a bf16 step that moves weights, vLLM's greedy samples equal to the
transformers backend's, ...) is held by the ``gpu``-marked tests, tests/test_gpu.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

LEFT_MIB = 512  # device memory a stage may find taken beyond what the first stage found
NA = "n/a"  # a GPU-only check's result on a CPU: neither passed nor failed


def bf16_copy(model: Path, out: Path) -> str:
    """The tiny model stored in bfloat16, as hub checkpoints are: the training stages must still
    train float32 master weights from it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return str(out)


def async_engine(gpu: bool, vllm: bool) -> tuple[str | None, str]:
    """Which engine the ``rl_async`` stage runs on here, and why (None: the stage is left out)."""
    if not gpu:
        return "r1kit", "r1kit's generator process (CPU)"
    import torch

    from r1kit.stages import async_grpo

    lacks = [what for what, missing in [("vllm", not vllm), ("a second GPU for the vLLM server", torch.cuda.device_count() < 2)]
             if missing]
    if lacks:
        return None, f"left out: TRL's asynchronous trainer needs {', '.join(lacks)}"
    if kernel := async_grpo.flash_attention_problems("rl_async.kind"):  # the stage's own check: kernels, the GPU, FlashAttention-3
        return None, f"left out: {kernel[0]}"
    return "trl", "TRL's AsyncGRPOTrainer, its vLLM server on GPU 1"


def recipe(work: Path, model: str, rm: str, steps: int, gpu: bool, vllm: bool, engine: str | None = None) -> dict:
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
    if engine == "r1kit":
        stages.append({"name": "rl_async", **rl, "max_staleness": 1})
    elif engine == "trl":
        stages.append({"name": "rl_async", **rl, "kind": "async_grpo", "trainer": {**grpo, "max_staleness": 1}, "server_gpus": [1],
                       "server_options": {"gpu_memory_utilization": 0.3, "max_model_len": 512}})
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


def figures(run: Path, records: dict) -> dict:
    """Per stage, from what the run wrote: wall time, tokens/s, GPU memory (free at the start,
    peak), whether vLLM generated, the trained weights' dtype and the trainer's precision
    flags, and whether every logged loss is finite."""
    out = {}
    for name, record in records.items():
        stage, metrics = record["config"]["stage"], record["metrics"]
        lines = (run / name / "metrics.jsonl").read_text().splitlines() if (run / name / "metrics.jsonl").exists() else []
        logged = [json.loads(line) for line in lines]
        losses = [m["loss"] for m in logged if "loss" in m]
        tokens = max((m["num_tokens"] for m in logged if "num_tokens" in m), default=None)
        runtime = next((m["train_runtime"] for m in logged if "train_runtime" in m), None)
        if stage["kind"] == "eval":
            summaries = [json.loads(p.read_text()) for p in (run / name).glob("*/summary.json")]
            tokens = sum(s["mean_tokens"] * s["samples"] * s["problems"] for s in summaries)
            runtime = record["wall_s"]
        fig = {
            "kind": stage["kind"],
            "wall_s": record["wall_s"],
            "tokens_per_s": round(tokens / runtime, 1) if tokens and runtime else None,
            "gpu_free_at_start_mib": metrics.get("gpu_free_at_start_mib"),
            "gpu_peak_mib": metrics.get("gpu_peak_mib"),
            "vllm": bool((stage.get("trainer") or {}).get("use_vllm")) or stage.get("backend") == "vllm",
            "losses_finite": all(math.isfinite(x) for x in losses),
        }
        config = run / name / "trainer_config.json"
        if config.exists():
            given = json.loads(config.read_text())
            fig |= {"trained_dtype": metrics.get("trained_dtype"), "bf16": bool(given["bf16"]), "use_cpu": bool(given["use_cpu"])}
        out[name] = fig
    return out


def sharded_reward_model(rm: str, work: Path) -> dict[str, bool]:
    """Two processes load the reward model under the loading conditions of ZeRO-3 and of FSDP
    with rank-0 loading (tests/rm_ranks.py, on the GPU when there is one): True where both got
    real weights and the same scores."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from rm_ranks import launch

    out = {}
    for condition in ("fsdp", "zero3"):
        folder = work / f"rm_{condition}"
        folder.mkdir()
        done, ranks = launch(rm, folder, condition)
        if ranks is None:
            print(done.stderr[-2000:], file=sys.stderr)
            out[condition] = False
            continue
        same = all(abs(a - b) < 1e-3 for a, b in zip(ranks[0]["scores"], ranks[1]["scores"]))
        out[condition] = ranks[0]["weights"] > 0 and abs(ranks[0]["weights"] - ranks[1]["weights"]) < 1e-3 * ranks[0]["weights"] and same
    return out


def checks(stages: dict, gpu: bool, sharded: dict[str, bool]) -> dict[str, bool | str]:
    """Each check's result: True, False, or NA for a GPU-only check on a CPU, where it could not fail."""
    training = [s for s in stages.values() if "trained_dtype" in s]
    free = [s["gpu_free_at_start_mib"] for s in stages.values()]
    return {
        "no_cpu_defaults_on_gpu": all(not s["use_cpu"] for s in training) if gpu else NA,
        "master_weights_float32": bool(training) and all(s["trained_dtype"] == "float32" for s in training),
        "bf16_compute_on_gpu": all(s["bf16"] for s in training) if gpu else NA,
        # every stage finds the device as free as the first one did: nothing of an earlier stage is left
        "memory_free_at_each_stage_start": all(f is not None and f >= free[0] - LEFT_MIB for f in free) if gpu else NA,
        "losses_finite": all(s["losses_finite"] for s in stages.values()),
        "reward_model_whole_under_fsdp": sharded["fsdp"],
        "reward_model_whole_under_zero3": sharded["zero3"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="CPU mode (no bf16, no vLLM): what the test suite runs")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per GRPO stage")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), help="folder for gpu_smoke.json")
    p.add_argument("--work", type=Path, help="run folder (default: a new temporary folder)")
    args = p.parse_args()

    import tempfile

    import torch

    from r1kit import hardware, pipeline, stage_process
    from r1kit.recipe import load_recipe
    from r1kit.offline.tiny import build_tiny_model, build_tiny_reward_model
    from r1kit.sampling import vllm_available

    gpu = hardware.has_gpu() and not args.cpu
    if not gpu and not args.cpu:
        raise SystemExit("no CUDA GPU here; run with --cpu for the CPU mode")
    vllm = gpu and vllm_available()  # a vLLM that imports, not one merely found
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    model = bf16_copy(build_tiny_model(work / "tiny", seed=0), work / "tiny_bf16")
    rm = str(build_tiny_reward_model(model, work / "rm"))
    path = work / "recipe.json"
    engine, engine_why = async_engine(gpu, vllm)
    path.write_text(json.dumps(recipe(work, model, rm, args.steps, gpu, vllm, engine)))
    start = time.perf_counter()
    records = pipeline.run(load_recipe(path))
    stages = figures(work / "run", records)
    result_checks = checks(stages, gpu, sharded_reward_model(rm, work))
    result = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch.__version__,
        "vllm": vllm,
        "rl_async": engine_why,
        "total_s": round(time.perf_counter() - start, 1),
        "stage_processes": stage_process.enabled(),
        "stages": stages,
        "checks": result_checks,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_smoke.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'stage':<12}{'kind':<11}{'wall s':>8}{'tokens/s':>10}{'free at start MiB':>19}{'peak GPU MiB':>14}  vLLM")
    for name, s in stages.items():
        free = "-" if s["gpu_free_at_start_mib"] is None else f"{s['gpu_free_at_start_mib']:.0f}"
        peak = "-" if s["gpu_peak_mib"] is None else f"{s['gpu_peak_mib']:.0f}"
        print(f"{name:<12}{s['kind']:<11}{s['wall_s']:>8.1f}{s['tokens_per_s'] or '-':>10}{free:>19}{peak:>14}  {'yes' if s['vllm'] else 'no'}")
    print(f"rl_async: {engine_why}")
    print("checks: " + ", ".join(f"{k} {'ok' if v is True else 'FAILED' if v is False else v}" for k, v in result_checks.items()))
    print(f"figures: {args.out / 'gpu_smoke.json'}")
    return 1 if False in result_checks.values() else 0


if __name__ == "__main__":
    raise SystemExit(main())
