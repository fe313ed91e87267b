"""Learning parity of asynchronous GRPO: the demo's GRPO stage, synchronous and with
``max_staleness``, from the same cold start, at the same number of steps, on several seeds; held-out
pass@1 after each.

    python bench/async_parity.py                       # the demo: seeds 1 2 3, max_staleness 1
    python bench/async_parity.py --seeds 1 2 3 4 5 --staleness 2
    python bench/async_parity.py --recipe recipes/tools_demo.yaml --rl rl_tools --eval eval_rl_tools

The recipe's ``cold_start`` stage runs once (its seed, as the demo runs it); then for each seed its
GRPO stage (--rl) and the eval stage after it (--eval) run twice from that model, as they are and
with ``max_staleness`` (the trainer on one core, the generator on the other). Prints a row per seed with each run's
held-out pass@1 on both tasks and its GRPO stage's wall time, and the mean difference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "demo.yaml"))
    p.add_argument("--cold", default="cold_start", help="the stage the GRPO stage starts from")
    p.add_argument("--rl", default="rl", help="the GRPO stage")
    p.add_argument("--eval", default="eval_rl", help="the eval stage after it")
    p.add_argument("--out", default=None, help="folder for the runs (default: a new temporary one)")
    args = p.parse_args()

    from r1kit import pipeline
    from r1kit.hardware.precision import describe_cpu
    from r1kit.recipe import load_recipe

    out = Path(args.out or tempfile.mkdtemp(prefix="async-parity-"))
    out.mkdir(parents=True, exist_ok=True)
    demo = yaml.safe_load(Path(args.recipe).read_text())
    stages = {s["name"]: s for s in demo["stages"]}
    base = {k: v for k, v in demo.items() if k != "stages"}

    def run(name: str, recipe: dict) -> dict:
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**recipe, "output_dir": str(out / name)}, sort_keys=False))
        return pipeline.run(load_recipe(path))

    rl = {k: v for k, v in stages[args.rl].items() if k != "model"}  # from the cold start, the run's model here
    evaluation = {**stages[args.eval], "model": args.rl}
    print(f"{describe_cpu()}; {Path(args.recipe).name}'s {args.rl} ({rl['trainer']['max_steps']} steps), max_staleness {args.staleness}")
    cold = run(args.cold, {**base, "stages": [stages[args.cold]]})[args.cold]["model"]
    rows = []
    for seed in args.seeds:
        row = {"seed": seed}
        for mode, extra in (("sync", {}), ("async", {"max_staleness": args.staleness})):
            record = run(f"{mode}_{seed}", {**base, "model": cold, "seed": seed, "stages": [{**rl, **extra}, evaluation]})
            scores = record[args.eval]["metrics"]
            row[mode] = {name.split("/")[0]: value for name, value in scores.items() if name.endswith("pass@1")}
            row[f"{mode}_seconds"] = record[args.rl]["wall_s"]
        rows.append(row)
        print(json.dumps(row))
    tasks = sorted(rows[0]["sync"])
    print("| seed | " + " | ".join(f"{t} sync | {t} async" for t in tasks) + " | GRPO s sync | GRPO s async |")
    print("|---" * (2 * len(tasks) + 3) + "|")
    for row in rows:
        cells = " | ".join(f"{row['sync'][t]:.3f} | {row['async'][t]:.3f}" for t in tasks)
        print(f"| {row['seed']} | {cells} | {row['sync_seconds']:.0f} | {row['async_seconds']:.0f} |")
    for t in tasks:
        diff = sum(r["async"][t] - r["sync"][t] for r in rows) / len(rows)
        print(f"{t}: mean async - sync = {100 * diff:+.1f} points over {len(rows)} seeds")


if __name__ == "__main__":
    main()
