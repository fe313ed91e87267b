"""Seconds per GRPO step: r1kit's grpo stage against a bare `trl.GRPOTrainer`, side by side in one run.

    python bench/grpo_step.py --model FOLDER                # e.g. SmolLM2-135M-Instruct, converted
    python bench/grpo_step.py                               # the offline tiny model
    python bench/grpo_step.py --model FOLDER --steps 6 --r1kit-trainer '{"bf16": true}'
    python bench/grpo_step.py --model FOLDER --share-prompts       # the stage's share_prompts: true
    python bench/grpo_step.py --model FOLDER --bare-trainer '{"beta": 0.001}'   # bare TRL with r1kit's KL term too
    python bench/grpo_step.py --model FOLDER --r1kit-only --steps 300 --max-tokens 24 --r1kit-trainer '{"beta": 0}'

Both sides train the same model on the same prompts (two-digit additions, r1kit.offline.tasks, in
SmolLM2's chat format) with the same batch, generations, completion length, temperature,
learning rate and reward (``math_accuracy`` with the last-number fallback), for --steps optimizer
steps each:

- **bare TRL**: ``GRPOConfig`` with TRL's defaults and only ``use_cpu``: ``bf16: true`` (on a
  CPU, bfloat16 autocast around each forward pass, generation included), gradient checkpointing,
  no reference model, the DAPO token-level loss;
- **r1kit**: a one-stage recipe run by r1kit's pipeline, with its CPU and paper defaults
  (bfloat16 autocast where r1kit.hardware.precision picks it, rollouts from r1kit's decoding loop inside
  one autocast region, its linear layers packed by r1kit.hardware.cpu, else float32; TRL's
  log-probabilities through r1kit.hardware.cpu's whole-vocabulary products; short attention in SDPA's math
  kernel; the allocator keeping freed memory; no gradient checkpointing; ``beta: 0.001`` with a
  reference model; the sequence-level GRPO loss; at ``beta: 0``, no forward or backward pass for
  zero-advantage completions), plus --r1kit-trainer fields.

--bare-trainer adds ``GRPOConfig`` fields to the bare side: ``'{"beta": 0.001}'`` has it compute
the reference model's KL term as r1kit's side does by default, so that both do the same work.

Bare TRL runs first: the allocator setting `r1kit run` makes (here, before r1kit's side) is
process-wide and would otherwise speed up the bare side too.

Each step is split into phases by timing TRL's own methods: generation (``_generate``), rewards
(``_calculate_rewards``), the rest of scoring (reference and old log-probabilities, advantages),
and forward/backward (``training_step`` without generation and scoring); "other" is the optimizer
step and the trainer's bookkeeping. The first step (warm-up) is left out of the means. Prints a
line per side, with the share of groups whose rewards were all equal (TRL's
``frac_reward_zero_std``) and of completions r1kit left out of the forward and backward pass
(r1kit.trainers.zero_advantage, at ``beta: 0``), and the ratio of their mean step times. The two sides
draw their own completions, so their shares differ, and with two groups a step they move the
forward/backward time from step to step.

Each side's line also gives the process's resident memory after steps 10, 100 and the last;
the r1kit side's includes what the bare side left behind unless --r1kit-only runs it alone (a long
run at the smollm2 recipe's settings, as above, shows whether memory keeps growing).

Both sides run on the CPU (``use_cpu``) and in this process, also on a machine with a GPU.

Not measured: model loading, checkpoint saving, evaluation, peak memory within a step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from r1kit.hardware.precision import describe_cpu

PROMPT = "<|im_start|>user\n{prompt} Answer with the number only.<|im_end|>\n<|im_start|>assistant\n"
PHASES = ("generation", "rewards", "scoring", "forward_backward", "other")


class Phases:
    """Seconds spent in TRL's generation, reward, scoring and training methods, per optimizer step."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self.logged: list[dict[str, float]] = []  # each step's logged share of zero-spread groups and skipped completions
        self.now = dict.fromkeys(("generate", "rewards", "prepare", "train"), 0.0)
        self.started = 0.0

    @contextlib.contextmanager
    def patched(self):
        import trl

        cls = trl.GRPOTrainer
        names = {"_generate": "generate", "_calculate_rewards": "rewards", "_prepare_inputs": "prepare", "training_step": "train"}
        originals = {name: getattr(cls, name) for name in names}

        def timed(name, key):
            def call(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return originals[name](*args, **kwargs)
                finally:
                    self.now[key] += time.perf_counter() - t0
            return call

        for name, key in names.items():
            setattr(cls, name, timed(name, key))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(cls, name, fn)

    def callback(self):
        from transformers import TrainerCallback

        phases = self

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                phases.now = dict.fromkeys(phases.now, 0.0)
                phases.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                n, total = phases.now, time.perf_counter() - phases.started
                phases.steps.append({
                    "generation": n["generate"],
                    "rewards": n["rewards"],
                    "scoring": n["prepare"] - n["generate"] - n["rewards"],
                    "forward_backward": n["train"] - n["prepare"],
                    "other": total - n["train"],
                    "total": total,
                    "resident_gib": resident_gib(),
                })

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "frac_reward_zero_std" in logs:
                    phases.logged.append({"zero_std": logs["frac_reward_zero_std"], "skipped": logs.get("zero_advantage/skipped", 0.0)})

        return StepClock()

    def summary(self) -> dict[str, float]:
        if not self.steps:
            raise RuntimeError("no optimizer step was timed (did the trainer run in another process?)")
        timed = self.steps[1:] or self.steps  # the first step warms up
        logged = self.logged[1:] or self.logged or [{"zero_std": float("nan"), "skipped": float("nan")}]
        by_share: dict[float, list[float]] = {}  # forward/backward seconds by the step's share of groups without spread
        for step, log in zip(timed, logged):
            by_share.setdefault(round(log["zero_std"], 2), []).append(step["forward_backward"])
        resident = {i + 1: s["resident_gib"] for i, s in enumerate(self.steps) if i + 1 in (10, 100) or i + 1 == len(self.steps)}
        return ({k: statistics.mean(s[k] for s in timed) for k in (*PHASES, "total")} | {"resident": resident}
                | {k: statistics.mean(s[k] for s in logged) for k in ("zero_std", "skipped")}
                | {"by_share": {share: by_share[share] for share in sorted(by_share)}})


def bare_trl(model: str, rows, shared: dict, extra: dict, steps: int, out: Path, phases: Phases) -> None:
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from r1kit import reward_registry

    reward = reward_registry.for_trl(reward_registry.from_recipe([{"name": "math_accuracy", "fallback": "last_number"}], "bench")[0])
    args = GRPOConfig(output_dir=str(out), use_cpu=True, max_steps=steps, save_strategy="no", report_to="none", seed=0, **shared, **extra)
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=rows, processing_class=tokenizer)
    trainer.add_callback(phases.callback())
    trainer.train()


