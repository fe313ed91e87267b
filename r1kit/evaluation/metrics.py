"""The R1 protocol's figures: per-sample verdicts, pass@1, cons@k (majority vote) and pass@k.

- `DOMAINS`: for each domain of problem (math, multiple choice, code), how a sample is judged and
  how a problem's samples vote. Math samples are judged by the registered ``math_accuracy`` reward
  (the evaluator asks the registry, as a recipe does) and vote by `majority_votes`; multiple-choice
  samples by the letter r1kit.evaluation.choices reads (as the ``multiple_choice`` reward reads
  it), voting letter by letter; code samples by r1kit.execution.judge (as the ``code_tests``
  reward judges), which also says why a sample failed, with no vote; reasoning-gym samples by
  the registered ``reasoning_gym`` reward (its task's scorer: correct at score 1.0), voting by
  the exact answer string. A new domain is one row.
- `score(problems, completions)`: one samples.jsonl row per completion, through `DOMAINS`.
- `pass_at_k(n, c, k)`: Chen et al. (2021)'s unbiased estimator 1 - C(n-c, k) / C(n, k).
- `majority_votes(answer_lists)`: the winning answer of each problem; answers the verifier
  judges equal form one cluster.
- `summarize(bench, rows, k)`: every figure of a summary.json (see r1kit.evaluation.evaluate). cons@k is
  a vote over answers, so it covers the domains that vote (None for a code benchmark). Where
  problems carry ratings (Codeforces), the rating those solves estimate (r1kit.evaluation.codeforces).

Pure functions of their inputs (the verifiers aside); nothing here samples or writes.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable

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
    round compares the next distinct answer of all problems in one verifier batch. A leader plays
    the reference in those comparisons: a model's answer that the verifier cannot parse joins no
    cluster, and the reward's warning about an unparseable reference (meant for a dataset's) is
    not logged.
    """
    verify = math_verifier()
    quiet = logging.getLogger(verify.fn.__module__)  # the reward's own logger
    quiet.addFilter(_drop)
    try:
        return _votes(answer_lists, verify)
    finally:
        quiet.removeFilter(_drop)


def _drop(record: logging.LogRecord) -> bool:
    return False


