"""Format reward: does the completion follow the DeepSeek-R1 template?

The R1 template is a reasoning block then an answer block::

    <think> ... reasoning ... </think> <answer> ... final answer ... </answer>

Recipe use::

    rewards: [{name: format, weight: 0.2, mode: strict, prefilled_think: true}]

Parameters:

- ``mode="strict"``: the whole completion is exactly the think block then the answer block
  (whitespace allowed around and between them), each tag exactly once, neither block blank.
  ``mode="lenient"``: both blocks appear, in this order, anywhere in the completion.
- ``prefilled_think=True``: the prompt already ends with ``<think>`` (a chat template that
  opens the reasoning block for the model), so the completion starts inside the think block.
  The completion is then scored as if ``<think>`` preceded it: a completion that writes
  ``<think>`` again has nested tags, which strict mode rejects. When the batch carries the
  prompts (a ``prompt`` column; r1kit's GRPO stage passes them), a sample whose prompt ends with
  ``<think>`` is scored this way too. The completion itself is never used to guess: a completion
  that closes ``</think>`` without opening it, after a prompt that did not open it, scores 0.0,
  since rewarding it would teach a model without a prefilled prompt to drop the tag.
- ``answer_format="tags"`` requires ``<answer>…</answer>`` after ``</think>``; ``"boxed"``
  instead requires a complete ``\\boxed{…}`` after ``</think>`` (the template of models that
  answer in LaTeX); ``"code"`` a complete fenced code block (```` ``` ````…```` ``` ````) after
  ``</think>`` (code answers); in strict mode the text after ``</think>`` holds that box or block
  and no tag.

It checks layout only, not whether the answer is right (that is ``math_accuracy``).
"""

from __future__ import annotations

from typing import Literal

from r1kit.errors import RewardError
from r1kit.execution.judge import FENCE
from r1kit.text import last_boxed, opens_think


def _answered(after: str, answer: str) -> bool:
    """The text after </think> holds the box or the code block of `answer` ("boxed", "code")."""
    return last_boxed(after) is not None if answer == "boxed" else FENCE.search(after) is not None


MODES = ("strict", "lenient")
ANSWERS = ("tags", "boxed", "code")
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _strict(text: str, answer: str) -> bool:
    # Counting and splitting instead of one big regex: linear even on a megabyte of text.
    if any(text.count(tag) != 1 for tag in _TAGS[:2]):
        return False
    before, _, rest = text.partition("<think>")
    think, closed, after = rest.partition("</think>")
    if not closed or before.strip() or not think.strip():
        return False
    if answer != "tags":
        return "<answer>" not in text and "</answer>" not in text and _answered(after, answer)
    if any(text.count(tag) != 1 for tag in _TAGS[2:]):
        return False
    head, _, rest = after.partition("<answer>")
    content, closed, tail = rest.partition("</answer>")
    return bool(closed) and not head.strip() and not tail.strip() and bool(content.strip())


def _lenient(text: str, answer: str) -> bool:
    start = text.find("<think>")
    end = text.find("</think>", start + len("<think>")) if start >= 0 else -1
    if end < 0:
        return False
    rest = text[end + len("</think>") :]
    if answer != "tags":
        return _answered(rest, answer)
    opened = rest.find("<answer>")
    return opened >= 0 and rest.find("</answer>", opened + len("<answer>")) >= 0


def format_reward(
    completions: list[str],
    *,
    mode: Literal["strict", "lenient"] = "strict",
    prefilled_think: bool = False,
    answer_format: Literal["tags", "boxed", "code"] = "tags",
    **columns,
) -> list[float]:
    """1.0 when the completion follows the R1 template <think>…</think> then the answer, else 0.0.

    `mode` is "strict" (nothing else around the two blocks) or "lenient" (both blocks, in
    order, anywhere); `prefilled_think` says the prompt already opened ``<think>``; `answer_format` is
    "tags" (``<answer>…</answer>``), "boxed" (``\\boxed{…}`` after ``</think>``) or "code" (a
    fenced code block after ``</think>``).
    """
    if mode not in MODES:
        raise RewardError(f"format: mode must be one of {MODES}, got {mode!r}")
    if answer_format not in ANSWERS:
        raise RewardError(f"format: answer_format must be one of {ANSWERS}, got {answer_format!r}")
    prompts = columns.get("prompt") or [None] * len(completions)
    scores = []
    for text, prompt in zip(completions, prompts):
        if prefilled_think or opens_think(prompt):
            text = "<think>" + text
        ok = _lenient(text, answer_format) if mode == "lenient" else _strict(text, answer_format)
        scores.append(1.0 if ok else 0.0)
    return scores


format_reward.bounds = (0.0, 1.0)
