"""The sandbox's fork server: the process that forks one child per run (see r1kit.execution.sandbox).

Started by r1kit.execution.sandbox as ``python -I -S -B sandbox_server.py FD DIR...``: FD is a
SOCK_SEQPACKET socket to the caller, the DIRs are the environment's site-packages. It runs as the
caller (root or not), creates the network namespace all runs share, opens the import directories
before any uid change, then serves marshal-encoded requests: ``("run", workdir, uid, netns,
nproc, cpu_s, memory_mb, file_mb, nonce)`` with the run's stdin, stdout, stderr and marker
descriptors attached, ``("reap", pid)`` and ``("kill_uid", uid)``. A run's child takes its own
session, drops to its uid, sets its limits, executes ``prog.py`` as ``__main__`` and writes the
nonce and a letter to its marker pipe: ``P`` when the program ran to its end, ``C`` once every
process of its uid is killed, ``E`` with the error when isolation failed.

Standard library only, and importable without side effects (``main()`` runs only as a script).
What it protects against, and what not, is said in r1kit.execution.sandbox.
"""

import ctypes
import marshal
import os
import resource
import socket
import sys
import traceback

CONTROL = -1  # the socket to the caller: set by main() from argv[1]
ROOT = os.geteuid() == 0
libc = ctypes.CDLL(None, use_errno=True)
# Bound now: a program may replace the os functions in its own process.
_exit, _kill, _write, _getresuid = os._exit, os.kill, os.write, os.getresuid
active = {}  # pid -> uid of the runs not reaped yet


def check(ok, what):
    if not ok:
        raise OSError(ctypes.get_errno(), what + " failed")


def open_import_dirs(extra):
    paths = [p for p in sys.path + extra if os.path.isdir(p)]
    if ROOT:
        opened = {p: "/proc/self/fd/%d" % os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths}
        def reach(d):
            for p in sorted(opened, key=len, reverse=True):
                if d == p or d.startswith(p + "/"):
                    return opened[p] + d[len(p):]
            return d
        for module in list(sys.modules.values()):
            if hasattr(module, "__path__"):  # packages already imported: encodings, ctypes
                module.__path__[:] = [reach(d) for d in module.__path__]
        paths = list(opened.values())
    sys.path[:] = paths
    sys.path_importer_cache.clear()


def become(uid):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def kill_all():
    try:
        _kill(-1, 9)  # as a run's uid: every other process of that run, wherever it went
    except ProcessLookupError:
        pass  # there was none


def isolate(uid, netns, nproc, cpu_s, memory_mb, file_mb):
    if uid >= 0:
        check(libc.prctl(38, 1, 0, 0, 0) == 0, "prctl(PR_SET_NO_NEW_PRIVS)")
        become(uid)
    limits = {resource.RLIMIT_CPU: cpu_s, resource.RLIMIT_AS: memory_mb << 20,
              resource.RLIMIT_FSIZE: file_mb << 20, resource.RLIMIT_NPROC: nproc,
              resource.RLIMIT_CORE: 0}
    for res, value in limits.items():
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:  # without root a hard limit can only be lowered
            value = min(value, hard)
        resource.setrlimit(res, (value, value))
    if not netns:
        class NoSocket(socket.socket):
            def __init__(self, *args, **kwargs):
                raise PermissionError("network access is disabled in the r1kit sandbox")
        socket.socket = socket.SocketType = socket._socket.socket = NoSocket


def run_program(marker, nonce):
    """Execute prog.py as __main__; return the exit status the interpreter would give."""
    sys.argv[:] = ["prog.py"]
    module = type(sys)("__main__")
    module.__file__ = "prog.py"
    sys.modules["__main__"] = module
    try:
        with open("prog.py") as f:
            code = compile(f.read(), "prog.py", "exec")
        exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # without this frame
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            stream.flush()
    _write(marker, nonce + b"P")
    return 0


def child(request, fds, ready):
    """The run: never returns."""
    workdir, uid, netns, nproc, cpu_s, memory_mb, file_mb, nonce = request
    stdin, stdout, stderr, marker = fds
    status, dropped = 1, False
    try:
        # A session of its own: its process group id stays its pid whatever the program does.
        os.setsid()
        os.close(ready)
        os.close(CONTROL)
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
        try:
            isolate(uid, netns, nproc, cpu_s, memory_mb, file_mb)
        except BaseException as exc:
            _write(marker, nonce + b"E" + repr(exc).encode())
            raise
        dropped = uid >= 0 and _getresuid() == (uid, uid, uid)
        status = run_program(marker, nonce)
    finally:
        try:
            if dropped:
                kill_all()
                _write(marker, nonce + b"C")
        finally:
            _exit(status)  # no interpreter shutdown: the program's threads are not waited for


def kill_uid(uid):
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            become(uid)
            kill_all()
            status = 0
        finally:
            _exit(status)
    check(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "killing the processes of uid %d" % uid)


def handle(request, fds):
    if request[0] == "run":
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            child(request[1:], fds, ready_w)
        for fd in fds + [ready_w]:
            os.close(fd)
        os.read(ready_r, 1)  # end of file once the child has its own session and process group
        os.close(ready_r)
        active[pid] = request[2]
        return pid
    if request[0] == "reap":
        active.pop(request[1])
        return os.waitstatus_to_exitcode(os.waitpid(request[1], 0)[1])
    if request[0] == "kill_uid":
        return kill_uid(request[1])
    raise ValueError("unknown request %r" % (request[0],))


def main():
    global CONTROL
    CONTROL = int(sys.argv[1])
    netns = ROOT and libc.unshare(0x40000000) == 0  # CLONE_NEWNET, inherited by every run
    open_import_dirs(sys.argv[2:])
    import collections, functools, heapq, itertools, math, re, string, typing  # noqa: F401, E401  (shared by all runs)
    # Warm the compiler and traceback printing here, once, rather than in every run (~3 ms each).
    try:
        exec(compile("def f(n):\n    return [i for i in range(n)]\nraise ValueError(f(2))", "warm", "exec"), {})
    except ValueError as exc:
        traceback.format_exception(type(exc), exc, exc.__traceback__)
    sock = socket.socket(fileno=CONTROL)
    sock.send(marshal.dumps(("hello", netns)))
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
        if not message:
            break  # the caller has gone
        try:
            reply = ("ok", handle(marshal.loads(message), fds))
        except Exception as exc:
            reply = ("error", repr(exc))
        sock.send(marshal.dumps(reply))
    for pid, uid in active.items():  # runs still going when the caller went
        os.killpg(pid, 9)
        if uid >= 0:
            kill_uid(uid)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
