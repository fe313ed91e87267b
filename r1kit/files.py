"""Files that survive a kill: whole files replaced atomically, and append-only logs.

- `write_atomic(path, text)`: the file holds the old text or the new one, never a mix: written
  to a temporary file beside it, synced, then renamed over it.
- `append_synced(f, text)`: an append that is on disk when it returns (flush and fsync).
- `complete_lines(path)` and `drop_partial_line(path, partial)`: the lines of an append-only file
  up to its last newline, and, once the caller has accepted the file, the cut of a partial last
  line (a kill in the middle of a write), so the next append starts clean.

Folders that are built in place and renamed when done (converted models) do it themselves.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO

log = logging.getLogger("r1kit")


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        append_synced(f, text)
    os.replace(tmp, path)


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


def drop_partial_line(path: Path, partial: int) -> None:
    """Cut the `partial` bytes of an unfinished last line off `path`, so the next append starts clean."""
    if partial:
        log.warning("%s: dropping a partial last line (%d bytes)", path, partial)
        with open(path, "r+b") as f:
            f.truncate(Path(path).stat().st_size - partial)
            os.fsync(f.fileno())