def _votes(answer_lists: list[list[str | None]], verify) -> list[int | None]:
    """`majority_votes`, comparing with `verify`."""
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
    voted = []
    for name, domain in DOMAINS.items():
        samples = [s for p, s in scored if p.domain == name]
        if domain.vote is not None and samples:
            winners = domain.vote([[r["answer"] for r in s[:k]] for s in samples])
            voted += [float(w is not None and s[w]["correct"]) for s, w in zip(samples, winners)]
    out[f"cons@{k}"] = _mean(voted)
    for j in ks[1:]:
        out[f"pass@{j}"] = _mean([pass_at_k(len(s), sum(r["correct"] for r in s), j) for _, s in scored])
    all_rows = [r for _, s in scored for r in s]
    counted = [r["tokens"] for r in all_rows if r["tokens"] is not None]
    out["mean_tokens"] = _mean(counted)
    if len(counted) < len(all_rows):  # saved generations without token counts: said, not hidden
        out["samples_without_tokens"] = len(all_rows) - len(counted)
    out["truncated"] = _mean([float(r["truncated"]) for r in all_rows if r["truncated"] is not None])
    out["no_answer"] = _mean([float(r.get("reason") == "no program" if "reason" in r else r["answer"] is None)
                              for r in all_rows if "episode" not in r])
    episodes = [r["episode"] for r in all_rows if r.get("episode")]
    if episodes:  # episodes in an environment (r1kit.environments): turns, calls per tool, errors, failures, reward
        from r1kit.environments.episodes import episode_metrics

        out.update(episode_metrics(episodes))
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
    in order, each domain's samples judged in one batch by its `DOMAINS` entry; code runs in the
    sandbox under `limits`; `prefilled`: the prompts opened <think> (all of them, or each problem's)."""
    opened = prefilled if isinstance(prefilled, list) else [prefilled] * len(problems)
    inside = {p.id: o for p, o in zip(problems, opened)}
    flat = [(p, j, c) for p, cs in zip(problems, completions) for j, c in enumerate(cs)]
    rows = {}
    for name, domain in DOMAINS.items():
        batch = [x for x in flat if x[0].domain == name]
        if batch:
            judged = domain.judge([p for p, _, _ in batch], [c.text for _, _, c in batch], [inside[p.id] for p, _, _ in batch],
                                  fallback, limits)
            for (p, j, c), fields in zip(batch, judged):
                rows[p.id, j] = {"id": p.id, "sample": j, "completion": c.text, **fields, "tokens": c.tokens,
                                 "truncated": c.truncated} | _calls(c) | _episode(c)
    return [rows[p.id, j] for p, j, _ in flat]


# ---- the domains: how a sample of each is judged and how its samples vote

def _judge_math(problems, texts, prefilled, fallback, limits) -> list[dict]:
    """The registered ``math_accuracy`` reward's verdicts, and the answer it extracted."""
    from r1kit.text import extract_answer

    verdicts = math_verifier(fallback)(texts, answer=[p.answer for p in problems])
    return [{"answer": extract_answer(text, fallback), "reference": p.answer, "correct": None if v is None else v == 1.0}
            for p, text, v in zip(problems, texts, verdicts)]


def _judge_choice(problems, texts, prefilled, fallback, limits) -> list[dict]:
    """The letter r1kit.evaluation.choices reads (as the ``multiple_choice`` reward reads it)."""
    from r1kit.evaluation.choices import answer_letter

    letters = [answer_letter(text, p.choices, opened) for p, text, opened in zip(problems, texts, prefilled)]
    return [{"answer": letter, "reference": p.answer, "choices": p.choices, "correct": letter == p.answer} for p, letter in zip(problems, letters)]


def _judge_code(problems, texts, prefilled, fallback, limits) -> list[dict]:
    """r1kit.execution.judge's verdicts (as the ``code_tests`` reward judges), with why a sample failed."""
    from r1kit.execution.judge import judge

    verdicts = judge(texts, [p.tests for p in problems], limits=limits, prefilled=prefilled)
    return [{"correct": v.ok if v.total else None, "reason": v.reason, "tests": [v.passed, v.total]} for v in verdicts]


def _judge_reasoning_gym(problems, texts, prefilled, fallback, limits) -> list[dict]:
    """The registered ``reasoning_gym`` reward's scores (its task's scorer), and the answer reasoning-gym extracts."""
    from r1kit import reward_registry
    from r1kit.environments.reasoning_gym import extract

    scores = reward_registry.build("reasoning_gym")(texts, reasoning_gym=[p.row["reasoning_gym"] for p in problems])
    return [{"answer": extract(text), "reference": p.answer, "correct": None if v is None else v == 1.0, "score": v}
            for p, text, v in zip(problems, texts, scores)]


def _judge_environment(problems, texts, prefilled, fallback, limits) -> list[dict]:
    """Nothing from the text: an episode's verdict is its environment's (`_episode`)."""
    return [{"answer": None, "reference": p.answer} for p in problems]


def _vote_letters(answer_lists: list[list[str | None]]) -> list[int | None]:
    """For each problem's letters (or other exact answers), the index of the first sample of the
    most frequent (ties: the first seen)."""
    out = []
    for answers in answer_lists:
        votes = Counter(a for a in answers if a is not None)
        best = min(votes, key=lambda a: (-votes[a], answers.index(a)), default=None)
        out.append(None if best is None else answers.index(best))
    return out


@dataclass(frozen=True)
class Domain:
    """How the evaluator judges a domain's samples and how they vote for cons@k."""

    judge: Callable[..., list[dict]]
    """(problems, completion texts, prefilled flags, fallback, sandbox limits) -> each sample's row fields."""
    vote: Callable[[list[list[str | None]]], list[int | None]] | None
    """Each problem's winning sample by its answers; None: no vote (cons@k leaves the domain out)."""
    runs_code: bool = False
    """Samples run in the sandbox: its limits are part of the evaluation's settings."""


# A problem's domain (r1kit.evaluation.benchmarks.Problem.domain) -> how it is judged. A new domain
# is a row here and a kind of problem in the benchmark tables.
DOMAINS = {
    "math": Domain(judge=_judge_math, vote=majority_votes),
    "choice": Domain(judge=_judge_choice, vote=_vote_letters),
    "code": Domain(judge=_judge_code, vote=None, runs_code=True),
    # A reasoning-gym task's problem: correct at its scorer's full score; a vote over exact answer strings.
    "reasoning_gym": Domain(judge=_judge_reasoning_gym, vote=_vote_letters),
    # A problem evaluated in an environment: solved when the episode's reward reaches SOLVED.
    "environment": Domain(judge=_judge_environment, vote=None),
}
SOLVED = 1.0
"""An episode counts as solved when its environment's reward is at least this (the full reward of a 0-1 environment)."""


def runs_code(bench: Benchmark) -> bool:
    """Whether any problem of `bench` is judged by running code."""
    return any(DOMAINS[p.domain].runs_code for p in bench.problems)


def _episode(completion) -> dict:
    """A row's episode, its reward and verdict, where the completion was an episode in an environment."""
    episode = getattr(completion, "episode", None)
    if episode is None:
        return {}
    return {"correct": episode["reward"] is not None and episode["reward"] >= SOLVED, "reward": episode["reward"],
            "turns": episode["turns"], "episode": episode}


def _calls(completion) -> dict:
    """A row's ``tool_calls``, where the completion was sampled with tools."""
    calls = getattr(completion, "tool_calls", None)
    return {} if calls is None else {"tool_calls": calls}
