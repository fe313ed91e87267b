"""Length shaping rewards.

`overlong_penalty` is DAPO's soft overlong punishment (Yu et al., 2025, eq. 13): no penalty up to
``max_length - cache`` tokens, a linear ramp down to -1 across the last ``cache`` tokens, and -1
beyond ``max_length``. Add it beside the accuracy reward (weight 1.0 in DAPO) and set
``max_length`` to the trainer's ``max_completion_length``.

Lengths are counted in tokens when the trainer passes ``completion_ids`` (GRPO does), else in
whitespace-separated words.
"""

from __future__ import annotations

from typing import Annotated

from r1kit.reward_registry import POSITIVE


def overlong_penalty(
    completions: list[str], *, max_length: Annotated[int, POSITIVE] = 20480, cache: Annotated[int, POSITIVE] = 4096, **columns
) -> list[float]:
    """DAPO soft overlong punishment: 0 when short, linear down to -1 in the last `cache` tokens."""
    if not 0 < cache <= max_length:
        raise ValueError(f"overlong_penalty: need 0 < cache <= max_length, got cache={cache}, max_length={max_length}")
    ids = columns.get("completion_ids")
    lengths = [len(x) for x in ids] if ids is not None else [len(c.split()) for c in completions]
    soft_start = max_length - cache
    out = []
    for n in lengths:
        if n <= soft_start:
            out.append(0.0)
        elif n <= max_length:
            out.append((soft_start - n) / cache)
        else:
            out.append(-1.0)
    return out


overlong_penalty.bounds = (-1.0, 0.0)
