"""A process's place in a distributed run (r1kit.hardware.World) is read from the launcher's
environment once, at a command's entry, and handed down: a stage's context carries it, and code
given a World reads no environment variable."""

from __future__ import annotations

import pytest

from r1kit.hardware import World

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def unreadable(monkeypatch):
    """An environment whose launcher variables fail when anything parses them."""
    for name in NAMES:
        monkeypatch.setenv(name, "read where it should not be")


def test_the_world_is_read_from_the_launchers_environment(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    assert World.from_env() == World(rank=0, world=1, local_rank=0, local_world=1)
    assert World.from_env().is_main
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert World.from_env() == World(rank=5, world=8, local_rank=1, local_world=8)  # one node unless told
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert World.from_env() == World(rank=5, world=8, local_rank=1, local_world=4)
    assert not World.from_env().is_main


def test_a_stage_context_carries_the_world(unreadable, tmp_path):
    from r1kit.stages import StageContext

    ctx = StageContext(recipe=None, stage=None, dir=tmp_path, model="m", datasets={}, processes=World(rank=3, world=4, local_rank=1, local_world=2))
    assert (ctx.rank, ctx.world, ctx.is_main, ctx.processes.local_rank) == (3, 4, False, 1)
    alone = StageContext(recipe=None, stage=None, dir=tmp_path, model="m", datasets={})
    assert (alone.rank, alone.world, alone.is_main) == (0, 1, True)


def test_code_given_a_world_reads_no_environment(unreadable, monkeypatch):
    from r1kit import stage_process
    from r1kit.execution import sandbox
    from r1kit.sampling import shard_of

    monkeypatch.setenv(stage_process.ENV, "0")
    assert shard_of(World(rank=1, world=2, local_rank=1, local_world=2), "transformers") == (1, 2)
    assert not stage_process.off_device(World(rank=1, world=2, local_rank=1, local_world=2))
    stage_process.barrier(World())  # a single process waits for nobody
    result = sandbox.run_many([("print(6 * 7)", "")], world=World(rank=1, world=2, local_rank=1, local_world=2))
    assert result[0].ok and result[0].stdout == "42\n"
    with pytest.raises(ValueError):
        World.from_env()  # the variables are there to fail whoever reads them
