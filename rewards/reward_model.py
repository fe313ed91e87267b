"""Preference reward from a sequence-classification reward model (DeepSeek-R1's second RL round).

R1 (arXiv:2501.12948, section 2.3.4) rewards general data with reward models: helpfulness is
judged on the final summary only (the answer after the reasoning), harmlessness on the whole
response. Recipe use, routed to the general rows of a mixed dataset::

    rewards:
      - {name: math_accuracy, weight: 1.0, when: {task: math}}
      - {name: reward_model, weight: 1.0, when: {task: general},
         model: Skywork/Skywork-Reward-V2-Llama-3.1-8B, text: summary, normalize: sigmoid}

Parameters:

- ``model``: folder or hub id of an ``AutoModelForSequenceClassification`` with one output
  (``num_labels=1``), loaded once per process and kept (on the GPU when there is one). Every
  process loads its own whole copy, also while the trainer shards the policy (ZeRO-3, FSDP with
  ``fsdp_cpu_ram_efficient_loading``), whose loading paths would otherwise hand the reward a
  partitioned or zero-filled model. Loading uses no collective, so routing (``when:``) that
  makes only some processes score is safe.
- ``text``: ``summary`` scores the text after the last ``</think>`` (the whole completion when it
  has none); ``full`` scores the whole completion, reasoning included.
- ``prompt_column``: the column holding the user's question; the reward model sees
  ``[user: question, assistant: text]`` through its tokenizer's chat template (question, a blank
  line and the text when it has none). In a grpo stage ``prompt`` is the rendered prompt (template
  included); keep the bare question in another column and name it here to show the model only that.
- ``normalize``: ``none`` returns the raw scores (logits); ``sigmoid`` maps them into (0, 1), the
  range of the rule rewards they are summed with.
- ``batch_size`` and ``max_length`` (tokens; longer inputs lose their beginning, since the score is
  read at the last token).

Not here: pairwise or generative judges, or training a reward model.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Annotated, Literal

from r1kit.errors import RewardError
from r1kit.hardware import has_gpu
from r1kit.reward_registry import POSITIVE, REQUIRED

TEXTS = ("summary", "full")
NORMALIZE = ("none", "sigmoid")


@contextlib.contextmanager
def whole_weights():
    """Inside: `from_pretrained` loads a whole model on this process, whatever sharded training
    has switched on (transformers' ZeRO-3 config, FSDP's rank-0-only CPU loading)."""
    from transformers.integrations import deepspeed

    saved_env = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")
    ref = deepspeed._hf_deepspeed_config_weak_ref
    zero3 = ref() if ref is not None else None
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
        else:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved_env
        if zero3 is not None:
            deepspeed.set_hf_deepspeed_config(zero3)


@functools.lru_cache(maxsize=2)
def load(model: str):
    """(tokenizer, model) for `model`, loaded once per process."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    # Right padding; left truncation keeps the end of the response, where the score is read.
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with whole_weights():
        rm = AutoModelForSequenceClassification.from_pretrained(model, dtype="auto")
    if rm.config.num_labels != 1:
        raise RewardError(f"reward_model: {model} has {rm.config.num_labels} outputs; a reward model has one (num_labels=1)")
    # The score is read at the last token that is not padding: the model must know the pad id.
    rm.config.pad_token_id = tokenizer.pad_token_id
    device = "cuda" if has_gpu() else "cpu"
    return tokenizer, rm.to(device).eval()


def summary(text: str) -> str:
    """The text after the last ``</think>``; the whole text when there is none."""
    return text.rpartition("</think>")[2].strip() if "</think>" in text else text


def reward_model(
    completions: list[str],
    *,
    model: Annotated[str, REQUIRED] = "",
    text: Literal["summary", "full"] = "summary",
    prompt_column: str = "prompt",
    normalize: Literal["none", "sigmoid"] = "none",
    batch_size: Annotated[int, POSITIVE] = 8,
    max_length: Annotated[int, POSITIVE] = 4096,
    **columns,
) -> list[float]:
    """Score of a sequence-classification reward model for the summary (or the full completion).

    `model` is a folder or hub id (num_labels=1); `text` is "summary" (after ``</think>``, as R1
    judges helpfulness) or "full"; `normalize` is "none" (raw) or "sigmoid".
    """
    import torch

    if not model:
        raise RewardError("reward_model: set `model` to a reward model's folder or hub id")
    if text not in TEXTS:
        raise RewardError(f"reward_model: text must be one of {TEXTS}, got {text!r}")
    if normalize not in NORMALIZE:
        raise RewardError(f"reward_model: normalize must be one of {NORMALIZE}, got {normalize!r}")
    tokenizer, rm = load(model)
    responses = [summary(c) if text == "summary" else c for c in completions]
    questions = columns.get(prompt_column) or [None] * len(completions)
    inputs = []
    for question, response in zip(questions, responses):
        turns = ([{"role": "user", "content": question}] if question is not None else []) + [{"role": "assistant", "content": response}]
        if tokenizer.chat_template:
            inputs.append(tokenizer.apply_chat_template(turns, tokenize=False))
        else:
            inputs.append(response if question is None else f"{question}\n\n{response}")
    scores: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            enc = tokenizer(
                inputs[start : start + batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=max_length,
                add_special_tokens=not tokenizer.chat_template,  # a chat template writes its own BOS
            ).to(rm.device)
            scores += rm(**enc).logits[:, 0].float().tolist()
    if normalize == "sigmoid":
        scores = [1.0 / (1.0 + math.exp(-s)) for s in scores]
    return scores
