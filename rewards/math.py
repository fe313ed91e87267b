"""Math accuracy reward: is the completion's final answer equal to the reference answer?

    rewards: [{name: math_accuracy, weight: 1.0, fallback: last_number, timeout: 5.0}]

    from r1kit.rewards.math import math_accuracy
    math_accuracy(["<think>half</think> <answer>\\frac12</answer>"], answer=["0.5"])   # [1.0]

Public names:

- ``math_accuracy(completions, *, answer_column="answer", fallback="none", timeout=5.0, **columns)``:
  1.0 / 0.0 per completion; ``None`` for the samples whose reference cannot be parsed (logged),
  so a trainer skips them instead of teaching them as wrong.
- The final answer is found by ``r1kit.text.extract_answer`` (the last ``<answer>`` block, else
  the last complete ``\\boxed{}`` with the boxes listed right before it, else with
  ``fallback="last_number"`` the last number). Several boxes (``\\boxed{1}, \\boxed{2}``) are one
  list answer, compared with the reference as a set.
- ``equivalent(gold, pred, timeout=5.0) -> bool`` and ``equivalent_batch(pairs, timeout=5.0)``:
  the same verifier on extracted answer strings (e.g. to cluster answers for cons@k). As in
  math-verify the check is not symmetric: the first string plays the reference.

How an answer is judged. Cheap checks run first in the calling process and answer only when
certain: strings equal after light normalisation (spacing, ``$…$``, ``\\dfrac``, ``\\left``,
a whole-string ``\\text{}``) are equal; numbers and fractions with the same exact value
(``3/4``, ``\\frac{6}{8}``, ``0.75``) are equal; a percentage equals its number and its share
(``35.0\\%`` is 35 and 0.35); two plain integers (``025``, ``1,450,000``, ``1{,}450``, ``1\\,450``,
``1 450``) are compared as integers, the only check that may say "different". The rest goes
to math-verify (``parse`` + ``verify``) in r1kit.rewards.math_pool, where a formula with
``\\pm`` is the list of its two values (``2 \\pm \\sqrt{3}`` is ``2 + \\sqrt{3}, 2 - \\sqrt{3}``) and
whose workers have a hard time limit from any thread: a reference parse or an answer check that
takes longer than ``timeout`` seconds has its worker killed and replaced; the answer scores 0.0
(the reference's samples None). A reference is parsed once per worker (cached); identical
answers to it are judged once.

Where math-verify's verdict differs from a careful grader's, r1kit keeps it (see the tests): a
bare list ``1,2`` is a set, so ``2,1`` matches; an ambiguous ``(1,2)`` (interval or pair) matches
``\\{1,2\\}``; ``50\\%`` matches ``50`` and ``0.5``; decimals agree to 6 places (``0.333`` is not 1/3).

What it does not do: it is no sandbox (math-verify and SymPy run on model text with the user's
rights and no memory limit; the pathological inputs in the tests stay under ~300 MB within the
default time limit); it grades no proofs and no free text beyond math-verify's string match;
``\\boxed 5`` without braces is not recognised. Scripts that call it need the usual
``if __name__ == "__main__":`` guard, as with any multiprocessing that does not fork.
"""

from __future__ import annotations

import logging
import math
import re
from fractions import Fraction
from typing import Annotated

from r1kit.errors import RewardError
from r1kit.reward_registry import POSITIVE
from r1kit.rewards import math_pool
from r1kit.text import Fallback, extract_answer

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Fast paths (calling process): only "certainly equal", or "different" for two plain integers