def r1kit_stage(model: str, shared: dict, extra: dict, steps: int, out: Path, phases: Phases, share_prompts: bool = False) -> None:
    from r1kit import pipeline
    from r1kit.hardware import cpu
    from r1kit.recipe import load_recipe

    cpu.keep_freed_memory()  # as `r1kit run` does at its start
    recipe = {
        "model": model,
        "output_dir": str(out),
        "seed": 0,
        "stages": [{
            "name": "rl",
            "kind": "grpo",
            "template": PROMPT,
            "data": {"source": "task:addition", "task": {"n": 2000, "digits": 2}},
            "rewards": [{"name": "math_accuracy", "weight": 1.0, "fallback": "last_number"}],
            "share_prompts": share_prompts,
            "trainer": {**shared, "use_cpu": True, **extra, "max_steps": steps, "save_strategy": "no"},
        }],
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.json"
    path.write_text(json.dumps(recipe))
    import trl

    # The pipeline builds its own trainer: hand it the step clock through TRL's constructor.
    init = trl.GRPOTrainer.__init__

    def with_clock(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), phases.callback()]
        init(self, *args, **kwargs)

    trl.GRPOTrainer.__init__ = with_clock
    try:
        pipeline.run(load_recipe(path))
    finally:
        trl.GRPOTrainer.__init__ = init


