"""The pretraining corpus of r1kit's tiny base model: free text in which reasoning occurs, rarely.

`documents(n, seed)` writes `n` short documents about the four-term sums of r1kit.tasks'
`last_digit` ("What is the last digit of ((3 + 4) + 8) + 9?"), the way the web holds arithmetic:
most of them state an answer at once, mostly in the same words; some work it out step by step
(``3+4=7 , 7+8=15 , 5+9=14``); a few of those check a result or catch and correct a wrong step
in free text ("Wait, 7+8=15 , not 16"). Some are set as two people's lines ("Ann: … Bob: …").
Answer-key pages mark an answer up as ``<answer> 4 </answer>`` (after the question or after the
working) and notes mark a writer's working as ``<think> … </think>`` with the answer said in
prose after it, as markup occurs on the web. The shares are in `MIX`.
`pretrain(model, tokenizer, steps)` trains a model on them.

It is a stand-in for a base model's pretraining data, not an instruction set: the R1-Zero prompt
template never occurs in it (no "User:"/"Assistant:" turns, no line of the template's preamble),
no ``<think>`` block is ever followed by an ``<answer>`` block, and the puzzles come from the
training split only (the held-out problems of `task:last_digit` are never in it). A model
pretrained on it has seen reasoning and reflection but, asked a question, mostly answers at
once: what GRPO with only accuracy and format rewards can find and grow (R1-Zero).

Not here: building the model (r1kit.tiny, ``tiny_model: {pretrain_steps: N}``) and the tasks' own
demonstrations (r1kit.tasks).
"""

from __future__ import annotations

import random

from r1kit.tasks import _is_test, chain_of_digits

#: Share of each kind of answer (they sum to 1).
MIX = {"direct": 0.60, "worked": 0.15, "noted": 0.06, "checked": 0.04, "corrected": 0.03, "answer_key": 0.12}
#: Share of documents set as two people's lines ("Ann: <question> Bob: <answer>").
DIALOGUE = 0.4
#: The corpus's puzzles, as `task:last_digit`'s `terms` and `ops`: sums of four one-digit numbers.
TERMS, OPS = 4, "+"

_ASK = ["What is the last digit of {e}?", "Find the last digit of {e}.", "The last digit of {e}?"]
#: How an answer is said, and how often: one phrasing dominates, as on the web (and so a question
#: is more often answered at once: the first words of a direct answer are more alike than a
#: working's first numbers).
_SAY = {"The last digit is {v}.": 6, "It is {v}.": 1, "Answer: {v}.": 1}
_CHECK = ["Let me check: {s} . Yes.", "To verify, again: {s} . Right."]
_FIX = ["Wait, that is wrong: {r}", "Wait, {r} , not {w}", "That was a mistake, {r}"]
_NAMES = ["Ann", "Bob", "Maria", "Li", "Tom", "Sara", "Teacher", "Student", "Kim", "Omar"]


def _puzzle(rng: random.Random) -> tuple[str, list, int]:
    """A training-split puzzle of `TERMS` and `OPS`: (expression, steps, answer)."""
    while True:
        key, expr, steps, value = chain_of_digits(rng, TERMS, OPS)
        if not _is_test(key):
            return expr, steps, value


def _fmt(steps) -> str:
    return " , ".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)


def document(kind: str, rng: random.Random) -> str:
    """One document whose answer is of `kind` (a key of `MIX`): the question and the answer, as
    prose or as two people's lines."""
    expr, steps, value = _puzzle(rng)
    ask = rng.choice(_ASK).format(e=expr)
    reply = _answer(kind, rng, steps, value)
    if rng.random() < DIALOGUE:
        asker, answerer = rng.sample(_NAMES, 2)
        return f"{asker}: {ask} {answerer}: {reply}"
    return f"{ask} {reply}"


def _answer(kind: str, rng: random.Random, steps, value: int) -> str:
    say = rng.choices(list(_SAY), list(_SAY.values()))[0].format(v=value)
    if kind == "direct":
        return say
    if kind == "answer_key":  # half of them show the working before the marked-up answer
        return f"{_fmt(steps) + ' . ' if rng.random() < 0.5 else ''}<answer> {value} </answer>"
    if kind == "noted":  # a writer's working marked up as thought, the answer said in prose
        return f"<think> {_fmt(steps)} </think> {say}"
    if kind == "worked":
        return f"{_fmt(steps)} . {say}"
    if kind == "checked":
        return f"{_fmt(steps)} . {rng.choice(_CHECK).format(s=_fmt(steps[-1:]))} {say}"
    if kind == "corrected":
        i = rng.randrange(len(steps))
        a, op, b, r = steps[i]
        wrong = r + rng.choice([-1, 1]) if r > 0 else 1
        before = _fmt(steps[:i] + [(a, op, b, wrong)])
        fix = rng.choice(_FIX).format(r=f"{a}{op}{b}={r}", w=wrong)
        after = f" , {_fmt(steps[i + 1:])}" if i + 1 < len(steps) else ""
        return f"{before} . {fix}{after} . {say}"
    raise ValueError(f"unknown document kind {kind!r}; kinds: {', '.join(MIX)}")


def documents(n: int, seed: int = 0) -> list[str]:
    """`n` documents drawn by the shares of `MIX`; same `n` and `seed`, same documents."""
    rng = random.Random(f"corpus-{seed}")
    kinds, weights = list(MIX), list(MIX.values())
    return [document(rng.choices(kinds, weights)[0], rng) for _ in range(n)]


def pretrain(model, tokenizer, steps: int, batch_size: int = 64, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Next-token prediction on `documents`, one document a row (each ends with the tokenizer's eos
    token; rows are padded, never packed, so a document cannot read another), AdamW with a linear
    warm-up and a cosine decay over `steps` steps of `batch_size` documents. Trains `model` in
    place; returns the loss every 50 steps (logged as it goes)."""
    import logging
    import math

    import torch

    log = logging.getLogger(__name__)
    texts = documents(steps * batch_size, seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))
    )
    model.train()
    losses = []
    for step in range(steps):
        batch = tokenizer([t + tokenizer.eos_token for t in texts[step * batch_size : (step + 1) * batch_size]], padding=True, return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(**batch, labels=labels).loss  # the model shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            losses.append(round(loss.item(), 4))
            log.info("pretraining the tiny base model: step %d/%d, loss %.3f", step + 1, steps, loss.item())
    model.eval()
    return losses
