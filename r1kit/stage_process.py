"""Each stage in its own process: a stage starts on a clean device and leaves nothing behind.

A stage's models, TRL's colocated vLLM engine, a reward model and the CUDA caching allocator
live in memory that only the end of a process reliably returns; vLLM also keeps process-wide
state (its distributed groups, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` set by TRL's colocate mode)
that a later engine in the same process would trip over. So `run(kind_name, ctx)` runs the
stage's ``run`` in a fresh child process (``spawn``, never ``fork``: a CUDA context cannot be
forked) and hands back its `StageResult`; the pipeline process itself never touches the GPU.

- On by default where a CUDA GPU is present, off on CPU-only machines (where a stage holds no
  device memory, and a new process costs a few seconds of imports); ``R1KIT_STAGE_PROCESS=1`` or
  ``0`` overrides.
- Errors for the user (`RecipeError`, `RewardError`) raised in the child are raised again in the
  pipeline process, so they stay one line; anything else prints its traceback in the child and
  the pipeline raises `StageProcessError` naming the stage and exit status. Ctrl-C ends the
  child quietly (exit status 130): the pipeline's process says it in one line.
- The child dies with its parent (Linux ``PR_SET_PDEATHSIG``, elsewhere a watchdog thread): a
  killed run leaves no stage running on its own, and re-running resumes as before.
- The child starts as a command does (`_child`): logging, the allocator setting of a CPU run
  (r1kit.hardware.cpu), and the recipe's folder and the current directory on ``sys.path`` for
  ``module:function`` rewards.
- In a distributed run every process's child joins a new process group of its own stage, on
  ``MASTER_PORT`` + 1 + the stage's index (rank 0's child hosts its store), so no stage reuses
  the rendezvous keys of an earlier one. The pipeline processes themselves stay off the GPU:
  they build trainer configs for their checks as a single process would (`hidden_world`) and
  meet in a gloo group with a week's timeout (`barrier`, which every process of a distributed
  run uses, with or without stage processes), never in NCCL. The port must be free
  on the main node (as MASTER_PORT itself must be).

Not here: what a stage does (r1kit.stages) or the order of stages (r1kit.pipeline).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing
import os

from r1kit import hardware
from r1kit.errors import RecipeError, RewardError
from r1kit.hardware import World
from r1kit.stages.base import StageContext, StageResult

ENV = "R1KIT_STAGE_PROCESS"


class StageProcessError(RuntimeError):
    """A stage's process failed on something other than bad input (its traceback is above)."""


