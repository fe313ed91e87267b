"""Files that survive a kill: whole files replaced atomically, and append-only logs.

- `write_atomic(path, text)`: the file holds the old text or the new one, never a mix: written
  to a temporary file beside it, synced, then renamed over it. `atomic_file(path)` does the same
  for text written piece by piece (a file too large to hold in memory).
- `append_synced(f, text)`: an append that is on disk when it returns (flush and fsync).
- `complete_lines(path)` and `drop_partial_line(path, partial)`: the lines of an append-only file
  up to its last newline, and, once the caller has accepted the file, the cut of a partial last
  line (a kill in the middle of a write), so the next append starts clean. `line_offsets(path)`
  walks the complete lines one at a time, with where each starts, for files read by streaming.
- `shard_file(folder, name, shard)` and `shard_files(folder, name)`: the file each process of a
  distributed run appends to (``name`` for shard 0, the main process's; ``stem.shardN.ext`` for
  shard N), and those that exist, shard 0 first.

Folders that are built in place and renamed when done (converted models) do it themselves.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import IO, Iterator

log = logging.getLogger("r1kit")


def write_atomic(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[IO[str]]:
    """A file to write `path` through: renamed over it, synced, when the block ends without an
    error; removed, leaving `path` as it was, when the block raises."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append_synced(f: IO[str], text: str) -> None:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def complete_lines(path: Path) -> tuple[list[str], int]:
    """The complete lines of `path` (none if it does not exist), and the size in bytes of a
    partial last line after them (0 when there is none). The file is not changed."""
    data = Path(path).read_bytes() if Path(path).exists() else b""
    end = data.rfind(b"\n") + 1  # past the last complete line
    return data[:end].decode().splitlines(), len(data) - end


def line_offsets(path: Path) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for each complete line of `path`, read one at a time; a partial last line
    (no newline yet: a kill or a write in progress) is left out."""
    with open(path, "rb") as f:
        offset = 0
        for line in f:
            if not line.endswith(b"\n"):
                return
            yield offset, line
            offset += len(line)


def drop_partial_line(path: Path, partial: int) -> None:
    """Cut the `partial` bytes of an unfinished last line off `path`, so the next append starts clean."""
    if partial:
        log.warning("%s: dropping a partial last line (%d bytes)", path, partial)
        with open(path, "r+b") as f:
            f.truncate(Path(path).stat().st_size - partial)
            os.fsync(f.fileno())


def shard_file(folder: Path, name: str, shard: int) -> Path:
    """Shard `shard`'s file of `name`: ``name`` itself for shard 0, ``stem.shardN.ext`` for the others."""
    stem, _, ext = name.partition(".")
    return Path(folder) / (name if shard == 0 else f"{stem}.shard{shard}.{ext}")


def shard_files(folder: Path, name: str) -> list[Path]:
    """The shard files of `name` in `folder` that exist, in shard order."""
    stem, _, ext = name.partition(".")
    others = sorted(Path(folder).glob(f"{stem}.shard*.{ext}"), key=lambda p: int(p.name[len(stem) + 6 : -len(ext) - 1]))
    return [path for path in [Path(folder) / name] if path.exists()] + others
