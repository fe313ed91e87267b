"""A local sandbox for running untrusted Python programs, such as model-written solutions.

    from r1kit.execution.sandbox import Limits, run_python, run_many

    result = run_python("print(input()[::-1])", stdin="abc", limits=Limits(wall_s=2))
    result.ok, result.stdout          # True, "cba\\n"
    results = run_many([(source, ""), (other, "1 2\\n")], limits=Limits(), workers=4)

Every run is its own process, forked from a small fork server (one ``python -I -S -B`` per r1kit
process, started on first use: a fork costs a few ms, a new interpreter 15-35 ms).
The child executes the program as ``__main__`` from a fresh working directory. ``ok`` is true
only when the program ran to its last statement: the child then writes a random per-run nonce
to a pipe of its own. The exit status decides nothing, so ``sys.exit(0)`` or ``os._exit(0)``
before the last line is not a success, and no text the program prints can pass for the marker.

What a run gets, when r1kit runs as root (Linux only):

- its own uid, drawn at random from the top half of the ids this user namespace maps (skipping
  those in /etc/passwd and /etc/group), no supplementary groups, and ``no_new_privs``, so
  setuid binaries cannot give root back. The per-run uid is what makes RLIMIT_NPROC bite (root
  ignores it), keeps the program from signalling or tracing anything but its own processes, and
  lets every process of the run be killed at the end, daemons included (``kill(-1)`` as that uid);
- a network namespace of its own making, shared by all runs: no interface but a loopback that is
  down, so no TCP/UDP/ICMP at all, to the host included;
- limits: wall clock (its process group, then its uid, are killed), CPU time (RLIMIT_CPU),
  address space per process (RLIMIT_AS), size of any file written (RLIMIT_FSIZE), processes and
  threads (RLIMIT_NPROC), no core files;
- a fresh working directory (also $HOME and $TMPDIR), deleted afterwards; a scrubbed
  environment; stdin from memory; stdout and stderr read as they come, at most ``output_kb``
  of each: a program that writes more is stopped there and fails with ``output_exceeded``
  ("output limit exceeded", as programming judges say), so a flooding program neither blocks
  anything nor passes.

The interpreter's import directories (stdlib, lib-dynload, the environment's site-packages; no
.pth files) are opened by the fork server before any uid change and reached through
/proc/self/fd, so a run's uid needs no access to the Python installation (which may sit under a
private /root); the program can read that installation and nothing else it could not before.
A few modules (typing, re, collections, ...) are imported in the fork server, once for all runs.

Without root a run keeps the caller's uid: the program can signal, and write to, whatever the
caller can; RLIMIT_NPROC is set to the caller's current task count plus ``nproc``; daemons that
leave the process group survive the run. Where network namespaces cannot be created, a guard
replaces ``socket.socket`` in the run's interpreter: ``ctypes`` or re-importing ``_socket`` get
around it. :func:`isolation` says which of these fallbacks are in force.

What it does not protect against: it is not a VM or a container. Kernel exploits and CPU side
channels are out of scope. The program can read every world-readable file on the host, write
into world-writable directories (/tmp, /dev/shm; those files are not removed) and fill its
working directory with many files of up to ``file_mb`` each until time runs out, reach Unix-domain
sockets on the filesystem that its uid may open and abstract ones of concurrent runs, and use
up to ``nproc`` x ``memory_mb`` of memory with forked children (a memory cgroup would be needed
for a hard total). A program can also find the nonce by inspecting its own interpreter (frames,
``gc``) or make asserts pass (an object whose ``__eq__`` is always true): the sandbox contains
damage to the host; it does not make a reward un-hackable.
"""

from __future__ import annotations

import atexit
import functools
import grp
import marshal
import math
import os
import pwd
import random
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r1kit.hardware import World


@dataclass(frozen=True)
class Limits:
    """What one run may use."""

    wall_s: float = 5.0
    """Wall-clock seconds before the run's processes are killed."""
    cpu_s: float = 5.0
    """CPU seconds per process (RLIMIT_CPU, rounded up to whole seconds)."""
    memory_mb: int = 1024
    """Address space per process, in MiB (RLIMIT_AS)."""
    file_mb: int = 16
    """Largest file the program may write, in MiB (RLIMIT_FSIZE)."""
    nproc: int = 16
    """Processes and threads the run may have at once (RLIMIT_NPROC)."""
    output_kb: int = 256
    """KiB of stdout and of stderr a run may write; writing more stops it (output limit exceeded)."""


@dataclass(frozen=True)
class RunResult:
    """The outcome of one run."""

    ok: bool
    """The program ran to its last statement within the limits."""
    timed_out: bool
    """The wall-clock limit was reached and the run killed."""
    output_exceeded: bool
    """The program wrote more than ``output_kb`` to stdout or stderr and was stopped."""
    returncode: int
    """Exit status; negative for a signal. Never decides ``ok``."""
    stdout: str
    stderr: str
    wall_s: float


class SandboxError(RuntimeError):
    """The sandbox itself failed (never a failure of the program)."""