_SPACING = re.compile(r"\\[,;:! ]|~")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\{([^{}]*)\}")
_INTEGER = re.compile(r"([-+]?)(\d{1,3}(?:,\d{3})+|\d+)")
_SPACED = re.compile(r"[-+]?\d{1,3}(?: \d{3})+")
_PERCENT = re.compile(r"(.+?)\s*\\?%")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _normalise(s: str) -> str:
    """Rewrite `s` only in ways that cannot change which answer it denotes."""
    s = s.strip()
    for left, right in _DELIMITERS:
        inner = s[len(left) : -len(right)]
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right) and left not in inner:
            s = inner.strip()
            break
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    # 1{,}450, 1\,450, 1\ 450, 1~450 and 1 450 (thin spaces too) are 1,450.
    s = re.sub(r"(?<=\d)(?:\{,\}|\\[, ]|~|[\u2009\u202f])(?=\d{3}(?!\d))", ",", s)
    if _SPACED.fullmatch(s):
        s = s.replace(" ", ",")
    s = _SPACING.sub(" ", s)
    wrapped = _TEXT_WRAP.fullmatch(s)
    if wrapped:
        s = wrapped.group(1)
    s = re.sub(r"\s+", " ", s).strip()
    # A comma right between a digit and three more is a thousands comma (1,450); any other comma
    # separates list items and is written ", ": `(1,2)` and `(1, 2)` compare equal, while `3, 125`
    # stays a list of two numbers, never the thousands-grouped 3,125.
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "\0", s)
    s = re.sub(r" ?, ?", ", ", s).replace("\0", ",")
    # A space matters only between two letters/digits (`\pi r` is not `\pir`, `1 2` is not `12`)
    # and after a list comma.
    s = re.sub(r" (?=[^A-Za-z0-9])|(?<=[^A-Za-z0-9,]) ", "", s)
    return s.rstrip(".")


def _as_integer(s: str) -> str | None:
    """Canonical digits of a plain integer (``-025`` -> ``-25``, ``1,450`` -> ``1450``), else None.
    Kept as a string: Python refuses int() on very long digit strings."""
    m = _INTEGER.fullmatch(s)
    if not m:
        return None
    digits = m.group(2).replace(",", "").lstrip("0") or "0"
    return digits if digits == "0" or m.group(1) != "-" else "-" + digits


_RATIONAL = re.compile(
    r"(?P<sign>[-+]?)(?:(?P<dec>\d*\.\d+|\d+)|(?P<num>\d+)/(?P<den>\d+)"
    r"|\\frac(?:\{(?P<fnum>\d+)\}\{(?P<fden>\d+)\}|(?P<dnum>\d)(?P<dden>\d)))"
)


def _as_rational(s: str) -> Fraction | None:
    """The exact value of a short plain number, decimal or fraction (``-\\frac{3}{4}``, ``0.75``)."""
    m = _RATIONAL.fullmatch(s) if len(s) <= 40 else None
    if not m:
        return None
    if m["dec"]:
        value = Fraction(m["dec"])
    else:
        num, den = (m["num"], m["den"]) if m["num"] else (m["fnum"], m["fden"]) if m["fnum"] else (m["dnum"], m["dden"])
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
    return -value if m["sign"] == "-" else value


def _as_percent(s: str) -> Fraction | None:
    """The number of a plain percentage (``35.0\\%`` -> 35), else None."""
    m = _PERCENT.fullmatch(s)
    return _as_rational(m.group(1)) if m else None


def _fast_verdict(ref_norm: str, ref_int: str | None, pred: str) -> bool | None:
    pred_norm = _normalise(pred)
    if pred_norm and pred_norm == ref_norm:
        return True
    pred_int = _as_integer(pred_norm)
    if ref_int is not None and pred_int is not None:
        return ref_int == pred_int
    # Equal exact values are equal for math-verify too; unequal ones may still match there
    # (it rounds decimals to 6 places), so only "equal" is answered here.
    ref_value, pred_value = _as_rational(ref_norm), _as_rational(pred_norm)
    if ref_value is not None and ref_value == pred_value:
        return True
    # A percentage is its number or its share, on either side: 35.0\% is 35 and 0.35 (math-verify
    # takes whole percentages only).
    for percent, other in ((_as_percent(pred_norm), ref_value), (_as_percent(ref_norm), pred_value)):
        if percent is not None and other is not None and other in (percent, percent / 100):
            return True
    return None  # not certain: ask math-verify


# ---------------------------------------------------------------------------------------------
# Judging a batch


