"""The pretraining corpus of r1kit's tiny base model: free text in which reasoning occurs, rarely.

`documents(n, seed)` writes `n` short documents about the four-term sums of r1kit.offline.tasks'
`last_digit` ("What is the last digit of ((3 + 4) + 8) + 9?"), of two sorts, as the web holds
arithmetic:

- Worked exercises, with no one asking: "Work out ((3 + 4) + 8) + 9 : 3+4=7 , 7+8=15 , 5+9=14 .
  The last digit is 4." A few check a step or catch and correct a wrong one in free text
  ("Wait, 7+8=15 , not 16"). Here the skill is learned.
- Questions and their answers. Most are answered at once, mostly by restating the sum ("The last
  digit of ((3 + 4) + 8) + 9 is 4."); some by an answer key (``<answer> 4 </answer>``); a few by
  a writer who answers at once, then stops to check by working the sum out, and gives the answer
  the working finds ("The last digit of ((3 + 4) + 8) + 9 is 7. Wait, let me check ((3 + 4) + 8)
  + 9 : 3+4=7 , 7+8=15 , 5+9=14 . The last digit is 4."). The quick answer is a random digit
  (right one time in ten): a sum of four terms said at once is a guess for this model. The check
  restates the sum right after the quick answer did, as a model this small copies numbers by
  their distance, and that distance is short. Some are set as two people's lines ("Ann: … Bob:
  …").

The shares are in `MIX`. A model pretrained on it can work a sum out, and asked a question it
answers at once nearly always: it works the sum out only to check a quick answer, and rarely.
`pretrain(model, tokenizer, steps)` trains a model on it.

It is a stand-in for a base model's pretraining data, not an instruction set: the R1-Zero prompt
template never occurs in it (no "User:"/"Assistant:" turns, no line of the template's preamble,
no ``<think>`` tag), and the puzzles come from the training split only (the held-out problems of
`task:last_digit` are never in it). What GRPO with only accuracy and format rewards can find in
a model pretrained on it, and grow, is the rare check (R1-Zero's "aha moment").

Not here: building the model (r1kit.offline.tiny, ``tiny_model: {pretrain_steps: N}``) and the tasks' own
demonstrations (r1kit.offline.tasks).
"""

from __future__ import annotations

import random

from r1kit.offline.tasks import _is_test, chain_of_digits

#: Share of each kind of document (they sum to 1): worked exercises (plain, checked, corrected)
#: and questions (answered at once, by an answer key, or at once and then rechecked).
MIX = {"worked": 0.20, "checked": 0.03, "corrected": 0.03, "direct": 0.60, "answer_key": 0.08, "rechecked": 0.06}
EXERCISES = ("worked", "checked", "corrected")
#: Share of questions set as two people's lines ("Ann: <question> Bob: <answer>").
DIALOGUE = 0.4
#: The corpus's puzzles, as `task:last_digit`'s `terms` and `ops`: sums of four one-digit numbers.
TERMS, OPS = 4, "+"

_ASK = ["What is the last digit of {e}?", "Find the last digit of {e}.", "The last digit of {e}?"]
_EXERCISE = ["Work out {e} :", "Sum {e} :", "Exercise. {e} :"]
#: How an answer given at once is said, and how often: one phrasing dominates, as on the web.
_SAY = {"The last digit of {e} is {v}.": 5, "The last digit is {v}.": 1, "It is {v}.": 1, "Answer: {v}.": 1}
#: How the answer a working found is said.
_CONCLUDE = {"The last digit is {v}.": 6, "It is {v}.": 1, "Answer: {v}.": 1}
_RECHECK = ["Wait, let me check", "Wait, let me verify", "Wait, check"]
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


def _pick(rng: random.Random, weighted: dict, **fields) -> str:
    return rng.choices(list(weighted), list(weighted.values()))[0].format(**fields)


def document(kind: str, rng: random.Random) -> str:
    """One document of `kind` (a key of `MIX`): an exercise, or a question and its answer as prose
    or as two people's lines."""
    if kind not in MIX:
        raise ValueError(f"unknown document kind {kind!r}; kinds: {', '.join(MIX)}")
    expr, steps, value = _puzzle(rng)
    # Drawn for every kind, used by exercises and checks only: drawing it only where it is used
    # would change every seed's corpus, and with it the base models the docs measure.
    conclusion = _pick(rng, _CONCLUDE, v=value)
    if kind in EXERCISES:
        return f"{rng.choice(_EXERCISE).format(e=expr)} {_working(kind, rng, steps)} {conclusion}"
    ask = rng.choice(_ASK).format(e=expr)
    if kind == "direct":
        reply = _pick(rng, _SAY, e=expr, v=value)
    elif kind == "answer_key":
        reply = f"<answer> {value} </answer>"
    else:  # rechecked: a quick answer, then the sum worked out as an exercise, and what that finds
        guess = f"The last digit of {expr} is {rng.randrange(10)}."
        reply = f"{guess} {rng.choice(_RECHECK)} {expr} : {_fmt(steps)} . {conclusion}"
    if rng.random() < DIALOGUE:
        asker, answerer = rng.sample(_NAMES, 2)
        return f"{asker}: {ask} {answerer}: {reply}"
    return f"{ask} {reply}"


def _working(kind: str, rng: random.Random, steps) -> str:
    if kind == "checked":
        return f"{_fmt(steps)} . {rng.choice(_CHECK).format(s=_fmt(steps[-1:]))}"
    if kind == "corrected":
        i = rng.randrange(len(steps))
        a, op, b, r = steps[i]
        wrong = r + rng.choice([-1, 1]) if r > 0 else 1
        before = _fmt(steps[:i] + [(a, op, b, wrong)])
        fix = rng.choice(_FIX).format(r=f"{a}{op}{b}={r}", w=wrong)
        after = f" , {_fmt(steps[i + 1:])}" if i + 1 < len(steps) else ""
        return f"{before} . {fix}{after} ."
    return f"{_fmt(steps)} ."


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
