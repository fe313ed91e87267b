"""math-verify in a pool of worker processes, with a hard time limit on every item.

    from r1kit.rewards import math_pool
    ref_ok, verdicts = math_pool.run([math_pool.Job("\\frac12", ["0.5", "2"], keys=[0, 1])], timeout=5.0)
    # ref_ok == {"\\frac12": True}; verdicts == {0: True, 1: False}

A job is one reference answer and the answer strings to check against it. A worker parses the
reference once, then checks each answer (math-verify ``parse`` + ``verify``), sending one message
per step; the caller times every step. Guarantees:

- every step (a reference parse, one answer check) ends within ``timeout`` seconds of the
  previous one, or its worker is killed and replaced: the answer scores False, a reference that
  could not be parsed in time gives ``ref_ok[ref] = None``, and the rest of its job is requeued;
- it works from any thread (math-verify's own SIGALRM limit works only on the main thread; r1kit
  turns it off and enforces its own); calls are serialised by a lock;
- workers start lazily, one per usable core up to 16, from a ``forkserver`` that has already
  imported SymPy and math-verify (a replacement starts in milliseconds), and are reused across
  calls; a forked child never talks to its parent's workers;
- an interrupted call (Ctrl-C) kills the busy workers, so no stale answer reaches the next call;
- it works inside a daemonic process (TRL's asynchronous rollout worker), which multiprocessing
  would otherwise refuse children.

It is no sandbox: math-verify and SymPy run with the caller's rights and no memory limit. Scripts
that use it need the usual ``if __name__ == "__main__":`` guard (workers do not fork the caller).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import Connection, wait as wait_for_messages

from r1kit.hardware import cores
from r1kit.text import BRACE, math_spans

logger = logging.getLogger(__name__)

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
    an answer with unbalanced braces is only given as is. A ``\\pm`` is first written out as its
    two values (`_expand_signs`).
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    answer = _expand_signs(answer)
    balanced = _balanced(answer)
    if not balanced or any(d in answer for d in ("$", "\\(", "\\[", "\\boxed")) or _PROSE.search(_COMMAND.sub(" ", answer)):
        parsed = parse(answer, config, parsing_timeout=None)
        # Wrapping an unbalanced answer would let the wrapper's brace close it: `\frac{1}{2`
        # must not become `\boxed{\frac{1}{2}` = 1/2.
        if _has_math(parsed) or not balanced:
            return parsed
    return parse("\\boxed{" + answer + "}", config, parsing_timeout=None)


_PLUS_MINUS = re.compile(r"(?<!\\)\\(?:pm|mp)(?![A-Za-z])|[\u00b1\u2213]")
_SET = re.compile(r"(\\left\s*)?\\\{(.*?)(\\right\s*)?\\\}", re.DOTALL)
_SET_BRACE = re.compile(r"\\[{}]")
_OPEN, _CLOSE = "{([", "})]"


def _expand_signs(answer: str) -> str:
    """Each list element with ``\\pm`` as its two values, so that math-verify can compare them (it
    reads a ± only at the top of an element): ``x = \\frac{-1 \\pm \\sqrt{13}}{4}`` is
    ``x = \\frac{-1 + \\sqrt{13}}{4}, x = \\frac{-1 - \\sqrt{13}}{4}``, and ``\\{1 \\pm \\sqrt{5}, -2\\}``
    the set of three values.

    An element is a part of a formula between commas outside any bracket (inside ``\\{…\\}`` when
    the formula is a set). Every ± of one element takes the same sign and every ∓ the other, so a
    point ``(1 \\pm 2, 3 \\mp 4)`` is two points. A formula is the content of each box, else of each
    ``$…$``, else the whole answer."""
    if not _PLUS_MINUS.search(answer):
        return answer
    out, done = [], 0
    for start, end in math_spans(answer):
        out += [answer[done:start], _expand_formula(answer[start:end])]
        done = end
    return "".join(out) + answer[done:]


def _expand_formula(formula: str) -> str:
    if not _PLUS_MINUS.search(formula):
        return formula
    braced = _SET.fullmatch(formula.strip())
    if braced and _balanced(braced.group(2), _SET_BRACE, "\\{"):  # one set, not several
        return "\\{" + _expand_formula(braced.group(2)) + "\\}"
    elements, depth, last = [], 0, 0
    for i, ch in enumerate(formula):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0 and formula[i - 1 : i] != "\\":  # `\,` is a thin space
            elements.append(formula[last:i])
            last = i + 1
    if elements:
        return ", ".join(_expand_formula(e).strip() for e in [*elements, formula[last:]])

    def signed(plus: bool) -> str:
        return _PLUS_MINUS.sub(lambda m: "+" if (m.group() in ("\\pm", "\u00b1")) == plus else "-", formula).strip()

    return f"{signed(True)}, {signed(False)}"


def _balanced(s: str, braces: re.Pattern = BRACE, opening: str = "{") -> bool:
    """Whether every closing brace of `s` (grouping braces, or those `braces` finds) closes an
    earlier opening one, and none stays open."""
    depth = 0
    for m in braces.finditer(s):
        depth += 1 if m.group() == opening else -1
        if depth < 0:
            return False
    return depth == 0


def _has_math(parsed: list) -> bool:
    from sympy import Basic, MatrixBase

    return any(isinstance(p, (Basic, MatrixBase)) for p in parsed)


def _worker_main(conn) -> None:
    """Judge jobs ``(reference, [answers])`` until the parent closes the pipe, replying
    ``("ref", parsed_ok)`` then ``("item", verdict)`` per answer: the parent times each step. A
    parent that is gone (killed, or ended by SIGTERM mid-job) ends the worker quietly: nobody is
    left to read a traceback about the broken pipe."""
    from math_verify import verify

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # The "timeout is disabled" warning is expected: the parent enforces the limit.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        conn.send(("ready",))
        while True:
            ref, answers = conn.recv()
            gold = _parse(ref)
            ok = _has_math(gold)
            conn.send(("ref", ok))
            if ok:
                for answer in answers:
                    conn.send(("item", bool(verify(gold, _parse(answer), timeout_seconds=None))))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# ---------------------------------------------------------------------------------------------
# The pool (calling process)

_CTX = multiprocessing.get_context("forkserver")
# Workers fork from a server that has already imported SymPy and math-verify: a replacement
# for a killed worker starts in milliseconds instead of seconds.
_CTX.set_forkserver_preload(["math_verify", "r1kit.rewards.math_pool"])
MAX_WORKERS = max(1, min(cores(), 16))
_START_TIMEOUT = 120.0  # a worker that cannot start in this time is a broken install, not a slow item
_LOCK = threading.Lock()
_POOL: list[_Worker] = []
_POOL_PID = os.getpid()


def _start_forkserver() -> None:
    """Start the forkserver, if it is not running, with Ctrl-C ignored: the disposition survives
    its exec, so a Ctrl-C while it imports SymPy (its preload, seconds long) does not print a
    KeyboardInterrupt traceback from it; Ctrl-C is the parent's to handle. Only the main thread
    may set signal handlers: elsewhere the server starts as multiprocessing starts it."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class Job:
    ref: str
    answers: list[str]
    keys: list[int]  # where each verdict goes