# ---- the fork server: runs as the caller (root or not), forks one child per run ---------------

# The fork server is a real module, started as a file with `python -I -S -B`: nothing of r1kit is
# imported in it, and its sys.path is the standard library plus the directories passed to it.
_SERVER = str(Path(__file__).with_name("sandbox_server.py"))

_ROOT = os.geteuid() == 0
_SITE_DIRS = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_MARKER_KEEP = 4096


class _ForkServer:
    """The fork server process and the socket to it; one request at a time."""

    def __init__(self) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # -I: no environment variables or user site; -S: no site module (faster, no .pth code);
        # -B: no .pyc files written.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", _SERVER, str(theirs.fileno()), *_SITE_DIRS],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=_ENV,
            cwd="/",
            start_new_session=True,  # out of reach of the terminal's signals
        )
        theirs.close()
        self.lock = threading.Lock()
        _, self.netns = self._receive()
        if not self.netns:
            warnings.warn(
                "r1kit.execution.sandbox: cannot create a network namespace (needs root); falling back to a "
                "socket guard inside the program's interpreter, which a program can get around",
                RuntimeWarning,
                stacklevel=4,
            )

    def _receive(self) -> tuple:
        data = self.sock.recv(1 << 16)
        if not data:
            raise SandboxError(f"the sandbox fork server exited (status {self.proc.wait()}); see its stderr")
        return marshal.loads(data)

    def call(self, *request, fds: tuple[int, ...] = ()):
        with self.lock:
            socket.send_fds(self.sock, [marshal.dumps(request)], list(fds))
            status, value = self._receive()
        if status == "error":
            raise SandboxError(f"sandbox fork server: {request[0]} failed: {value}")
        return value

    def close(self) -> None:
        self.sock.close()
        self.proc.wait()


_server: _ForkServer | None = None
_server_lock = threading.Lock()


def _fork_server() -> _ForkServer:
    global _server
    with _server_lock:
        if _server is None:
            _server = _ForkServer()
            atexit.register(_server.close)
        return _server


def _forget_server() -> None:
    # A forked copy of r1kit must not share the parent's server; it starts its own when needed.
    global _server, _server_lock
    if _server is not None:
        _server.sock.close()
    _server, _server_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_server)


def isolation() -> dict[str, str]:
    """How runs are isolated on this host (see the module docstring)."""
    return {
        "user": "per-run uid" if _ROOT else "caller's uid (not root)",
        "network": "network namespace" if _fork_server().netns else "socket guard (weaker)",
    }


# ---- per-run uids (root only) ------------------------------------------------------------------

_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


@functools.cache
def _uid_pool(world: World) -> tuple[int, int, frozenset[int]]:
    """Top half of the largest id range mapped in this user namespace, and the ids to skip; in a
    distributed run, the part of it that belongs to this process of its node (its local rank's of
    `world`'s local processes' equal parts), so processes that judge at once never share a uid.

    All of 0..2**32-2 on a plain host; often only 0..65535 inside a container.
    """

    def largest(path: str) -> tuple[int, int]:
        with open(path) as f:
            rows = [tuple(map(int, line.split())) for line in f]
        inside, _, count = max(rows, key=lambda row: row[2])
        return inside, inside + count

    ulo, uhi = largest("/proc/self/uid_map")
    glo, ghi = largest("/proc/self/gid_map")
    lo, hi = max(ulo, glo), min(uhi, ghi, 2**32 - 2)  # (uid_t)-1 means "unchanged"
    known = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    lo = (lo + hi) // 2
    part = (hi - lo) // max(1, world.local_world)
    return lo + world.local_rank * part, lo + (world.local_rank + 1) * part, frozenset(known)


