"""Math accuracy reward: is the completion's final answer equal to the reference answer?

    rewards: [{name: math_accuracy, weight: 1.0, fallback: last_number, timeout: 5.0}]

    from r1kit.rewards.math import math_accuracy
    math_accuracy(["<think>half</think> <answer>\\frac12</answer>"], answer=["0.5"])   # [1.0]

Public names:

- ``math_accuracy(completions, *, answer_column="answer", fallback="none", timeout=5.0, **columns)``:
  1.0 / 0.0 per completion; ``None`` for the samples whose reference cannot be parsed (logged),
  so a trainer skips them instead of teaching them as wrong.
- The final answer is found by ``r1kit.text.extract_answer`` (the last ``<answer>`` block, else
  the last complete ``\\boxed{}``, else with ``fallback="last_number"`` the last number).
- ``equivalent(gold, pred, timeout=5.0) -> bool`` and ``equivalent_batch(pairs, timeout=5.0)``:
  the same verifier on extracted answer strings (e.g. to cluster answers for cons@k). As in
  math-verify the check is not symmetric: the first string plays the reference.

How an answer is judged. Cheap checks run first in the calling process and answer only when
certain: strings equal after light normalisation (spacing, ``$…$``, ``\\dfrac``, ``\\left``,
a whole-string ``\\text{}``) are equal; numbers and fractions with the same exact value
(``3/4``, ``\\frac{6}{8}``, ``0.75``) are equal; two plain integers (``025``, ``1,450,000``,
``1{,}450``) are compared as integers, the only check that may say "different". The rest goes
to math-verify (``parse`` + ``verify``) in a pool of worker processes. math-verify's own time
limit uses SIGALRM, which works only on the main thread (elsewhere it raises), so r1kit turns it
off and enforces its own: a reference parse or an answer check that takes longer than
``timeout`` seconds has its worker killed and replaced; the answer scores 0.0 (the reference's
samples None). The pool (``forkserver``, math-verify preloaded, one worker per usable core up
to 16) starts lazily, is reused across calls and works from any thread (calls are serialised).
A reference is parsed once per worker (cached); identical answers to it are judged once.

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
import multiprocessing
import os
import re
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from multiprocessing.connection import Connection, wait as wait_for_messages

from r1kit.errors import RewardError
from r1kit.text import BRACE, extract_answer

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Fast paths (calling process): only "certainly equal", or "different" for two plain integers

_SPACING = re.compile(r"\\[,;:! ]|~")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\{([^{}]*)\}")
_INTEGER = re.compile(r"([-+]?)(\d{1,3}(?:,\d{3})+|\d+)")
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
    s = re.sub(r"(?<=\d)(?:\{,\}|\\,)(?=\d{3}(?!\d))", ",", s)  # 1{,}450 and 1\,450 are 1,450
    s = _SPACING.sub(" ", s)
    wrapped = _TEXT_WRAP.fullmatch(s)
    if wrapped:
        s = wrapped.group(1)
    s = re.sub(r"\s+", " ", s).strip()
    # A space matters only between two letters/digits (`\pi r` is not `\pir`, `1 2` is not `12`).
    s = re.sub(r" (?=[^A-Za-z0-9])|(?<=[^A-Za-z0-9]) ", "", s)
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


def _fast_verdict(ref_norm: str, ref_int: str | None, pred: str) -> bool | None:
    pred_norm = _normalise(pred)
    if pred_norm and pred_norm == ref_norm:
        return True
    pred_int = _as_integer(pred_norm)
    if ref_int is not None and pred_int is not None:
        return ref_int == pred_int
    # Equal exact values are equal for math-verify too; unequal ones may still match there
    # (it rounds decimals to 6 places), so only "equal" is answered here.
    ref_value = _as_rational(ref_norm)
    if ref_value is not None and ref_value == _as_rational(pred_norm):
        return True
    return None  # not certain: ask math-verify


# ---------------------------------------------------------------------------------------------
# Worker side: math-verify with its own SIGALRM time limit off (the parent enforces ours)

_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_COMMAND = re.compile(r"\\[A-Za-z]+(?:\{[^{}]*\})?")


@lru_cache(maxsize=1024)
def _parse(answer: str) -> list:
    """math-verify's parse of an extracted answer string.

    math-verify finds LaTeX only inside delimiters (``$…$``, ``\\boxed{}``), so a bare answer is
    wrapped in ``\\boxed{}``. An answer with its own delimiters, or with words in it ("72 clips",
    "The answer is 5"), is first given to math-verify as is, so that its anchors pick the math;
    an answer with unbalanced braces is only given as is.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    balanced = _balanced(answer)
    if not balanced or any(d in answer for d in ("$", "\\(", "\\[", "\\boxed")) or _PROSE.search(_COMMAND.sub(" ", answer)):
        parsed = parse(answer, config, parsing_timeout=None)
        # Wrapping an unbalanced answer would let the wrapper's brace close it: `\frac{1}{2`
        # must not become `\boxed{\frac{1}{2}` = 1/2.
        if _has_math(parsed) or not balanced:
            return parsed
    return parse("\\boxed{" + answer + "}", config, parsing_timeout=None)


