"""Benchmark: r1kit's math_accuracy against calling math-verify's parse + verify directly.

    python bench/math_reward.py            # 2,048 timed pairs (128 groups of 16), ~1 min
    python bench/math_reward.py --n 4096 --batch 512 --warmup 8192

The data is synthetic and seeded, in RL shape: G completions per reference, each a reasoning
block with inline math followed by an answer in ``<answer>`` tags, in ``\\boxed{}`` or in a
sentence. References mix integers, fractions, expressions and LaTeX structures (intervals,
sets, tuples, matrices); answers are the reference as written, an equal form, a wrong value, a
malformed string, or missing. Inputs that make math-verify run for seconds are left out on
purpose: they would only inflate the baseline's time.

The baseline is what a reward function that uses math-verify directly does, in one process:
``verify(parse("\\boxed{" + answer + "}"), parse(completion))`` with math-verify's default
extraction and time limits. Both sides first grade other seeded pairs untimed (``--warmup``):
the LaTeX parser's caches warm up per process, as in the first steps of a training run, and
r1kit has one process per core to warm. The very first batch (which starts the pool) and the
warm-up throughput are printed too. In the timed part the two sides take turns batch by
batch; wall time on shared cores is still noisy, so CPU seconds are printed beside it.

Agreement is counted twice, over the pairs where math-verify finished in time: with
math-verify on the whole completion (differences come from extraction: math-verify alone
takes the last formula of the text, which is often in the reasoning rather than in the
``<answer>`` block), and with math-verify on the answer r1kit extracted (differences would
come from r1kit's fast paths or time limits). It does not measure grading against human labels.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time
from collections import Counter
from fractions import Fraction

from r1kit.hardware.precision import describe_cpu


def reference_and_forms(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """A reference answer, equal forms of it, and wrong answers that look alike."""
    kind = rng.choice(["integer", "integer", "integer", "fraction", "expression", "structure"])
    if kind == "integer":
        n = rng.randint(0, 3000) if rng.random() < 0.8 else rng.randint(1000, 2_000_000)
        equal = [str(n), f"{n:,}", f"0{n}" if n < 100 else f"{n}.0", f"{n}\\text{{ apples}}"]
        wrong = [str(n + rng.choice([-10, -1, 1, 2, 100])), str(n * 10), str(-n - 1)]
        return str(n), equal, wrong
    if kind == "fraction":
        q = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
        p = rng.choice([k for k in range(1, 3 * q) if Fraction(k, q).denominator == q])
        f = Fraction(p, q)
        equal = [f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\dfrac{{{p}}}{{{q}}}", f"\\frac{{{2 * p}}}{{{2 * q}}}"]
        if 100 % q == 0 or q in (8, 16):
            equal.append(str(float(f)))
        rounded = round(float(f), 2)  # looks alike, but must really differ (12/5 is 2.4)
        wrong = [f"\\frac{{{q}}}{{{p}}}", f"\\frac{{{p + 1}}}{{{q}}}", str(rounded if Fraction(str(rounded)) != f else rounded + 0.01)]
        return f"\\frac{{{p}}}{{{q}}}", equal, wrong
    if kind == "expression":
        a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
        choice = rng.randrange(3)
        if choice == 0:
            return f"{a}\\sqrt{{{b}}}", [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a} \\sqrt {b}"], [
                f"{a + 1}\\sqrt{{{b}}}", f"\\sqrt{{{a * b}}}", f"{a}\\sqrt{{{b + 1}}}"]
        if choice == 1:
            return f"\\frac{{\\pi}}{{{a}}}", [f"\\frac{{\\pi}}{{{a}}}", f"\\pi/{a}", f"\\frac{{1}}{{{a}}}\\pi"], [
                f"\\frac{{\\pi}}{{{a + 1}}}", f"{a}\\pi", f"\\frac{{2\\pi}}{{{a}}}"]
        return f"x^2+{2 * a}x+{a * a}", [f"x^2+{2 * a}x+{a * a}", f"(x+{a})^2", f"x^{{2}} + {2 * a} x + {a * a}"], [
            f"(x-{a})^2", f"x^2+{a}x+{a * a}", f"(x+{a + 1})^2"]
    a, b, c = sorted(rng.sample(range(-9, 20), 3))
    choice = rng.randrange(4)
    if choice == 0:
        return f"({a}, {b}]", [f"({a},{b}]", f"\\left({a}, {b}\\right]"], [f"[{a}, {b}]", f"({a}, {c}]", f"({a}, {b})"]
    if choice == 1:
        return f"\\{{{a}, {b}, {c}\\}}", [f"\\{{{c},{a},{b}\\}}", f"\\{{{a}, {b}, {c}\\}}"], [
            f"\\{{{a}, {b}\\}}", f"\\{{{a}, {b}, {c + 1}\\}}"]
    if choice == 2:
        return f"({a}, {b})", [f"({a},{b})", f"\\left( {a}, {b} \\right)"], [f"({b}, {a})", f"({a}, {c})"]
    m = f"\\begin{{pmatrix}}{a}&{b}\\\\{c}&{a}\\end{{pmatrix}}"
    return m, [m, f"\\begin{{pmatrix}} {a} & {b} \\\\ {c} & {a} \\end{{pmatrix}}"], [
        f"\\begin{{pmatrix}}{b}&{a}\\\\{c}&{a}\\end{{pmatrix}}"]


MALFORMED = ["\\frac{3}{", "\\sqrt{", "(1,", "}{", "x^{2", "\\begin{pmatrix}1&2"]


def reasoning(rng: random.Random) -> str:
    """A chain of thought of ~0.6-2.5 k characters with inline math and stray numbers."""
    sentences = []
    for _ in range(rng.randint(8, 30)):
        x, y = rng.randint(1, 99), rng.randint(1, 99)
        sentences.append(rng.choice([
            f"We have $a = {x}$ and $b = {y}$, so $a + b = {x + y}$.",
            f"Next, multiply by $\\frac{{{x}}}{{{y}}}$ to rescale the term.",
            f"Let me double-check: {x} times {y} is {x * y}.",
            "Wait, that does not look right, let me reconsider the setup.",
            f"Substituting $x = {x}$ into $x^2 - {y}$ gives ${x * x - y}$.",
            "So the constraint is satisfied for every admissible value.",
        ]))
    return " ".join(sentences)


def make_pairs(n: int, group: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """`n` (completion, reference) pairs, `group` per reference, with the kind of each answer."""
    rng = random.Random(seed)
    completions, refs, kinds = [], [], []
    while len(completions) < n:
        ref, equal, wrong = reference_and_forms(rng)
        for _ in range(group):
            roll = rng.random()
            if roll < 0.40:
                kind, answer = "as written", ref
            elif roll < 0.60:
                kind, answer = "equal form", rng.choice(equal)
            elif roll < 0.88:
                kind, answer = "wrong", rng.choice(wrong)
            elif roll < 0.94:
                kind, answer = "malformed", rng.choice(MALFORMED)
            else:
                kind, answer = "missing", None
            think = f"<think>\n{reasoning(rng)}\n</think>\n"
            style = rng.randrange(4)
            if answer is None:
                text = think + rng.choice(["I am not sure.", "<answer></answer>", "The answer is \\boxed{"])
            elif style == 0:
                text = f"{think}<answer>{answer}</answer>"
            elif style == 1:
                text = f"{think}Therefore the final answer is $\\boxed{{{answer}}}$."
            elif style == 2:
                text = f"{think}<answer>\\boxed{{{answer}}}</answer>"
            else:
                text = f"{think}<answer>The answer is ${answer}$.</answer>"
            completions.append(text)
            refs.append(ref)
            kinds.append(kind)
    return completions[:n], refs[:n], kinds[:n]


class _TimeoutCounter(logging.Handler):
    """Counts math-verify's "Timeout during ..." warnings: its verdict is then not its own."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        if "Timeout" in record.getMessage():
            self.count += 1


