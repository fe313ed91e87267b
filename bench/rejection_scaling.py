"""Rejection-stage scaling on one machine: prompts per second with 1 and 2 processes, side by
side, and the stage's peak memory at 1x and 10x the number of prompts.

    python bench/rejection_scaling.py                          # the offline tiny model
    python bench/rejection_scaling.py --prompts 200 --samples 8 --max-tokens 64

Throughput: one rejection stage (task:addition prompts in the r1_zero template, the
transformers backend, filters off so that every sample is a row) runs as ``r1kit run`` in one
process and under ``--accelerate-config recipes/accelerate/cpu_ddp.yaml`` in two, each sampling
its own shard of the chunks; every process is pinned to one thread (``OMP_NUM_THREADS=1``), so
two processes use two cores where one uses one. prompts/s is the prompts over the stage's wall
time in its DONE.json (model loading included, the launcher's start-up not), the fastest of
--repeats runs of each, alternated. The bench checks that both wrote the same dataset.jsonl.

Memory: the stage in one process on --memory-prompts and on 10 times as many, with many short
samples per prompt (--memory-samples, --memory-max-tokens: rows pile up fast, sampling stays
cheap); the peak resident memory of the process (``ru_maxrss``) beside the size of the dataset
it wrote, so the reader sees whether memory follows the rows.

Not measured: GPUs, vLLM, sampling speed of real models (bench/sampling.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from r1kit.hardware.precision import describe_cpu

ROOT = Path(__file__).resolve().parents[1]
CPU_DDP = ROOT / "recipes" / "accelerate" / "cpu_ddp.yaml"
PEAK = "import resource, sys; from r1kit.cli import main; code = main(sys.argv[1:]); print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(code)"


def recipe(folder: Path, model: Path, prompts: int, samples: int, max_tokens: int, chunk_prompts: int) -> Path:
    stage = {
        "name": "rs", "kind": "rejection", "template": "r1_zero",
        "data": {"source": "task:addition", "task": {"n": prompts, "digits": 3}},
        "rewards": [{"name": "format", "mode": "lenient"}], "min_total": 0.0, "max_kept_per_prompt": None,
        "samples": samples, "max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0,
        "backend": "transformers", "chunk_prompts": chunk_prompts,
        "filters": {k: False for k in ("truncated", "mixed_language", "code_in_cot", "repetition", "exact_duplicates", "near_duplicates")},
    }
    path = folder / "recipe.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"model": str(model), "output_dir": str(folder / "run"), "stages": [stage]}, sort_keys=False))
    return path


def run(path: Path, *extra: str) -> tuple[float, int | None]:
    """Runs the recipe; (stage wall seconds, peak KiB of a single process or None)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "R1KIT_STAGE_PROCESS": "0"}
    done = subprocess.run([sys.executable, "-c", PEAK, "run", str(path), *extra], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{path}: the run failed:\n{done.stderr[-3000:]}")
    peak = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("PEAK_KB")]
    wall = json.loads((path.parent / "run" / "rs" / "DONE.json").read_text())["wall_s"]
    return wall, peak[0] if peak and not extra else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--chunk-prompts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="runs of each, the fastest counted")
    p.add_argument("--memory-prompts", type=int, default=128)
    p.add_argument("--memory-samples", type=int, default=32)
    p.add_argument("--memory-max-tokens", type=int, default=8)
    args = p.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU
    from r1kit.offline.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(tmp / "model", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512)  # the demo's size
        print(f"rejection stage: {args.prompts} prompts x {args.samples} samples, up to {args.max_tokens} tokens, the demo's tiny model, 1 thread per process")
        shape = (args.samples, args.max_tokens, args.chunk_prompts)
        walls: dict[str, list[float]] = {"one": [], "two": []}
        for i in range(args.repeats):  # alternating, so a slow spell of the machine hits both
            for name, extra in (("one", ()), ("two", ("--accelerate-config", str(CPU_DDP)))):
                walls[name].append(run(recipe(tmp / f"{name}{i}", model, args.prompts, *shape), *extra)[0])
        one, two = min(walls["one"]), min(walls["two"])
        same = (tmp / "one0/run/rs/dataset.jsonl").read_bytes() == (tmp / "two0/run/rs/dataset.jsonl").read_bytes()
        print(f"1 process:   {args.prompts / one:7.2f} prompts/s (best of {', '.join(f'{w:.1f}' for w in walls['one'])} s)")
        print(f"2 processes: {args.prompts / two:7.2f} prompts/s (best of {', '.join(f'{w:.1f}' for w in walls['two'])} s)")
        print(f"ratio 2/1:   {one / two:.2f}x; same dataset.jsonl: {same}")
        peaks = []
        print(f"memory: {args.memory_samples} samples per prompt, up to {args.memory_max_tokens} tokens, one process")
        for factor in (1, 10):
            path = recipe(tmp / f"mem{factor}", model, factor * args.memory_prompts, args.memory_samples, args.memory_max_tokens, args.chunk_prompts)
            wall, peak = run(path)
            size = (path.parent / "run" / "rs" / "dataset.jsonl").stat().st_size
            peaks.append(peak)
            print(f"memory at {factor:2d}x ({factor * args.memory_prompts} prompts): peak {peak / 1024:.0f} MiB, dataset.jsonl {size / 2**20:.1f} MiB, {wall:.0f} s")
        print(f"peak memory 10x / 1x: {peaks[1] / peaks[0]:.3f} ({100 * (peaks[1] / peaks[0] - 1):+.1f}%)")


if __name__ == "__main__":
    main()
