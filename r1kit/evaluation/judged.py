"""A judged column in an evaluation: a judge grades each sample beside the benchmark's own verifier.

    - name: eval
      kind: eval
      benchmarks: [math500]
      judge: {url: http://127.0.0.1:8000/v1, model: judge, template: reference}

    r1kit eval --model M --benchmark math500 --output evals/m --judge "{url: http://127.0.0.1:8000/v1, model: judge}"

``judge:`` holds the parameters of a registered reward, the ``judge`` reward (rewards/judge.py:
an LLM-as-judge behind an OpenAI-compatible endpoint) unless it names another (``name:
reward_model`` for a served or local reward model). The reward sees each sample's completion, the
problem's text as ``prompt``, its reference answer as ``answer`` (the judge's default columns) and
the fields every row of the benchmark has.

- ``samples.jsonl``: each row gets ``judged``, the judge's score (None where it gave none: an
  unparsed reply, a problem without a reference).
- ``summary.json``:
  - ``judged``: the judge's pass@1, each problem's mean over its judged samples, averaged;
  - ``judge_agreement``: the share of samples that the judge and the verifier both scored, on
    which they agree (a score of at least 0.5 is a pass);
  - ``judge_unscored``: samples the judge gave no score;
  - ``judge``: its settings.

The judge grades after sampling: it changes neither what is sampled nor the folder's fingerprint,
so a finished folder is judged by running the same evaluation again with ``judge:``. Replies are
cached in the evaluation's folder (the judge's ``judge_cache.jsonl``): a rerun or a resumed run
asks nothing twice.

Not here: the judge itself (rewards/judge.py), sampling and the verifier (r1kit.evaluation.evaluate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r1kit import reward_registry
from r1kit.errors import RewardError

DEFAULT = "judge"


def load(spec: Any) -> reward_registry.Reward | None:
    """The reward that `spec` (a mapping of its parameters, ``name`` defaulting to ``judge``)
    configures; None for None. A RewardError names what is wrong."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise RewardError(f"a mapping of the judge reward's parameters, like {{url: http://127.0.0.1:8000/v1, model: judge}}; got {spec!r}")
    spec = dict(spec)
    name = spec.pop("name", DEFAULT)
    if "weight" in spec or "when" in spec:
        raise RewardError("a judged column has no weight or when: it grades every sample")
    return reward_registry.build(str(name), spec)


def grade(rows: list[dict], problems: list, judge: reward_registry.Reward, out: Path) -> dict:
    """Set each samples.jsonl row's ``judged`` (rows of `problems`, by id) and return the summary's
    judge figures (see the module docstring). Replies are cached in `out`."""
    by_id = {p.id: p for p in problems}
    mine = [by_id[r["id"]] for r in rows]
    shared = set.intersection(*(set(p.row or {}) for p in mine)) if mine else set()
    columns: dict[str, list] = {k: [(p.row or {})[k] for p in mine] for k in sorted(shared)}
    columns |= {"prompt": [p.problem for p in mine], "answer": [p.answer for p in mine]}
    with reward_registry.in_stage(out):
        scores = judge([r["completion"] for r in rows], **columns) if rows else []
    for row, value in zip(rows, scores):
        row["judged"] = value
    per_problem: dict[str, list[float]] = {}
    for row in rows:
        if row["judged"] is not None:
            per_problem.setdefault(row["id"], []).append(row["judged"])
    both = [r for r in rows if r["judged"] is not None and r.get("correct") is not None]
    return {
        "judged": _mean([sum(v) / len(v) for v in per_problem.values()]),
        "judge_agreement": _mean([float((r["judged"] >= 0.5) == bool(r["correct"])) for r in both]),
        "judge_unscored": sum(r["judged"] is None for r in rows),
        "judge": {"name": judge.name, **judge.params},
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