def baseline(completions: list[str], refs: list[str]) -> tuple[list[bool | None], float, float]:
    """math-verify called directly, one pair after the other: verdicts (None where it timed
    out), wall time, CPU time."""
    from math_verify import parse, verify

    counter = _TimeoutCounter()
    logging.getLogger("math_verify").addHandler(counter)
    verdicts: list[bool | None] = []
    start, cpu = time.perf_counter(), time.process_time()
    for completion, ref in zip(completions, refs):
        before = counter.count
        ok = verify(parse("\\boxed{" + ref + "}"), parse(completion))
        verdicts.append(None if counter.count > before else ok)
    logging.getLogger("math_verify").removeHandler(counter)
    return verdicts, time.perf_counter() - start, time.process_time() - cpu


def same_answer_baseline(completions: list[str], refs: list[str]) -> list[bool | None]:
    """math-verify on the answer r1kit extracts (given the same way r1kit gives it): isolates
    the verifier from extraction. None where math-verify timed out."""
    from math_verify import parse, verify

    from r1kit.text import extract_answer

    counter = _TimeoutCounter()
    logging.getLogger("math_verify").addHandler(counter)
    verdicts: list[bool | None] = []
    for completion, ref in zip(completions, refs):
        answer = extract_answer(completion)
        before = counter.count
        ok = answer is not None and verify(parse("\\boxed{" + ref + "}"), parse("\\boxed{" + answer + "}"))
        verdicts.append(None if counter.count > before else ok)
    logging.getLogger("math_verify").removeHandler(counter)
    return verdicts


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def r1kit(completions: list[str], refs: list[str], batch: int, timeout: float) -> tuple[list, float, float]:
    """math_accuracy over the pairs in trainer-sized batches: scores, wall time, and CPU time
    of the calling process plus the pool's workers."""
    from r1kit.rewards import math_pool
    from r1kit.rewards.math import math_accuracy

    def pool_cpu() -> dict[int, float]:
        return {w.proc.pid: _cpu_seconds(w.proc.pid) for w in math_pool._POOL}  # bench-only peek

    scores = []
    workers_before, cpu_before = pool_cpu(), time.process_time()
    start = time.perf_counter()
    for k in range(0, len(completions), batch):
        scores += math_accuracy(completions[k : k + batch], answer=refs[k : k + batch], timeout=timeout)
    wall = time.perf_counter() - start
    # Workers that were started during the run count from zero; killed ones are not counted.
    workers = sum(cpu - workers_before.get(pid, 0.0) for pid, cpu in pool_cpu().items())
    return scores, wall, time.process_time() - cpu_before + workers