def _balanced(s: str) -> bool:
    depth = 0
    for m in BRACE.finditer(s):
        depth += 1 if m.group() == "{" else -1
        if depth < 0:
            return False
    return depth == 0


def _has_math(parsed: list) -> bool:
    from sympy import Basic, MatrixBase

    return any(isinstance(p, (Basic, MatrixBase)) for p in parsed)


def _worker_main(conn) -> None:
    """Judge jobs ``(reference, [answers])`` until the parent closes the pipe, replying
    ``("ref", parsed_ok)`` then ``("item", verdict)`` per answer: the parent times each step."""
    from math_verify import verify

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # The "timeout is disabled" warning is expected: the parent enforces the limit.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    conn.send(("ready",))
    while True:
        try:
            ref, answers = conn.recv()
        except EOFError:
            return
        gold = _parse(ref)
        ok = _has_math(gold)
        conn.send(("ref", ok))
        if ok:
            for answer in answers:
                conn.send(("item", bool(verify(gold, _parse(answer), timeout_seconds=None))))


# ---------------------------------------------------------------------------------------------
# The pool (calling process)

_CTX = multiprocessing.get_context("forkserver")
# Workers fork from a server that has already imported SymPy and math-verify: a replacement
# for a killed worker starts in milliseconds instead of seconds.
_CTX.set_forkserver_preload(["math_verify", "r1kit.rewards.math"])
MAX_WORKERS = max(1, min(len(os.sched_getaffinity(0)), 16))
_START_TIMEOUT = 120.0  # a worker that cannot start in this time is a broken install, not a slow item
_LOCK = threading.Lock()
_POOL: list[_Worker] = []
_POOL_PID = os.getpid()


@dataclass
class _Job:
    ref: str
    answers: list[str]
    keys: list[int]  # where each verdict goes


@dataclass
class _Worker:
    proc: multiprocessing.process.BaseProcess
    conn: Connection
    started: float
    ready: bool = False
    job: _Job | None = None
    ref_done: bool = False
    pos: int = 0  # answers of `job` already judged
    deadline: float = 0.0

    @classmethod
    def start(cls) -> _Worker:
        parent_end, child_end = _CTX.Pipe()
        proc = _CTX.Process(target=_worker_main, args=(child_end,), daemon=True, name="r1kit-math")
        proc.start()
        child_end.close()
        return cls(proc=proc, conn=parent_end, started=time.monotonic())

    def assign(self, job: _Job, timeout: float) -> None:
        self.job, self.ref_done, self.pos = job, False, 0
        self.deadline = time.monotonic() + timeout
        self.conn.send((job.ref, job.answers))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def _run(jobs: list[_Job], timeout: float) -> tuple[dict[str, bool | None], dict[int, bool]]:
    """Judge `jobs` in the pool: whether each reference parsed (None: its worker failed), and
    each answer's verdict by key."""
    global _POOL, _POOL_PID
    ref_ok: dict[str, bool | None] = {}
    verdicts: dict[int, bool] = {}
    queue = deque(jobs)
    with _LOCK:
        if _POOL_PID != os.getpid():  # a forked child must not talk to its parent's workers
            _POOL, _POOL_PID = [], os.getpid()
        try:
            while queue or any(w.job for w in _POOL):
                _step(queue, timeout, ref_ok, verdicts)
        except BaseException:
            # Interrupted mid-batch: busy workers would answer stale jobs in the next call.
            for w in [w for w in _POOL if w.job]:
                w.kill()
                _POOL.remove(w)
            raise
    return ref_ok, verdicts


