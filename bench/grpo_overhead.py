"""What r1kit's `grpo` stage costs over a bare `trl.GRPOTrainer` script.

    python bench/grpo_overhead.py [--steps 30] [--rounds 2]

Both sides train the same offline tiny model on the same one-digit addition prompts with the same
GRPOConfig and the same math_accuracy reward function; r1kit's side runs a recipe through
`r1kit run` (registry rewards, templates, metrics log, markers), the bare side calls TRL directly.
Each run is its own process and the sides alternate, so each round's two runs share the
machine's conditions. Figures: seconds per training step (TRL's own train_runtime / steps, so
start-up is excluded) and the process's peak resident memory; the ratio line is the median of the
rounds' r1kit/TRL ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from r1kit.hardware.precision import describe_cpu

TRAINER = {
    "per_device_train_batch_size": 16,
    "num_generations": 8,
    "max_completion_length": 32,
    "learning_rate": 5.0e-4,
    "loss_type": "grpo",
    "beta": 0.001,
    "logging_steps": 1,
    "save_strategy": "no",
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "gradient_checkpointing": False,
    "dataloader_num_workers": 0,
    "seed": 42,
}


def bare(model: str, out: str, steps: int) -> None:
    """The bare TRL script: what a user would write without r1kit."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from r1kit.offline.tasks import addition
    from r1kit.rewards.math import math_accuracy

    def accuracy(prompts, completions, answer, **kwargs):
        return math_accuracy(completions, answer=answer)

    rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in addition(n=80, digits=1, seed=42)]
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        reward_funcs=[accuracy],
        args=GRPOConfig(output_dir=out, max_steps=steps, **TRAINER),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    result = trainer.train()
    Path(out, "runtime.json").write_text(json.dumps({"train_runtime": result.metrics["train_runtime"]}))


def r1kit_side(model: str, out: str, steps: int) -> list[str]:
    recipe = {
        "model": model,
        "output_dir": out,
        "seed": 42,
        "stages": [
            {
                "name": "rl",
                "kind": "grpo",
                "template": "plain",
                "data": {"source": "task:addition", "task": {"n": 80, "digits": 1}},
                "rewards": [{"name": "math_accuracy"}],
                "trainer": {**TRAINER, "max_steps": steps},
            }
        ],
    }
    path = Path(out + ".yaml")
    path.write_text(json.dumps(recipe))
    return [sys.executable, "-m", "r1kit.cli", "run", str(path)]


def measure(cmd: list[str], runtime_file: Path) -> tuple[float, float]:
    """(train_runtime seconds, peak RSS MiB) of one run in a child process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{proc.stderr.read()[-3000:]}")
    if runtime_file.suffix == ".jsonl":
        runtime = next(r["train_runtime"] for r in map(json.loads, runtime_file.read_text().splitlines()) if "train_runtime" in r)
    else:
        runtime = json.loads(runtime_file.read_text())["train_runtime"]
    return runtime, usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bare", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU
    if args.bare:
        return bare(args.bare[0], args.bare[1], args.steps)

    from r1kit.offline.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="grpo_overhead_"))
    model = str(build_tiny_model(work / "model", seed=0))
    results: dict[str, list[tuple[float, float]]] = {"trl": [], "r1kit": []}
    for i in range(args.rounds):
        out = str(work / f"trl{i}")
        results["trl"].append(measure([sys.executable, __file__, "--steps", str(args.steps), "--bare", model, out], Path(out, "runtime.json")))
        out = str(work / f"r1kit{i}")
        results["r1kit"].append(measure(r1kit_side(model, out, args.steps), Path(out, "rl", "metrics.jsonl")))
        print(f"round {i + 1}: trl {results['trl'][-1][0] / args.steps:.3f} s/step, r1kit {results['r1kit'][-1][0] / args.steps:.3f} s/step", flush=True)
    step = {k: statistics.median(r[0] for r in v) / args.steps for k, v in results.items()}
    rss = {k: max(r[1] for r in v) for k, v in results.items()}
    ratio = statistics.median(b[0] / a[0] for a, b in zip(results["trl"], results["r1kit"]))
    print(f"{'side':<8}{'s/step':>10}{'peak RSS MiB':>15}")
    for k in ("trl", "r1kit"):
        print(f"{k:<8}{step[k]:>10.3f}{rss[k]:>15.0f}")
    print(
        f"ratio: r1kit / bare TRL per-step time = {ratio:.3f} (target <= 1.05); "
        f"peak memory {rss['r1kit'] / rss['trl']:.3f}x ({args.steps} steps, median of {args.rounds} paired rounds)"
    )


if __name__ == "__main__":
    main()