def report_agreement(name: str, ours: list, theirs: list, kinds: list[str], completions, refs) -> None:
    finished = [i for i, b in enumerate(theirs) if b is not None and ours[i] is not None]
    disagree = [i for i in finished if (ours[i] == 1.0) != theirs[i]]
    print(f"agreement with {name}: {len(finished) - len(disagree)}/{len(finished)} = "
          f"{1 - len(disagree) / len(finished):.2%} ({len(theirs) - len(finished)} pairs excluded: "
          "math-verify timed out or the reference is unparseable)")
    for kind, count in sorted(Counter(kinds[i] for i in disagree).items()):
        print(f"  disagreements on '{kind}' answers: {count}")
    for i in disagree[:3]:
        print(f"  e.g. reference {refs[i]!r}: r1kit {ours[i]}, math-verify {theirs[i]}, "
              f"completion ends {completions[i][-60:]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="number of timed (completion, answer) pairs")
    parser.add_argument("--warmup", type=int, default=4096, help="untimed pairs run first by both sides")
    parser.add_argument("--group", type=int, default=16, help="completions per reference (G)")
    parser.add_argument("--batch", type=int, default=256, help="pairs per math_accuracy call")
    parser.add_argument("--timeout", type=float, default=5.0, help="r1kit's per-item time limit (s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(describe_cpu(), flush=True)  # the figures below hold for this CPU
    logging.basicConfig(level=logging.ERROR)

    from r1kit.rewards.math_pool import MAX_WORKERS

    completions, refs, kinds = make_pairs(args.n, args.group, args.seed)
    chars = sum(map(len, completions)) / len(completions)
    print(f"{len(completions)} pairs, {len(set(refs))} references x {args.group}, {chars:.0f} chars per completion")
    print("answer kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(kinds).items())))

    # Both sides first run on other data: latex2sympy's ANTLR parser warms a prediction cache
    # per process (a construct's first parse is ~10x slower), as after the first steps of a
    # training run. r1kit warms one cache per worker, so it needs more pairs to get there.
    warm_c, warm_r, _ = make_pairs(args.warmup, args.group, args.seed + 1)
    start = time.perf_counter()
    r1kit(warm_c[: args.batch], warm_r[: args.batch], args.batch, args.timeout)
    first = time.perf_counter() - start
    _, warm_ours_s, _ = r1kit(warm_c[args.batch :], warm_r[args.batch :], args.batch, args.timeout)
    _, warm_base_s, _ = baseline(warm_c, warm_r)
    print(f"warm-up ({args.warmup} other pairs, parsers still cold): math-verify direct "
          f"{args.warmup / warm_base_s:.1f} pairs/s, r1kit {(args.warmup - args.batch) / warm_ours_s:.1f} pairs/s "
          f"after a first batch of {args.batch} that started the pool in {first:.2f} s")

    # The two sides take turns batch by batch, so that both see the same load on shared cores.
    base, ours, base_s, ours_s, base_cpu, ours_cpu = [], [], 0.0, 0.0, 0.0, 0.0
    for k in range(0, len(completions), args.batch):
        verdicts, wall, cpu = baseline(completions[k : k + args.batch], refs[k : k + args.batch])
        base, base_s, base_cpu = base + verdicts, base_s + wall, base_cpu + cpu
        scores, wall, cpu = r1kit(completions[k : k + args.batch], refs[k : k + args.batch], args.batch, args.timeout)
        ours, ours_s, ours_cpu = ours + scores, ours_s + wall, ours_cpu + cpu
    print(f"math-verify direct, 1 process  : {base_s:6.2f} s wall {len(base) / base_s:7.1f} pairs/s, {base_cpu:6.2f} CPU s")
    print(f"r1kit math_accuracy, {MAX_WORKERS} workers: {ours_s:6.2f} s wall {len(ours) / ours_s:7.1f} pairs/s, "
          f"{ours_cpu:6.2f} CPU s (all processes)")
    print(f"ratio: r1kit has {base_s / ours_s:.1f}x the throughput of math-verify called directly "
          f"and needs {base_cpu / ours_cpu:.1f}x less CPU time (batches of {args.batch}, warm)")
    print(f"(on {os.cpu_count()} cores the wall-time ratio can reach the CPU ratio x {MAX_WORKERS}; "
          "less when other processes share the cores)")

    report_agreement("math-verify on the whole completion", ours, base, kinds, completions, refs)
    same = same_answer_baseline(completions, refs)
    report_agreement("math-verify on the extracted answer", ours, same, kinds, completions, refs)


if __name__ == "__main__":
    main()
