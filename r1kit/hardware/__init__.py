"""Hardware: the machine a process runs on and its place among a run's processes, and the paths
r1kit takes to train and sample fast on a CPU (r1kit.hardware.cpu) and when it chooses bfloat16
there (r1kit.hardware.precision).

- `has_gpu()`: whether this machine has a CUDA GPU; `cores()`: the CPU cores this process may use.
- `World`: this process's rank among the run's processes and its node's, read from the
  launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, as
  accelerate and torchrun set them) once, at a command's entry, and handed to what needs it.
- `Machine`: what a run's processes have (a CUDA GPU or not, their `World`, the launcher's
  sharding engine), read once at a command's entry (from an accelerate config file for
  ``validate --accelerate-config``, from the launcher's environment in a launched run) and handed
  to every machine check, so ``validate`` sees what ``run`` refuses.
- `die_with(parent)`: a child process (a stage's, the asynchronous generator, a vLLM server)
  ends with the process that started it, however that one ends: one rule for all of them.

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
    """Whether this machine has a CUDA GPU: the one place r1kit asks torch."""
    import torch

    return torch.cuda.is_available()


def cores() -> int:
    """The CPU cores this process may run on (its affinity, where the system keeps one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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


LAUNCHERS = {"DEEPSPEED": "deepspeed", "FSDP": "fsdp"}
"""accelerate's sharding engines, by its ``distributed_type``, as `Machine.launcher` names them."""


@dataclass(frozen=True)
class Machine:
    """What the processes of a run have, for the checks that refuse a recipe this machine cannot run."""

    gpu: bool
    """Whether the machine has a CUDA GPU."""
    world: World = World()
    """The run's processes (one, unless a launcher starts several)."""
    launcher: str | None = None
    """The launcher's sharding engine: ``deepspeed``, ``fsdp``, or None (plain data parallelism or one process)."""

    @classmethod
    def here(cls, accelerate_config: str | None = None) -> "Machine":
        """This machine, with the processes a launch by `accelerate_config` (an accelerate config
        file) would start, or, without one, those the launcher's environment says this one belongs to."""
        if accelerate_config is None:
            env = {"deepspeed": "ACCELERATE_USE_DEEPSPEED", "fsdp": "ACCELERATE_USE_FSDP"}
            launcher = next((name for name, var in env.items() if os.environ.get(var, "").lower() == "true"), None)
            return cls(gpu=has_gpu(), world=World.from_env(), launcher=launcher)
        from accelerate.commands.config.config_args import load_config_from_file

        config = load_config_from_file(accelerate_config)
        per_node = int(config.num_processes or 1) // max(1, int(config.num_machines or 1))
        world = World(world=int(config.num_processes or 1), local_world=per_node)
        return cls(gpu=has_gpu(), world=world, launcher=LAUNCHERS.get(str(config.distributed_type).rpartition(".")[2]))


def die_with(parent: int) -> None:
    """End this process when `parent` ends, however it ends (SIGKILL included): SIGTERM, so a
    process that holds others (a vLLM server, its engine cores) can end them on its way out. Safe
    to call between fork and exec (``preexec_fn``), where the watching thread of other systems
    would not survive: there only Linux's parent-death signal acts."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent ended before the call took effect
            os._exit(1)
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