@dataclass
class _Worker:
    proc: multiprocessing.process.BaseProcess
    conn: Connection
    started: float
    ready: bool = False
    job: Job | None = None
    ref_done: bool = False
    pos: int = 0  # answers of `job` already judged
    deadline: float = 0.0

    @classmethod
    def start(cls) -> _Worker:
        parent_end, child_end = _CTX.Pipe()
        proc = _CTX.Process(target=_worker_main, args=(child_end,), daemon=True, name="r1kit-math")
        # multiprocessing refuses children to a process it marks daemonic, as TRL's asynchronous
        # rollout worker (where rewards run) is; the pool's workers are daemonic themselves and
        # killed by the pool, so the mark is lifted while one starts.
        me = multiprocessing.current_process()
        daemonic = me._config.pop("daemon", None)
        try:
            _start_forkserver()
            proc.start()
        finally:
            if daemonic is not None:
                me._config["daemon"] = daemonic
        child_end.close()
        return cls(proc=proc, conn=parent_end, started=time.monotonic())

    def assign(self, job: Job, timeout: float) -> None:
        self.job, self.ref_done, self.pos = job, False, 0
        self.deadline = time.monotonic() + timeout
        self.conn.send((job.ref, job.answers))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def run(jobs: list[Job], timeout: float) -> tuple[dict[str, bool | None], dict[int, bool]]:
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
        queue.appendleft(Job(job.ref, job.answers[rest:], job.keys[rest:]))
