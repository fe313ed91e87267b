"""Hardware: the machine a process runs on and its place among a run's processes, and the paths
r1kit takes to train and sample fast on a CPU (r1kit.hardware.cpu) and when it chooses bfloat16
there (r1kit.hardware.precision).

- `has_gpu()`: whether this machine has a CUDA GPU.
- `World`: this process's rank among the run's processes and its node's, read from the
  launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, as
  accelerate and torchrun set them) once, at a command's entry, and handed to what needs it.

Not here: anything that changes results beyond rounding, anything on a GPU (TRL's and torch's own
paths run there), process groups (r1kit.stage_process). Imports nothing of r1kit; trainers,
sampling, code execution, the stages and the pipeline import it.
"""

from __future__ import annotations

import os
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