def enabled() -> bool:
    """Whether stages run in their own processes here (see the module docstring)."""
    value = os.environ.get(ENV, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise RecipeError(f"{ENV}={value!r}: set 1 (each stage in its own process) or 0 (all in this one)")
    return hardware.has_gpu()


def call(kind_name: str, ctx: StageContext) -> StageResult:
    """Run the stage in this process. With a CUDA GPU, its metrics gain ``gpu_free_at_start_mib``
    (the device's free memory as the stage starts, whoever holds the rest) and ``gpu_peak_mib``
    (the most this process's tensors held at once)."""
    from r1kit import stages
    from r1kit.stages import served_rewards
    from r1kit.reward_registry import in_stage

    with in_stage(ctx.dir), served_rewards.started(ctx):  # files rewards keep (a judge's cache) in the stage's folder; servers they ask for
        if not hardware.has_gpu():
            return stages.get(kind_name).run(ctx)
        import torch

        torch.cuda.set_device(ctx.processes.local_rank % torch.cuda.device_count())  # this process's GPU, not GPU 0
        free, _ = torch.cuda.mem_get_info()
        torch.cuda.reset_peak_memory_stats()
        result = stages.get(kind_name).run(ctx)
    result.metrics = {**result.metrics, "gpu_free_at_start_mib": round(free / 2**20), "gpu_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20)}
    return result


def off_device(world: World) -> bool:
    """True in the pipeline's own process of a distributed run (`world`) whose stages run in
    processes of their own: it must create no CUDA context and no NCCL group (see `hidden_world`,
    `barrier`)."""
    return world.world > 1 and enabled()


@contextlib.contextmanager
def hidden_world():
    """Inside: this process looks like a single one to accelerate, so building a trainer config
    (which sets up accelerate's state) joins no process group and picks no GPU. Checks that
    depend on the number of processes run again when the stage builds its config."""
    names = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


WAIT = datetime.timedelta(days=7)
"""How long `barrier` waits: longer than any stage, so only the launcher ends a failed run."""
_group = None  # this process's gloo group for `barrier`


def barrier(world: World) -> None:
    """Wait for every process of the distributed run `world` (a no-op in a single process), in a gloo
    group of r1kit's own whose timeout is a week (`WAIT`). Processes wait here while the main one
    builds a model or merges the shards of a generation stage, and while other processes finish
    their shards: hours at R1's scale, where a process group's default
    timeout would end the run (30 minutes with gloo, 10 with NCCL in recent torch). A failed
    process ends the run through the launcher, which stops the others. Training stages keep
    their trainer's own group and timeout. The first call creates the group: the pipeline's
    processes make it at the start of the run (r1kit.pipeline), before any long work; a stage's
    own process (`run`), when the stage first waits."""
    global _group
    if world.world <= 1:
        return
    import torch.distributed as dist

    if _group is None:
        if not dist.is_initialized():
            if off_device(world):
                dist.init_process_group("gloo", timeout=WAIT)
            else:
                from accelerate import PartialState

                PartialState()  # the default group, as the stages' trainers will use it
        _group = dist.new_group(backend="gloo", timeout=WAIT)
        if dist.get_world_size(_group) != world.world:
            raise StageProcessError(
                f"this process's torch.distributed world has {dist.get_world_size(_group)} processes where the run has "
                f"{world.world}: a library set it up as a single process (vLLM does, when its engine runs "
                "in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0); leave vLLM's engine in its own process"
            )
    dist.barrier(group=_group)


def run(kind_name: str, ctx: StageContext, index: int) -> StageResult:
    """Run stage kind `kind_name` on `ctx` in a fresh process; `index` is the stage's position
    in the recipe (it picks the process group's port in a distributed run)."""
    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(
        target=_child,
        args=(kind_name, ctx, index, send, os.getpid(), logging.getLogger().level),
        name=f"r1kit-{ctx.stage.name}",
    )
    child.start()
    send.close()
    outcome = None  # stays None when the child dies before it answers
    try:
        outcome = receive.recv()
    except EOFError:
        pass
    finally:
        child.join(timeout=None if outcome is None else 300)
        if child.is_alive():  # answered, then stuck on its way out (a library's exit hook)
            child.kill()
            child.join()
    if outcome is not None and outcome[0] == "result":
        return outcome[1]
    if outcome is not None and outcome[0] == "user_error":
        raise outcome[1]
    raise StageProcessError(f"{ctx.stage.name}: the stage's process failed (exit status {child.exitcode}); its traceback is above")


def _child(kind_name: str, ctx: StageContext, index: int, send, parent: int, level: int) -> None:
    """The stage process's entry: set up the process as a command does, then run the stage."""
    from r1kit import setup_logging
    from r1kit.hardware import cpu
    from r1kit.reward_registry import add_plugin_folders

    hardware.die_with(parent)
    setup_logging(level)
    cpu.keep_freed_memory()
    add_plugin_folders(ctx.recipe.source)
    if ctx.processes.world > 1:
        os.environ["MASTER_PORT"] = str(int(os.environ.get("MASTER_PORT", "29500")) + 1 + index)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    try:
        result = call(kind_name, ctx)
    except (RecipeError, RewardError) as exc:
        send.send(("user_error", exc))
        return
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the pipeline's process says so, once
        raise SystemExit(130) from None
    send.send(("result", result))