def _step(queue: deque, timeout: float, ref_ok: dict, verdicts: dict) -> None:
    for w in list(_POOL):
        if w.ready and w.job is None and queue:
            try:
                w.assign(queue.popleft(), timeout)
            except OSError:  # it died while idle (e.g. killed for memory): replace it, keep the job
                queue.appendleft(w.job)
                w.job = None
                _fail(w, queue, ref_ok, verdicts, "")
    starting = sum(not w.ready for w in _POOL)
    for _ in range(min(len(queue) - starting, MAX_WORKERS - len(_POOL))):
        _POOL.append(_Worker.start())

    now = time.monotonic()
    waiting = [w for w in _POOL if w.job or not w.ready]
    wake = min([w.deadline for w in waiting if w.job] + [w.started + _START_TIMEOUT for w in waiting if not w.ready])
    by_conn = {w.conn: w for w in waiting}
    for conn in wait_for_messages(list(by_conn), timeout=max(0.0, wake - now)):
        w = by_conn[conn]
        try:
            message = conn.recv()
        except (EOFError, OSError):
            if not w.ready:
                _fail(w, queue, ref_ok, verdicts, "")
                raise RuntimeError(
                    f"a math_accuracy worker exited during start-up (exit code {w.proc.exitcode}); "
                    "see its error above. Scripts that call math_accuracy need an "
                    "`if __name__ == '__main__':` guard (workers start with 'forkserver')"
                ) from None
            _fail(w, queue, ref_ok, verdicts, "its worker process died")
            continue
        if message[0] == "ready":
            w.ready = True
        elif message[0] == "ref":
            w.ref_done = True
            # A reference cut into several jobs is parsed by each; any failure is final.
            ref_ok[w.job.ref] = message[1] and ref_ok.get(w.job.ref, True)
            if not message[1] or not w.job.answers:
                w.job = None
        else:
            verdicts[w.job.keys[w.pos]] = message[1]
            w.pos += 1
            if w.pos == len(w.job.answers):
                w.job = None
        w.deadline = time.monotonic() + timeout

    now = time.monotonic()
    for w in list(_POOL):
        if w.job and now > w.deadline:
            _fail(w, queue, ref_ok, verdicts, f"it took longer than {timeout:g} s")
        elif not w.ready and now > w.started + _START_TIMEOUT:
            _fail(w, queue, ref_ok, verdicts, "")
            raise RuntimeError(
                f"a math_accuracy worker did not start within {_START_TIMEOUT:g} s; "
                "check that `python -c 'import math_verify'` works in this environment"
            )


def _fail(w: _Worker, queue: deque, ref_ok: dict, verdicts: dict, why: str) -> None:
    """Kill a worker that overran or crashed; blame only the step it was on, requeue the rest."""
    if w not in _POOL:
        return
    w.kill()
    _POOL.remove(w)
    job = w.job
    if job is None:  # died while idle or starting: nothing to blame
        return
    if not w.ref_done:
        logger.warning("math_accuracy: reference %.80r is skipped (samples score None): %s", job.ref, why)
        ref_ok[job.ref] = None
        return
    logger.warning("math_accuracy: answer %.80r scores 0: %s", job.answers[w.pos], why)
    verdicts[job.keys[w.pos]] = False
    rest = w.pos + 1
    if rest < len(job.answers):
        queue.appendleft(_Job(job.ref, job.answers[rest:], job.keys[rest:]))


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

    jobs: list[_Job] = []
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
            jobs.append(_Job(ref, list(unique), [same[0] for same in unique.values()]))
            copies.update((same[0], same) for same in unique.values())

    # Few big groups (evaluation, or one slow group) would leave workers idle: cut them so that
    # there are about two jobs per worker. Each piece re-parses its reference (cached per worker).
    size = max(1, math.ceil(sum(len(j.answers) for j in jobs) / (2 * MAX_WORKERS)))
    jobs = [
        _Job(j.ref, j.answers[k : k + size], j.keys[k : k + size])
        for j in jobs
        for k in range(0, max(1, len(j.answers)), size)
    ]
    ref_ok, verdicts = _run(jobs, timeout) if jobs else ({}, {})
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
    fallback: str = "none",
    timeout: float = 5.0,
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


def equivalent_batch(pairs: list[tuple[str, str]], timeout: float = 5.0) -> list[bool]:
    """For each ``(gold, pred)`` pair of answer strings, whether pred equals gold; an unparseable
    or timed-out gold gives False."""
    verdicts = _judge([g for g, _ in pairs], [p for _, p in pairs], timeout)
    return [v is True for v in verdicts]


def equivalent(gold: str, pred: str, timeout: float = 5.0) -> bool:
    """Whether answer string `pred` equals answer string `gold` (see `equivalent_batch`)."""
    return equivalent_batch([(gold, pred)], timeout)[0]
