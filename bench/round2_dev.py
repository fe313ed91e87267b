"""The demo's second RL round, tried with other settings and scored on held-out problems that
none of the demo's evals use: how its round-2 settings were chosen without looking at its table.

    make demo                                               # runs/demo, with rl/ and sft/ models
    python bench/round2_dev.py --run runs/demo              # round 1, the SFT, round 2 as in demo.yaml
    python bench/round2_dev.py --run runs/demo --variant '{"learning_rate": 1.0e-4}' --seeds 42 43

The dev problems are test-split problems of both demo tasks (`seed: 7` draws) without the 500
of each that the demo's evals score, so train, dev and eval never share a problem. Each variant
is the demo's `rl2` stage with the given trainer fields (``"dynamic_sampling": true`` is a stage
field), trained from the run's `sft` model once per seed, then scored like the evals (4 samples
at temperature 0.6, top-p 0.95, 64 tokens, drawn with the variant's seed); the run's `rl` and
`sft` models are scored the same way, with seed 42. Prints pass@1 per domain, one row per model. Results go to a temporary folder, or --out.

Not a speed bench, and it never touches the run folder.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import yaml

from r1kit.hardware.precision import describe_cpu

STAGE_FIELDS = {"dynamic_sampling", "dynamic_sampling_max_rounds"}


def dev_sets(folder: Path, demo: dict) -> list[str]:
    """Write the dev problems of both tasks (see the module docstring); the file paths."""
    from r1kit.offline import tasks

    evaluation = next(s for s in demo["stages"] if s["kind"] == "eval")["task"]
    files = []
    for name, args in evaluation.items():
        draw = getattr(tasks, name)
        scored = {r["prompt"] for r in draw(split="test", **args)}
        # last_digit: the first 1,000 such problems; functions: all of them (its test split holds 1,825)
        space, keep = ({"n": 2000}, 1000) if name == "last_digit" else ({"n": 1800}, None)
        rows = [r for r in draw(split="test", **{**args, **space, "seed": 7}) if r["prompt"] not in scored][:keep]
        path = folder / f"{name}.jsonl"
        with open(path, "w") as f:
            for r in rows:
                check = {"answer": r["answer"]} if r["task"] == "math" else {"tests": r["tests"]}
                f.write(json.dumps({"id": r["id"], "problem": r["prompt"], **check}) + "\n")
        files.append(str(path))
    return files


def score(model: str, stages: list[dict], files: list[str], out: Path, seed: int) -> dict[str, float]:
    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    dev = {"name": "dev", "kind": "eval", "benchmarks": files, "samples": 4, "max_tokens": 64,
           "template": "plain", "backend": "transformers"}
    path = out / "recipe.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"model": model, "output_dir": str(out), "seed": seed, "stages": [*stages, dev]}))
    metrics = pipeline.run(load_recipe(path))["dev"]["metrics"]
    return {Path(f).stem: metrics[f"{Path(f).stem}/pass@1"] for f in files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished demo run folder (with rl/model and sft/model)")
    parser.add_argument("--recipe", default="recipes/demo.yaml")
    parser.add_argument("--variant", action="append", type=json.loads, default=None,
                        help="round-2 trainer fields as JSON (repeatable); default: the recipe's own")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--out", default=None, help="folder for the dev runs (default: a temporary one)")
    args = parser.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU
    from r1kit.hardware import cpu

    cpu.keep_freed_memory()  # as `r1kit run` does at its start

    demo = yaml.safe_load(Path(args.recipe).read_text())
    rl2 = next(s for s in demo["stages"] if s["name"] == "rl2")
    run = Path(args.run)
    out = Path(args.out or tempfile.mkdtemp(prefix="r1kit-round2-"))
    out.mkdir(parents=True, exist_ok=True)
    files = dev_sets(out, demo)
    rows = [(name, score(str(run / name / "model"), [], files, out / name, 42)) for name in ("rl", "sft")]
    for i, variant in enumerate(args.variant or [{}]):
        for seed in args.seeds:
            stage = copy.deepcopy(rl2)
            stage["trainer"].update({k: v for k, v in variant.items() if k not in STAGE_FIELDS})
            stage.update({k: v for k, v in variant.items() if k in STAGE_FIELDS})
            label = f"rl2 {json.dumps(variant) if variant else '(as in the recipe)'} seed {seed}"
            rows.append((label, score(str(run / "sft" / "model"), [stage], files, out / f"v{i}-s{seed}", seed)))
    names = list(rows[0][1])
    print(f"dev problems: {', '.join(f'{Path(f).stem} {sum(1 for _ in open(f))}' for f in files)} (in {out})")
    print("| model | " + " | ".join(f"{n} pass@1" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for label, result in rows:
        print(f"| {label} | " + " | ".join(f"{result[n]:.3f}" for n in names) + " |")


if __name__ == "__main__":
    main()
