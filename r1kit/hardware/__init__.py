"""Hardware: the machine a process runs on and its place among a run's processes, and the paths
r1kit takes to train and sample fast on a CPU (r1kit.hardware.cpu) and when it chooses bfloat16
there (r1kit.hardware.precision).

- `has_gpu()`: whether this machine has a CUDA GPU.
- `World`: this process's rank among the run's processes and its node's, read from the
  launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, as
  accelerate and torchrun set them) once, at a command's entry, and handed to what needs it.
- `die_with(parent)`: a child process (a stage's, the asynchronous generator) ends with the
  process that started it, however that one ends.

Not here: anything that changes results beyond rounding, anything on a GPU (TRL's and torch's own
paths run there), process groups (r1kit.stage_process). Imports nothing of r1kit; trainers,
sampling, code execution, the stages and the pipeline import it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class World:
    """Where this process stands among the processes of a run (a single process by default)."""

    rank: int = 0
    """This process's rank among all processes of the run."""
    world: int = 1
    """The number of processes of the run, over all nodes."""
    local_rank: int = 0
    """This process's rank among the processes of its node."""
    local_world: int = 1
    """The number of processes on this node (every node runs as many)."""

    @classmethod
    def from_env(cls) -> "World":
        """This process's world as the launcher set it; a single process when none did."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        )

    @property
    def is_main(self) -> bool:
        """The process that writes the run's markers, reports and merged outputs."""
        return self.rank == 0


def die_with(parent: int) -> None:
    """End this process when `parent` ends, however it ends (SIGKILL included)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before the call took effect
            os._exit(1)
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
