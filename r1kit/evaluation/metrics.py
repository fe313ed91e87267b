"""The R1 protocol's figures: per-sample verdicts, pass@1, cons@k (majority vote) and pass@k.

- `score(problems, completions)`: one samples.jsonl row per completion. A math problem's samples
  are judged by the registered ``math_accuracy`` reward (the evaluator asks the registry, as a
  recipe does); a code problem's by r1kit.execution.judge (as the ``code_tests`` reward judges), which
  also says why a sample failed.
- `pass_at_k(n, c, k)`: Chen et al. (2021)'s unbiased estimator 1 - C(n-c, k) / C(n, k).
- `majority_votes(answer_lists)`: the winning answer of each problem; answers the verifier
  judges equal form one cluster.
  A multiple-choice problem's samples by the letter r1kit.evaluation.choices reads (as the
  ``multiple_choice`` reward reads it).
- `summarize(bench, rows, k)`: every figure of a summary.json (see r1kit.evaluation.evaluate). cons@k is
  a vote over answers, so it covers math and multiple-choice problems (None for a code
  benchmark); letters vote as they are. Where problems carry ratings (Codeforces), the rating
  those solves estimate (r1kit.evaluation.codeforces).

Pure functions of their inputs (the verifier aside); nothing here samples or writes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from r1kit.evaluation.benchmarks import BREAKDOWNS, Benchmark, Problem
from r1kit.execution.sandbox import Limits


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021), k <= n."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n samples; got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_votes(answer_lists: list[list[str | None]]) -> list[int | None]:
    """For each problem's answers, the index of the answer that wins the vote (None: no answers).

    Distinct answers are taken in order of first appearance; each joins the first earlier
    cluster whose leading answer the verifier judges equal to it, else leads a new one. Every
    round compares the next distinct answer of all problems in one verifier batch.
    """
    verify = math_verifier()

    distinct = [list(dict.fromkeys(a for a in answers if a is not None)) for answers in answer_lists]
    leaders: list[list[int]] = [[] for _ in distinct]
    cluster: list[dict[int, int]] = [{} for _ in distinct]  # distinct answer -> its cluster's leader
    for y in range(max(map(len, distinct), default=0)):
        pairs, keys = [], []
        for i, d in enumerate(distinct):
            if y < len(d):
                pairs += [(d[x], d[y]) for x in leaders[i]]
                keys += [(i, x) for x in leaders[i]]
        joined: dict[int, int] = {}
        # An extracted answer written back as an <answer> block extracts to itself.
        same_as = verify([f"<answer>{b}</answer>" for _, b in pairs], answer=[a for a, _ in pairs]) if pairs else []
        for (i, x), same in zip(keys, (v == 1.0 for v in same_as)):
            if same and i not in joined:  # keys are in leader order: the earliest match wins
                joined[i] = x
        for i, d in enumerate(distinct):
            if y < len(d):
                cluster[i][y] = joined.get(i, y)
                if i not in joined:
                    leaders[i].append(y)
    out: list[int | None] = []
    for answers, d, of in zip(answer_lists, distinct, cluster):
        votes = Counter(of[d.index(a)] for a in answers if a is not None)
        best = min(votes, key=lambda leader: (-votes[leader], leader), default=None)  # ties: first cluster
        out.append(None if best is None else answers.index(d[best]))
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(bench: Benchmark, rows: list[dict], k: int) -> dict[str, Any]:
    """Metrics over `rows` (samples.jsonl rows of every problem of `bench`), k samples each."""
    by_id: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_id[row["id"]].append(row)
    scored = []
    for p in bench.problems:
        samples = sorted(by_id[p.id], key=lambda r: r["sample"])
        if all(r["correct"] is not None for r in samples):
            scored.append((p, samples))
    ks = sorted({2**e for e in range(k.bit_length()) if 2**e <= k} | {k})
    out: dict[str, Any] = {"problems": len(scored), "unscorable": len(bench.problems) - len(scored)}
    per_problem = [sum(r["correct"] for r in s) / len(s) for _, s in scored]
    out["pass@1"] = _mean(per_problem)
    math = [s for p, s in scored if p.domain == "math"]
    winners = majority_votes([[r["answer"] for r in s[:k]] for s in math])
    voted = [float(w is not None and s[w]["correct"]) for s, w in zip(math, winners)]
    for s in (s for p, s in scored if p.domain == "choice"):
        answers = [r["answer"] for r in s[:k]]
        votes = Counter(a for a in answers if a is not None)
        best = min(votes, key=lambda a: (-votes[a], answers.index(a)), default=None)  # ties: the first seen
        voted.append(float(best is not None and s[answers.index(best)]["correct"]))
    out[f"cons@{k}"] = _mean(voted)
    for j in ks[1:]:
        out[f"pass@{j}"] = _mean([pass_at_k(len(s), sum(r["correct"] for r in s), j) for _, s in scored])
    all_rows = [r for _, s in scored for r in s]
    out["mean_tokens"] = _mean([r["tokens"] for r in all_rows if r["tokens"] is not None])
    out["truncated"] = _mean([float(r["truncated"]) for r in all_rows if r["truncated"] is not None])
    out["no_answer"] = _mean([float(r.get("reason") == "no program" if "reason" in r else r["answer"] is None) for r in all_rows])
    called = [r for r in all_rows if r.get("tool_calls") is not None]
    if called:  # sampled with tools (r1kit.execution.tools)
        out["tool_calls"] = _mean([r["tool_calls"] for r in called])
        out["tool_call_share"] = _mean([float(r["tool_calls"] > 0) for r in called])
        out["pass@1_with_tool"] = _mean([float(r["correct"]) for r in called if r["tool_calls"] > 0])
        out["pass@1_without_tool"] = _mean([float(r["correct"]) for r in called if r["tool_calls"] == 0])
    rated = [(p.rating, value) for (p, _), value in zip(scored, per_problem) if p.rating is not None]
    if rated:
        from r1kit.evaluation.codeforces import rating_figures

        out.update(rating_figures([r for r, _ in rated], [v for _, v in rated], bench.rating_table))
    reasons = Counter(r["reason"] for r in all_rows if r.get("reason"))
    if reasons:
        out["failures"] = dict(reasons.most_common())
    breakdown: dict[str, dict] = {}
    for g in BREAKDOWNS:
        groups: dict[str, list[float]] = defaultdict(list)
        for (p, _), value in zip(scored, per_problem):
            if g in p.groups:
                groups[p.groups[g]].append(value)
        if groups:
            breakdown[g] = {v: {"problems": len(x), "pass@1": _mean(x)} for v, x in sorted(groups.items())}
    out["breakdown"] = breakdown
    return out


def math_verifier(fallback: str = "none"):
    """The registered ``math_accuracy`` reward: the evaluator asks the registry, as a recipe does."""
    from r1kit import reward_registry

    return reward_registry.build("math_accuracy", {"fallback": fallback})


def score(
    problems: list[Problem], completions: list[list[Any]], fallback: str, limits: Limits, prefilled: bool | list[bool] = False
) -> list[dict]:
    """samples.jsonl rows for each problem's completions (objects with text, tokens, truncated),
    in order; code runs in the sandbox under `limits`; `prefilled`: the prompts opened <think>
    (all of them, or each problem's)."""
    from r1kit.evaluation.choices import answer_letter
    from r1kit.execution.judge import judge
    from r1kit.text import extract_answer

    opened = prefilled if isinstance(prefilled, list) else [prefilled] * len(problems)
    inside = {p.id: o for p, o in zip(problems, opened)}
    flat = [(p, j, c) for p, cs in zip(problems, completions) for j, c in enumerate(cs)]
    math = [x for x in flat if x[0].domain == "math"]
    code = [x for x in flat if x[0].domain == "code"]
    choice = [x for x in flat if x[0].domain == "choice"]
    verdicts = math_verifier(fallback)([c.text for _, _, c in math], answer=[p.answer for p, _, _ in math]) if math else []
    rows = {
        (p.id, j): {"id": p.id, "sample": j, "completion": c.text, "answer": extract_answer(c.text, fallback),
                    "correct": None if v is None else v == 1.0, "tokens": c.tokens, "truncated": c.truncated} | _calls(c)
        for (p, j, c), v in zip(math, verdicts)
    }
    for p, j, c in choice:
        letter = answer_letter(c.text, p.choices, inside[p.id])
        rows[p.id, j] = {"id": p.id, "sample": j, "completion": c.text, "answer": letter, "correct": letter == p.answer,
                         "tokens": c.tokens, "truncated": c.truncated} | _calls(c)
    for (p, j, c), v in zip(code, judge([c.text for _, _, c in code], [p.tests for p, _, _ in code], limits=limits, prefilled=[inside[p.id] for p, _, _ in code]) if code else []):
        rows[p.id, j] = {"id": p.id, "sample": j, "completion": c.text, "correct": v.ok if v.total else None, "reason": v.reason,
                         "tests": [v.passed, v.total], "tokens": c.tokens, "truncated": c.truncated} | _calls(c)
    return [rows[p.id, j] for p, j, _ in flat]


def _calls(completion) -> dict:
    """A row's ``tool_calls``, where the completion was sampled with tools."""
    calls = getattr(completion, "tool_calls", None)
    return {} if calls is None else {"tool_calls": calls}
