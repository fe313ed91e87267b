"""r1kit.hardware's process state, read once and passed: the `Machine` every machine check gets
(from a launcher's environment, or from the accelerate config ``validate --accelerate-config``
names), and the one rule by which a child process ends with its parent (`die_with`), which the
stage processes, the asynchronous generator and the vLLM servers r1kit starts all follow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from r1kit.hardware import Machine

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env, launcher, world", [
    ({}, None, 1),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, "deepspeed", 4),
    ({"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "2"}, "fsdp", 2),
])
def test_a_launched_process_reads_its_machine_from_the_launcher(monkeypatch, env, launcher, world):
    for name in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    machine = Machine.here()
    assert (machine.gpu, machine.launcher, machine.world.world) == (False, launcher, world)


def test_validate_reads_the_launch_an_accelerate_config_describes(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert Machine.here(str(ROOT / "recipes/accelerate/zero3.yaml")).launcher == "deepspeed"
    cpu = Machine.here(str(ROOT / "recipes/accelerate/cpu_ddp.yaml"))
    assert (cpu.launcher, cpu.world.world, cpu.world.local_world) == (None, 2, 2)


PARENT = """
import functools, os, subprocess, sys, time
from r1kit import hardware
child = '''
import os, signal, sys, time
def ended(*a):
    with open(sys.argv[1] + ".part", "w") as f:  # renamed whole: the test never reads it half-written
        f.write("SIGTERM")
    os.replace(sys.argv[1] + ".part", sys.argv[1])
    sys.exit(0)
signal.signal(signal.SIGTERM, ended)
print("ready", flush=True)
time.sleep(120)
'''
proc = subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], stdout=subprocess.PIPE, text=True,
                        preexec_fn=functools.partial(hardware.die_with, os.getpid()))
proc.stdout.readline()
print(proc.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_child_ends_with_its_parent_by_sigterm_however_the_parent_ends(tmp_path):
    """The parent is SIGKILLed: the child gets SIGTERM (its handler runs, so a vLLM server can end
    its engine cores), as the rule `die_with` sets for every child r1kit starts."""
    mark = tmp_path / "ended"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(mark)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(30)
    deadline = time.monotonic() + 30
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mark.read_text() == "SIGTERM"
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    status = Path(f"/proc/{child}/status")
    assert not status.exists() or "zombie" in status.read_text()
