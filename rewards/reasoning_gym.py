"""reasoning-gym reward: each task's own scorer on the completion's last ``<answer>`` block.

    data: {source: "reasoning_gym:basic_arithmetic", task: {size: 500}}
    rewards: [{name: reasoning_gym, weight: 1.0}]

    from r1kit.rewards.reasoning_gym import reasoning_gym
    reasoning_gym(["<think>4 - 1</think> <answer>3</answer>"], reasoning_gym=[row["reasoning_gym"]])   # [1.0]

The rows of a ``reasoning_gym:NAME`` source (r1kit.environments.reasoning_gym) carry a
``reasoning_gym`` column naming their task, config and index; the reward rebuilds that dataset
(once per task and config) and returns ``score_answer(extract_answer(completion), entry)``, both
reasoning-gym's: 1.0 for the reference answer, partial credit where the task gives it (an answer
that holds the reference and more, on some tasks), 0.0 for a wrong or missing answer. A row whose
column is null (a row of another source mixed in) scores None, so a trainer skips it.

It reads only the last ``<answer>`` block, stripped (no ``\\boxed{}``, no last number), and judges
nothing itself: a lenient or strict task is the task's scorer's doing.
"""

from __future__ import annotations

from r1kit.environments.reasoning_gym import extract, score
from r1kit.errors import RewardError


def reasoning_gym(completions: list[str], **columns) -> list[float | None]:
    """The row's reasoning-gym task's score of the completion's last ``<answer>`` block (0 to 1)."""
    if "reasoning_gym" not in columns:
        raise RewardError(
            f"reasoning_gym needs the 'reasoning_gym' column of a reasoning_gym:NAME data source; "
            f"columns given: {sorted(columns) or 'none'}"
        )
    metas = columns["reasoning_gym"]
    mine = [i for i, meta in enumerate(metas) if meta is not None]
    scores = iter(score([extract(completions[i]) for i in mine], [metas[i] for i in mine]))
    return [None if meta is None else next(scores) for meta in metas]


reasoning_gym.bounds = (0.0, 1.0)