def resident_gib() -> float:
    """The process's resident memory in GiB (Linux; NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError):
        return float("nan")


def line(name: str, s: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {s[k]:.2f}" for k in PHASES)
    shares = ", ".join(f"{share:.2f}: {statistics.mean(t):.2f} s ({len(t)} steps)" for share, t in s["by_share"].items())
    return (f"{name:9s}: {s['total']:6.2f} s/step  ({parts}; groups without reward spread {s['zero_std']:.2f}, completions skipped {s['skipped']:.2f})\n"
            f"{'':11s}forward/backward by the step's share of groups without spread: {shares}\n"
            f"{'':11s}resident memory after step " + ", ".join(f"{step}: {gib:.2f} GiB" for step, gib in s["resident"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: r1kit's offline tiny model)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per side; the first is a warm-up")
    parser.add_argument("--batch", type=int, default=16, help="per_device_train_batch_size (completions per step)")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32, help="max_completion_length")
    parser.add_argument("--share-prompts", action="store_true", help="r1kit's side scores each prompt once (the stage's share_prompts)")
    parser.add_argument("--r1kit-trainer", type=json.loads, default={}, help="extra trainer fields for r1kit's side, as JSON")
    parser.add_argument("--r1kit-only", action="store_true", help="r1kit's side alone (its resident memory without the bare side's)")
    parser.add_argument("--bare-trainer", type=json.loads, default={}, help="extra GRPOConfig fields for the bare side, as JSON")
    args = parser.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU
    os.environ["R1KIT_STAGE_PROCESS"] = "0"  # r1kit's stage in this process, where the clocks are

    from r1kit import templates
    from r1kit.offline.tasks import addition

    work = Path(tempfile.mkdtemp(prefix="r1kit-grpo-step-"))
    model = args.model
    if model is None:
        from r1kit.offline.tiny import build_tiny_model

        model = str(build_tiny_model(work / "tiny"))
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = Dataset.from_list([
        {"prompt": templates.render(PROMPT, r["prompt"], tokenizer, False), "answer": r["answer"]}
        for r in addition(n=2000, digits=2)
    ])
    shared = {
        "per_device_train_batch_size": args.batch,
        "num_generations": args.generations,
        "max_completion_length": args.max_tokens,
        "temperature": 0.6,
        "learning_rate": 1.0e-5,
        "logging_steps": 1,
    }
    results = {}
    sides = {"bare TRL": lambda p: bare_trl(model, rows, shared, args.bare_trainer, args.steps, work / "trl", p),
             "r1kit": lambda p: r1kit_stage(model, shared, args.r1kit_trainer, args.steps, work / "r1kit", p, args.share_prompts)}
    for name, run in sides.items():
        if args.r1kit_only and name != "r1kit":
            continue
        phases = Phases()
        with phases.patched():
            run(phases)
        results[name] = phases.summary()
    print(f"model {model}: {args.batch} completions per step ({args.generations} per prompt), "
          f"at most {args.max_tokens} tokens, mean of steps 2-{args.steps}")
    for name, s in results.items():
        print(line(name, s))
    if len(results) == 2:
        print(f"ratio: r1kit's step takes {results['r1kit']['total'] / results['bare TRL']['total']:.2f}x the bare-TRL step's time "
              f"({results['bare TRL']['total'] / results['r1kit']['total']:.2f}x as fast)")


if __name__ == "__main__":
    main()
