"""Multiple-choice reward: does the completion's final answer name the correct choice?

    rewards: [{name: multiple_choice, weight: 1.0}]

    from r1kit.rewards.choice import multiple_choice
    multiple_choice(["<think>...</think>\\nAnswer: B"], answer=["B"], choices=[["1", "2", "3", "4"]])   # [1.0]

The dataset gives each row its ``choices`` (a list of texts, in the order the prompt letters them)
and its ``answer``: the correct choice's letter (or its text). The completion's letter is read by
``r1kit.evaluation.choices.answer_letter``, the reader of the evaluator's multiple-choice benchmarks (the
final answer span; a boxed letter, ``Answer: C``, ``(C)`` or a choice's own text; a hedge such as
``A or B`` scores 0). 1.0 when the letters match, else 0.0; None for a row whose answer names no
choice (logged once), so a trainer skips it rather than teach it as wrong; a ``choices`` column
that is not lists of texts is an error. ``answer`` may also be a 0-based index (as MMLU's).
When the batch carries the rendered prompts (a ``prompt`` column, as r1kit's GRPO stage passes
them), a prompt that ends with ``<think>`` means the completion starts inside the reasoning.

It reads letters, not reasoning: a right letter after wrong reasoning scores 1.0.
"""

from __future__ import annotations

import logging

from r1kit.evaluation.choices import LETTERS, answer_letter, gold_index
from r1kit.errors import RewardError
from r1kit.text import opens_think

logger = logging.getLogger(__name__)


def multiple_choice(completions: list[str], *, answer_column: str = "answer", choices_column: str = "choices", **columns) -> list[float | None]:
    """1.0 when the completion's final answer is the row's correct choice, else 0.0."""
    for column in (answer_column, choices_column):
        if column not in columns:
            raise RewardError(f"multiple_choice: the dataset has no {column!r} column (columns: {', '.join(columns) or 'none'})")
    out: list[float | None] = []
    skipped = 0
    prefilled = [opens_think(p) for p in columns.get("prompt") or [None] * len(completions)]
    for i, (completion, gold, choices) in enumerate(zip(completions, columns[answer_column], columns[choices_column], strict=True)):
        if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
            raise RewardError(f"multiple_choice: column {choices_column!r} must hold a list of choice texts per row; sample {i} has {choices!r:.80}")
        try:
            letter = LETTERS[gold_index({"choices": choices, "answer": gold}, f"sample {i}")]
        except ValueError:
            skipped += 1
            out.append(None)
            continue
        out.append(float(answer_letter(completion, choices, prefilled[i]) == letter))
    if skipped:
        logger.warning("multiple_choice: %d of %d samples have an answer that names no choice; skipped", skipped, len(completions))
    return out


multiple_choice.bounds = (0.0, 1.0)
