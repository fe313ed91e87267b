"""Resumable, sharded sampling jobs: the one engine behind rejection sampling and evaluation.

    job = Job(folder, header, items=len(prompts), chunk=64, name="rejection")
    job.sample(work, sampler, shard, shards)    # this shard's unfinished chunks, journaled
    ...                                         # the caller waits for every process (a stage's barrier)
    job.sample(work, sampler)                   # the main process: whatever no shard journaled
    for record in job.records(): ...            # every chunk's records, in item order

A job is `items` things to sample for (prompts, benchmark problems) cut into chunks of `chunk`
consecutive items; a chunk is the unit of work. Each is sampled in one ``generate_full`` call of
the backend that `sampler()` returns (called once, when a chunk is left to do; any object with
r1kit.sampling.Sampler's ``generate_full``, so a served model plugs in as one more backend),
and what the consumer keeps of it, its records (JSON objects), is journaled as one line. The
consumer, a `Work`, says what a chunk asks for (`request`: the rendered prompts, n, the sampling
parameters, whose seed the consumer derives from the chunk, and tools) and what to keep of the
completions (`records`).

The journal is ``journal.jsonl`` in the job's folder (``journal.shardN.jsonl`` for shard N:
r1kit.files.shard_file): a header line (what the samples depend on: a journal with another
header is refused), then one line per finished chunk, ``{"chunk": i, "start": a, "stop": b,
"records": [...]}``, appended and synced. A kill in the middle of a write leaves a cut last line:
reading ignores it and the next append cuts it off. A chunk is done when any shard's journal
holds a line with its items (``start`` to ``stop``), so a rerun with any number of processes
samples only the unfinished chunks: no record twice, none lost.

Sharding: chunk i belongs to shard (first + i) mod shards; `first` lets a consumer number the
chunks of several jobs in one sequence, so that small jobs land on different shards. The shard of
a process comes from r1kit.sampling.shard_of (one per engine). `records` streams every chunk from
whichever journal holds it, in chunk order, one chunk in memory at a time: only where each line
starts is indexed, by matching its opening, never by parsing its records.

Not here: what is sampled and how it is scored (the consumers: r1kit.stages.rejection,
r1kit.evaluation.evaluate), waiting for the other processes (the stage's barrier), and one
seeding rule (each consumer keeps its own, which fixes what it draws).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

from r1kit.errors import RecipeError
from r1kit.files import append_synced, drop_partial_line, line_offsets, shard_file, shard_files
from r1kit.sampling.base import Completion, Sampler, SamplingParams

log = logging.getLogger("r1kit")

JOURNAL = "journal.jsonl"
LINE = re.compile(rb'\{"chunk": \d+, "start": (\d+), "stop": (\d+), "records": ')
"""The opening of a chunk's line as `Job` writes it: its items, read without parsing the records."""


def journaled(folder: Path) -> bool:
    """Whether any job in `folder` or below has journaled a chunk: work a rerun would resume."""
    for path in Path(folder).rglob("journal*.jsonl"):
        if any(LINE.match(line) for _, line in line_offsets(path)):
            return True
    return False


@dataclass(frozen=True)
class Chunk:
    """The unit of work: items start to stop (excluded) of a job, sampled in one call."""

    number: int
    start: int
    stop: int


@dataclass(frozen=True)
class Request:
    """What one chunk asks of the backend: n completions of each prompt, with `params`."""

    prompts: list[str]
    n: int
    params: SamplingParams
    tools: list | None = None
    """r1kit.execution.tools.Tool objects: each sample a rollout that may run code; None: plain sampling."""


class Work(Protocol):
    """A consumer's side of a job."""

    def request(self, chunk: Chunk, sampler: Sampler) -> Request:
        """The chunk's prompts, rendered (with `sampler.tokenizer` when the consumer wants it)."""
        ...

    def records(self, chunk: Chunk, request: Request, completions: list[list[Completion]], sampler: Sampler) -> list[dict]:
        """What to journal of the chunk, given the completions of each prompt: JSON objects, read back in this order."""
        ...


