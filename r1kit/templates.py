"""Prompt templates by name: how a dataset's question becomes the text the model continues.

- ``r1_zero``: the DeepSeek-R1 paper's Table 1 prompt for base models (reasoning in <think>,
  answer in <answer>); the question replaces ``{prompt}``.
- ``chat``: the model's own chat template, no system prompt, with R1's usage guidance appended to
  the question ("Please reason step by step, and put your final answer within \\boxed{}.").
- ``plain``: the question as it is.
- any other string containing ``{prompt}`` is a user template, e.g. ``"Q: {prompt}\\nA:"``.

``think_prefill`` appends ``<think>\\n`` after the rendered prompt, so the model starts inside its
reasoning (as R1's chat template does); rewards must then not expect an opening ``<think>``.

Not here: tokenization (trainers and samplers tokenize the rendered text).
"""

from __future__ import annotations

from dataclasses import dataclass

R1_ZERO = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user "
    "with the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>. User: {prompt}. Assistant:"
)
R1_GUIDANCE = "Please reason step by step, and put your final answer within \\boxed{}."
NAMES = ("r1_zero", "chat", "plain")
THINK_PREFILL = "<think>\n"


@dataclass(kw_only=True)
class Prompting:
    """How a stage turns a question into the text the model continues."""

    template: str = "r1_zero"
    """Prompt template: r1_zero, chat, plain, or a string containing {prompt}."""
    think_prefill: bool = False
    """Start the model's turn with '<think>\\n'."""


def check(template: str) -> str | None:
    """None when `template` is usable, else what is wrong (for config errors)."""
    if template in NAMES or "{prompt}" in template:
        return None
    return f"unknown template {template!r}; use one of {', '.join(NAMES)} or a string containing {{prompt}}"


def chat_user_turn(prompt: str) -> str:
    """The user message of the ``chat`` template: the question with R1's usage guidance."""
    return f"{prompt}\n{R1_GUIDANCE}"


def render(template: str, prompt: str, tokenizer=None, think_prefill: bool = False) -> str:
    """The text the model continues for question `prompt`."""
    if template == "chat":
        messages = [{"role": "user", "content": chat_user_turn(prompt)}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    elif template == "r1_zero":
        text = R1_ZERO.replace("{prompt}", prompt)
    elif template == "plain":
        text = prompt
    else:
        text = template.replace("{prompt}", prompt)
    return text + THINK_PREFILL if think_prefill else text
