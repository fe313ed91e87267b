"""What a reward model reads: a response rendered with its question through the reward model's chat
template, the token ids that text becomes, and the scores a model in this process gives them.
The `reward_model` reward (rewards/reward_model.py) scores these ids, in process or served, and
the `reward` stage (r1kit.stages.reward) trains on the very same ids and scores its held-out
pairs with `scores`.

Not here: served scoring (rewards/reward_model.py), training.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=2)
def tokenizer_of(model: str):
    """`model`'s tokenizer, loaded once per process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    # Right padding; left truncation keeps the end of the response, where the score is read.
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def summary(text: str) -> str:
    """The text after the last ``</think>``; the whole text when there is none."""
    return text.rpartition("</think>")[2].strip() if "</think>" in text else text


def rendered(tokenizer, completions: list[str], text: str, questions: list) -> list[str]:
    """The texts the reward model reads: [user: question, assistant: response] through the chat template."""
    out = []
    for question, completion in zip(questions, completions):
        response = summary(completion) if text == "summary" else completion
        turns = ([{"role": "user", "content": question}] if question is not None else []) + [{"role": "assistant", "content": response}]
        if tokenizer.chat_template:
            out.append(tokenizer.apply_chat_template(turns, tokenize=False))
        else:
            out.append(response if question is None else f"{question}\n\n{response}")
    return out


def encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """The token ids the reward model scores for `texts` (`rendered`), the end kept where they are
    too long; in process, served, and in r1kit's reward stage, which trains on these very ids."""
    special = not tokenizer.chat_template  # a chat template writes its own BOS
    return [tokenizer(t, truncation=True, max_length=max_length, add_special_tokens=special)["input_ids"] for t in texts]


def scores(model, tokenizer, ids: list[list[int]], batch_size: int = 32) -> list[float]:
    """`model`'s score (its one logit) for each sequence of `ids`, in batches, right-padded."""
    import torch

    out: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(ids), batch_size):
            enc = tokenizer.pad({"input_ids": ids[start : start + batch_size]}, return_tensors="pt").to(model.device)
            out += model(**enc).logits[:, 0].float().tolist()
    return out