def _sampled(work: Work, engine: Sampler, todo: list[Chunk]) -> Iterator[tuple[Chunk, Request, list[list[Completion]]]]:
    """Each chunk of `todo` with its request and completions: one after the other, or, for an
    engine with ``concurrency`` (a served model), as many chunks at once as fill it, each
    yielded as it finishes."""
    def one(chunk: Chunk, request: Request | None = None):
        request = request or work.request(chunk, engine)
        tools = {"tools": request.tools} if request.tools else {}  # a backend without tools takes no such argument
        return chunk, request, engine.generate_full(request.prompts, request.n, request.params, **tools)

    concurrency = getattr(engine, "concurrency", 1)
    if concurrency <= 1 or len(todo) <= 1:
        yield from map(one, todo)
        return
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    size = max(c.stop - c.start for c in todo)
    pending, queue, workers = set(), iter(todo), max(1, -(-concurrency // size))
    pool = ThreadPoolExecutor(workers)
    try:
        while True:
            while len(pending) < workers and (chunk := next(queue, None)) is not None:
                pending.add(pool.submit(one, chunk, work.request(chunk, engine)))  # requests made here: one thread renders
            if not pending:
                return
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                yield future.result()
    finally:  # an error or Ctrl-C: what is in flight is dropped (closing the engine ends its requests)
        pool.shutdown(wait=not pending, cancel_futures=True)


class Progress:
    """Log lines as a job goes: chunks and samples done, tokens per second (at most one every `every` s)."""

    def __init__(self, name: str, chunks: int, every: float = 10.0):
        self.name, self.chunks, self.every = name, chunks, every
        self.start = self.last = time.monotonic()
        self.finished = self.samples = self.tokens = 0

    def done(self, completions: list[list[Completion]]) -> None:
        self.finished += 1
        self.samples += sum(map(len, completions))
        self.tokens += sum(c.tokens for row in completions for c in row)
        now = time.monotonic()
        if now - self.last >= self.every or self.finished == self.chunks:
            self.last = now
            log.info("%s: %d/%d chunks, %d samples, %.0f tokens/s", self.name, self.finished, self.chunks,
                     self.samples, self.tokens / max(now - self.start, 1e-9))


class Job:
    """`items` items in chunks of `chunk`, journaled in `folder` under `header`; `name` heads its log lines."""

    def __init__(self, folder: Path, header: dict, items: int, chunk: int, name: str, first: int = 0):
        self.folder, self.name, self.first = Path(folder), name, first
        self.header = json.loads(json.dumps(header, default=str))  # as it reads back
        self.chunks = [Chunk(i, start, min(start + chunk, items)) for i, start in enumerate(range(0, items, chunk))]

    def sample(self, work: Work, sampler: Callable[[], Sampler], shard: int = 0, shards: int = 1, leftover: bool = False) -> int:
        """Sample, keep and journal the unfinished chunks of `shard` of `shards`, into that shard's
        journal; returns how many. `leftover`: every shard has finished, so a chunk left is one
        whose process journaled it elsewhere or died; it is sampled here, with a warning."""
        done = self.index()
        todo = [c for c in self.chunks if (self.first + c.number) % shards == shard and (c.start, c.stop) not in done]
        if not todo:
            return 0
        finished = sum((c.start, c.stop) in done for c in self.chunks)
        if leftover:
            log.warning(
                "%s: %d chunks of other processes are not journaled in %s; sampling them on this one "
                "(a run over several nodes needs a run folder that all of them share)", self.name, len(todo), self.folder,
            )
        elif finished:
            log.info("%s: resuming, %d of %d chunks already done", self.name, finished, len(self.chunks))
        engine = sampler()  # before the journal: a backend that fails to load leaves the folder as it was
        log.info("%s: %d of %d chunks to sample, %s backend", self.name, len(todo), len(self.chunks), engine.backend)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = shard_file(self.folder, JOURNAL, shard)
        if path.exists():  # a kill in the middle of a write left a cut line: its chunk is redone
            drop_partial_line(path, path.stat().st_size - sum(len(line) for _, line in line_offsets(path)))
        with open(path, "a") as f:
            new = f.tell() == 0
            if new:
                append_synced(f, json.dumps({"header": self.header}) + "\n")
            progress = Progress(self.name, len(todo))
            try:
                for chunk, request, completions in _sampled(work, engine, todo):
                    body = json.dumps(work.records(chunk, request, completions, engine), default=str)
                    append_synced(f, f'{{"chunk": {chunk.number}, "start": {chunk.start}, "stop": {chunk.stop}, "records": {body}}}\n')
                    progress.done(completions)
            except BaseException:
                if new and not progress.finished:  # failed before its first chunk (a server refusing the request): no journal
                    path.unlink()
                raise
        return len(todo)

    def index(self) -> dict[tuple[int, int], tuple[Path, int]]:
        """(start, stop) of each journaled chunk -> (its file, where its line starts), over every
        shard's journal; a chunk journaled twice (by runs with other numbers of processes) counts once."""
        where: dict[tuple[int, int], tuple[Path, int]] = {}
        for path in shard_files(self.folder, JOURNAL):
            lines = line_offsets(path)
            first = next(lines, (0, None))[1]
            if first is not None and json.loads(first)["header"] != self.header:
                raise RecipeError(f"{path} was written with another config, model or seed; delete {path.parent} to start over")
            for offset, line in lines:
                match = LINE.match(line)  # no match: a line of another format, whose chunk is sampled again
                if match:
                    where.setdefault((int(match.group(1)), int(match.group(2))), (path, offset))
        return where

    def records(self) -> Iterator[dict]:
        """The records of every chunk, in chunk order; every chunk must be journaled."""
        where = self.index()
        for chunk in self.chunks:
            path, offset = where[chunk.start, chunk.stop]
            with open(path, "rb") as f:
                f.seek(offset)
                yield from json.loads(f.readline())["records"]