def _take_uid(world: World) -> int:
    lo, hi, known = _uid_pool(world)
    with _uid_lock:
        while True:
            uid = random.randrange(lo, hi)
            if uid not in known and uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def _tasks_of(uid: int) -> int:
    """Processes and threads the user `uid` has now (what RLIMIT_NPROC counts)."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


# ---- one run ------------------------------------------------------------------------------------


def _read_into(fd: int, buf: bytearray, keep: int) -> bool:
    """Read what `fd` has now into `buf`, up to one byte more than `keep` (which tells that the
    limit was passed). False at end of file."""
    while len(buf) <= keep:
        try:
            data = os.read(fd, min(1 << 16, keep + 1 - len(buf)))
        except BlockingIOError:
            return True
        if not data:
            return False
        buf += data
    return True


def _supervise(pid: int, pipes: dict[int, int], limits: Limits) -> tuple[str | None, dict[int, bytearray]]:
    """Read `pipes` (fd -> most bytes allowed) until the run's main process exits, time is up,
    or a pipe passes its limit.

    Returns why the run was stopped ("time", "output"; None when it exited) and the bytes read
    per pipe. Waiting for end of file instead would hang on any child that still holds a pipe open.
    """
    bufs = {fd: bytearray() for fd in pipes}
    pidfd = os.pidfd_open(pid)  # readable once the process has exited; does not reap it
    try:
        poller = select.poll()
        for fd in pipes:
            os.set_blocking(fd, False)
            poller.register(fd, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + limits.wall_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "time", bufs
            for fd, _ in poller.poll(left * 1000 + 1):
                if fd == pidfd:
                    for pipe, keep in pipes.items():
                        _read_into(pipe, bufs[pipe], keep)
                    stopped = any(len(bufs[p]) > keep for p, keep in pipes.items())
                    return ("output" if stopped else None), bufs
                if not _read_into(fd, bufs[fd], pipes[fd]):
                    poller.unregister(fd)
                if len(bufs[fd]) > pipes[fd]:
                    return "output", bufs
    finally:
        os.close(pidfd)


def _run(server: _ForkServer, workdir: str, uid: int, stdin: str, limits: Limits) -> RunResult:
    nproc = limits.nproc if uid >= 0 else _tasks_of(os.getuid()) + limits.nproc
    nonce = secrets.token_hex(16).encode()
    request = ("run", workdir, uid, int(server.netns), nproc, math.ceil(limits.cpu_s),
               limits.memory_mb, limits.file_mb, nonce)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    marker_r, marker_w = os.pipe()
    stdin_fd = os.memfd_create("stdin")
    try:
        os.write(stdin_fd, stdin.encode())
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        start = time.monotonic()
        pid = server.call(*request, fds=(stdin_fd, out_w, err_w, marker_w))
    except BaseException:
        for fd in (out_r, err_r, marker_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_fd, out_w, err_w, marker_w):
            os.close(fd)
    keep = limits.output_kb * 1024
    cleaned = False
    try:
        stopped, bufs = _supervise(pid, {out_r: keep, err_r: keep, marker_r: _MARKER_KEEP}, limits)
        marker = bytes(bufs[marker_r])
        cleaned = nonce + b"C" in marker
    finally:
        os.killpg(pid, signal.SIGKILL)  # not reaped yet, so the group id cannot have been reused
        if uid >= 0 and not cleaned:
            server.call("kill_uid", uid)  # e.g. daemons that left the group; after os._exit or a kill
        returncode = server.call("reap", pid)
        for fd in (out_r, err_r, marker_r):
            os.close(fd)
    if nonce + b"E" in marker:
        error = marker.split(nonce + b"E", 1)[1].decode(errors="replace")
        raise SandboxError(f"sandbox setup failed in the run's process: {error}")
    return RunResult(
        ok=stopped is None and nonce + b"P" in marker,
        timed_out=stopped == "time",
        output_exceeded=stopped == "output",
        returncode=returncode,
        stdout=bufs[out_r][:keep].decode(errors="replace"),
        stderr=bufs[err_r][:keep].decode(errors="replace"),
        wall_s=time.monotonic() - start,
    )


def _rmtree(path: str) -> None:
    try:
        shutil.rmtree(path)
    except PermissionError:
        # Without root a program can take away its own permissions on its directories; as
        # their owner we can give them back.
        os.chmod(path, 0o700)
        for root, dirs, _ in os.walk(path):
            for name in dirs:
                full = os.path.join(root, name)
                if not os.path.islink(full):
                    os.chmod(full, 0o700)
        shutil.rmtree(path)


def _world(world: World | None) -> World:
    """`world`, or this process's as the launcher's environment says."""
    if world is not None:
        return world
    from r1kit.hardware import World  # here: this module also runs as a file of its own, without r1kit

    return World.from_env()


def run_python(source: str, stdin: str = "", limits: Limits = Limits(), world: World | None = None) -> RunResult:
    """Run `source` as a Python program in the sandbox, with `stdin` as its standard input.
    `world`: this process's place in a distributed run, which picks its part of the per-run
    uids (default: as the launcher's environment says)."""
    server = _fork_server()
    uid = _take_uid(_world(world)) if _ROOT else -1
    workdir = tempfile.mkdtemp(prefix="r1kit-run-")
    try:
        with open(os.path.join(workdir, "prog.py"), "w") as f:
            f.write(source)
        if uid >= 0:
            os.chown(workdir, uid, uid)
        return _run(server, workdir, uid, stdin, limits)
    finally:
        _rmtree(workdir)
        with _uid_lock:
            _uids_in_use.discard(uid)


def run_many(
    jobs: list[tuple[str, str]], limits: Limits | list[Limits] = Limits(), workers: int | None = None, world: World | None = None
) -> list[RunResult]:
    """Run `(source, stdin)` jobs, at most `workers` at a time (default: the CPU count, shared
    out among the processes of a distributed run on this node, which judge at the same time),
    each under `limits` (one for all, or one per job). `world`: this process's place in a
    distributed run (default: as the launcher's environment says).

    Results come back in the order of `jobs`.
    """
    world = _world(world)
    workers = workers or max(1, (os.cpu_count() or 1) // world.local_world)
    each = limits if isinstance(limits, list) else [limits] * len(jobs)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="r1kit-sandbox") as pool:
        return list(pool.map(lambda job, lim: run_python(job[0], job[1], lim, world), jobs, each))