def _judge(refs: list[str | None], answers: list[str | None], timeout: float) -> list[bool | None]:
    """Verdict per (reference, answer): True/False, or None when the reference is unparseable."""
    if not timeout > 0:
        raise RewardError(f"timeout must be a positive number of seconds, got {timeout!r}")
    out: list[bool | None] = [False] * len(refs)
    groups: dict[str | None, list[int]] = {}
    for i, ref in enumerate(refs):
        groups.setdefault(ref, []).append(i)

    jobs: list[math_pool.Job] = []
    copies: dict[int, list[int]] = {}  # first sample with an answer -> all samples with it
    for ref, members in groups.items():
        if ref is None or not ref.strip():
            logger.warning("math_accuracy: empty reference; its %d samples are skipped", len(members))
            for i in members:
                out[i] = None
            continue
        ref_norm = _normalise(ref)
        ref_int = _as_integer(ref_norm)
        unique: dict[str, list[int]] = {}  # identical answers among the G samples: judge once
        for i in members:
            answer = answers[i]
            if answer is None:
                continue  # no answer: 0.0, unless the reference turns out unparseable
            fast = _fast_verdict(ref_norm, ref_int, answer)
            if fast is None:
                unique.setdefault(answer, []).append(i)
            else:
                out[i] = fast
        # A reference that is not a plain number goes to a worker at least to learn whether
        # math-verify can parse it: if not, the whole group is skipped, fast verdicts included.
        if unique or (ref_int is None and _as_rational(ref_norm) is None):
            jobs.append(math_pool.Job(ref, list(unique), [same[0] for same in unique.values()]))
            copies.update((same[0], same) for same in unique.values())

    # Few big groups (evaluation, or one slow group) would leave workers idle: cut them so that
    # there are about two jobs per worker. Each piece re-parses its reference (cached per worker).
    size = max(1, math.ceil(sum(len(j.answers) for j in jobs) / (2 * math_pool.MAX_WORKERS)))
    jobs = [
        math_pool.Job(j.ref, j.answers[k : k + size], j.keys[k : k + size])
        for j in jobs
        for k in range(0, max(1, len(j.answers)), size)
    ]
    ref_ok, verdicts = math_pool.run(jobs, timeout) if jobs else ({}, {})
    for key, verdict in verdicts.items():
        for i in copies[key]:
            out[i] = verdict
    for ref in dict.fromkeys(j.ref for j in jobs):  # once per reference, in batch order
        if ref_ok[ref] is not True:
            if ref_ok[ref] is False:  # None: the worker failed, already logged
                logger.warning("math_accuracy: reference %.80r cannot be parsed; its samples are skipped", ref)
            for i in groups[ref]:
                out[i] = None
    return out


def math_accuracy(
    completions: list[str],
    *,
    answer_column: str = "answer",
    fallback: Fallback = "none",
    timeout: Annotated[float, POSITIVE] = 5.0,
    **columns,
) -> list[float | None]:
    """1.0 when the completion's final answer equals the reference answer (math-verify), else 0.0.

    `answer_column` names the dataset column holding the references; `fallback="last_number"`
    also accepts the last number of a completion that has no ``<answer>`` block or ``\\boxed{}``;
    `timeout` is the hard limit in seconds for parsing a reference or checking one answer.
    Samples whose reference cannot be parsed score None.
    """
    if answer_column not in columns:
        raise RewardError(
            f"math_accuracy needs the dataset column {answer_column!r} with the reference answers; "
            f"columns given: {sorted(columns) or 'none'} (set answer_column to the right one)"
        )
    refs = [None if r is None else str(r) for r in columns[answer_column]]
    answers = [extract_answer(c, fallback) for c in completions]
    return [None if v is None else float(v) for v in _judge(refs, answers, timeout)]


math_accuracy.bounds = (0.0, 1.0)


def equivalent_batch(pairs: list[tuple[str, str]], timeout: float = 5.0) -> list[bool]:
    """For each ``(gold, pred)`` pair of answer strings, whether pred equals gold; an unparseable
    or timed-out gold gives False."""
    verdicts = _judge([g for g, _ in pairs], [p for _, p in pairs], timeout)
    return [v is True for v in verdicts]


def equivalent(gold: str, pred: str, timeout: float = 5.0) -> bool:
    """Whether answer string `pred` equals answer string `gold` (see `equivalent_batch`)."""
    return equivalent_batch([(gold, pred)], timeout)[0]
