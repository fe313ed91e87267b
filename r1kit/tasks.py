"""Synthetic reasoning tasks that r1kit generates offline, for tests and CPU demos.

A recipe uses one as a data source: ``data: {source: "task:addition", split: test, task: {digits: 3}}``.
Rows carry ``id``, ``prompt``, ``answer`` (for verifiers), a worked ``completion`` in the R1 format
(``<think> … </think> <answer> … </answer>``) and the same as ``messages``, so one task feeds SFT,
GRPO, rejection sampling and evaluation alike.

`addition`: multi-digit addition, with a chain of thought that adds column by column with carries.
`chain`: the sum of several one-digit numbers, with a running-sum chain of thought.
The split is a pure function of the problem (a hash), so train and test never share a problem,
whatever `n` and `seed` are.

Not here: real benchmarks (they load from the hub or local files, see r1kit.data).
"""

from __future__ import annotations

import hashlib
import random


def _is_test(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0


def addition_cot(a: int, b: int) -> str:
    """Column-by-column addition with carries, least significant digit first."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry, digits = [], 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s}" if carry else f"{x}+{y}={s}")
        digits.append(s % 10)
        carry = s // 10
    if carry:
        digits.append(carry)
    result = "".join(str(d) for d in reversed(digits))
    return f"{' , '.join(steps)} . so {a}+{b}={result}"


def addition(n: int = 1000, digits: int = 3, split: str = "train", seed: int = 0) -> list[dict]:
    """`n` addition problems of up to `digits`-digit numbers from `split` (train or test)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    rng = random.Random(f"addition-{digits}-{split}-{seed}")
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    rows, seen, attempts = [], set(), 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n + 10_000:
            raise ValueError(f"n={n} is more than the distinct {digits}-digit problems in split {split!r}")
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        key = f"{a}+{b}"
        if key in seen or _is_test(key) != (split == "test"):
            continue
        seen.add(key)
        prompt = f"What is {a} + {b}?"
        completion = f"<think> {addition_cot(a, b)} </think> <answer> {a + b} </answer>"
        rows.append(
            {
                "id": f"addition-{split}-{len(rows)}",
                "prompt": prompt,
                "answer": str(a + b),
                "completion": completion,
                "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
            }
        )
    return rows


def chain(n: int = 1000, terms: int = 3, split: str = "train", seed: int = 0) -> list[dict]:
    """`n` sums of `terms` one-digit numbers from `split`, with a running-sum chain of thought."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    rng = random.Random(f"chain-{terms}-{split}-{seed}")
    rows, seen, attempts = [], set(), 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n + 10_000:
            raise ValueError(f"n={n} is more than the distinct {terms}-term sums in split {split!r}")
        xs = [rng.randint(0, 9) for _ in range(terms)]
        key = "+".join(map(str, xs))
        if key in seen or _is_test(key) != (split == "test"):
            continue
        seen.add(key)
        steps, total = [], xs[0]
        for x in xs[1:]:
            steps.append(f"{total}+{x}={total + x}")
            total += x
        prompt = f"What is {' + '.join(map(str, xs))}?"
        completion = f"<think> {' , '.join(steps)} </think> <answer> {total} </answer>"
        rows.append(
            {
                "id": f"chain-{split}-{len(rows)}",
                "prompt": prompt,
                "answer": str(total),
                "completion": completion,
                "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
            }
        )
    return rows


TASKS = {"addition": addition, "chain": chain}


def generate(name: str, split: str, args: dict) -> list[dict]:
    from r1kit.data import DataError

    if name not in TASKS:
        raise DataError(f"task:{name}: unknown task; tasks: {', '.join(TASKS)}")
    try:
        return TASKS[name](split=split, **args)
    except (TypeError, ValueError) as exc:
        raise DataError(f"task:{name}: {exc}") from None
