"""r1kit.execution.sandbox: what counts as a pass, the limits, and hostile programs contained.

Hostile programs run with short limits; the fork bomb runs only after the process limit has been
seen to hold on a harmless program. Containment needs root (per-run uids), as r1kit's CI has;
the fallback without root is checked by running the sandbox as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from r1kit.execution import sandbox
from r1kit.execution.sandbox import Limits, isolation, run_many, run_python

# Room to finish on a busy machine: the programs that must end take well under a second of CPU.
FAST = Limits(wall_s=20.0, cpu_s=20.0)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need root")

CORRECT = "def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n"
WRONG = "def add(a, b):\n    return a - b\nassert add(2, 3) == 5\n"


def run(source: str, stdin: str = "", limits: Limits = FAST):
    return run_python(textwrap.dedent(source), stdin, limits)


def processes_of(uid: int) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        if int(status.split("Uid:")[1].split()[0]) == uid:
            pids.append(int(pid))
    return pids


def assert_all_gone(uid: int) -> None:
    """Killed processes take a moment to disappear; anything still there after 60 s escaped (an
    escaped process stays forever, so the limit only bounds how long a failure takes to show)."""
    deadline = time.monotonic() + 60
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uid) == []


def first_int(text: str) -> int:
    return int(text.split()[0])


def assert_next_batch_scores() -> None:
    assert [r.ok for r in run_many([(CORRECT, ""), (WRONG, "")], FAST)] == [True, False]


# ---- verdicts -----------------------------------------------------------------------------------


def test_correct_program_passes_with_its_output():
    result = run("import sys\nprint(sum(map(int, sys.stdin.read().split())))\n", stdin="2 3\n")
    assert result.ok and not result.timed_out and result.returncode == 0
    assert result.stdout == "5\n" and result.stderr == ""


@pytest.mark.parametrize(
    "source, in_stderr",
    [
        (WRONG, "AssertionError"),
        ("raise ValueError('nope')\n", "ValueError: nope"),
        ("def f(:\n    pass\n", "SyntaxError"),
        ("import sys\nsys.exit(0)\nassert False\n", ""),
        ("import os\nos._exit(0)\nassert False\n", ""),
        ("raise SystemExit\n", ""),
        ("import sys\nsys.exit('bye')\n", "bye"),
    ],
    ids=["wrong-answer", "exception", "syntax-error", "sys.exit(0)", "os._exit(0)", "SystemExit", "exit-message"],
)
def test_failures_fail_whatever_the_exit_status(source, in_stderr):
    result = run(source)
    assert not result.ok and not result.timed_out
    assert in_stderr in result.stderr


def test_exit_status_is_reported_but_does_not_decide():
    assert run("import sys\nsys.exit(0)\n").returncode == 0
    assert run("import sys\nsys.exit(3)\n").returncode == 3
    assert run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n").returncode == -15


def test_infinite_loop_times_out():
    # The CPU limit is far away: only the wall-clock limit can stop the loop (timed_out says so).
    result = run("while True:\n    pass\n", limits=Limits(wall_s=1.0, cpu_s=600))
    assert not result.ok and result.timed_out and result.wall_s >= 1.0


def test_cpu_limit_kills_a_spinning_program_before_the_wall_clock():
    # The wall clock is far away: only the CPU limit (SIGXCPU, then SIGKILL) can stop the loop.
    result = run("while True:\n    pass\n", limits=Limits(wall_s=600, cpu_s=1))
    assert not result.ok and not result.timed_out and result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_program_cannot_forge_the_pass_marker():
    # It prints marker-like text and writes guessed nonces followed by every marker letter to
    # every descriptor it has, then exits early with status 0.
    source = """
        import os, secrets
        for letter in (b"P", b"C", b"E"):
            print(secrets.token_hex(16) + letter.decode() + " PASS ok passed", flush=True)
        for fd in map(int, os.listdir("/proc/self/fd")):
            for letter in (b"P", b"C"):
                try:
                    os.write(fd, secrets.token_hex(16).encode() + letter)
                except OSError:
                    pass
        os._exit(0)
    """
    assert not run(source).ok


def test_stdin_and_parallel_runs_in_order():
    # Each run reports when it slept; with 4 workers some sleeps overlap (run one at a time, none would).
    program = "import time\nstart = time.time()\ntime.sleep(0.5)\nprint(int(input()) * 2, start, time.time())\n"
    results = run_many([(program, f"{i}\n") for i in range(8)], FAST, workers=4)
    assert [r.stdout.split()[0] for r in results] == [str(2 * i) for i in range(8)]
    spans = sorted(tuple(map(float, r.stdout.split()[1:])) for r in results)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), spans


# ---- limits and hostile programs ----------------------------------------------------------------


def test_output_beyond_the_bound_stops_the_run_and_fails_it():
    # A judge's "output limit exceeded": stopped at once (the wall limit is far away), not passed.
    roomy = Limits(wall_s=600, cpu_s=600, output_kb=64)
    flood = run("while True:\n    print('x' * 10000)\n", limits=roomy)
    assert flood.output_exceeded and not flood.ok and not flood.timed_out and len(flood.stdout) == 64 * 1024
    big = run("import sys\nsys.stderr.write('z' * 10_000_000)\nprint('end')\n", limits=roomy)
    assert big.output_exceeded and not big.ok and "end" not in big.stdout
    # Exactly at the bound is within it; a child process that floods counts as the run's output.
    exact = run("import sys\nsys.stdout.write('y' * 65536)\n", limits=roomy)
    assert exact.ok and not exact.output_exceeded and len(exact.stdout) == 65536
    child = run("import os, sys\nif os.fork() == 0:\n    sys.stdout.write('c' * 10**6)\n    os._exit(0)\nos.wait()\n", limits=roomy)
    assert child.output_exceeded and not child.ok


def test_memory_bomb_fails_with_memory_error():
    limits = Limits(wall_s=60, cpu_s=60, memory_mb=256)
    assert "MemoryError" in run("x = bytearray(8 << 30)\n", limits=limits).stderr
    grow = run("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n", limits=limits)
    assert not grow.ok and not grow.timed_out and "MemoryError" in grow.stderr


def test_deep_recursion_fails_and_the_caller_survives():
    plain = run("def f(n):\n    return f(n + 1) + 1\nf(0)\n")
    assert not plain.ok and "RecursionError" in plain.stderr
    unlimited = run("import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n")
    assert not unlimited.ok
    assert_next_batch_scores()


@root_only
def test_runs_as_an_unprivileged_uid_with_a_scrubbed_environment():
    assert isolation() == {"user": "per-run uid", "network": "network namespace"}
    result = run("import os\nprint(os.getuid(), os.getgid(), os.getgroups(), sorted(os.environ))\n")
    uid, gid, rest = result.stdout.split(" ", 2)
    assert int(uid) > 0 and int(uid) == int(gid)
    assert rest.strip() == "[] ['HOME', 'LANG', 'PATH', 'TMPDIR']"
    assert "Permission denied" in run("open('/etc/shadow').read()\n").stderr


# 200 sleeps: the limit of 16 processes and threads (the program's own included) must stop them.
SPAWN_SLEEPS = """
import os, subprocess
print(os.getuid(), flush=True)
procs = []
try:
    for _ in range(200):
        procs.append(subprocess.Popen(["sleep", "30"]))
except OSError:
    pass
print(len(procs))
"""


@root_only
def test_process_limit_holds_on_a_harmless_program():
    result = run(SPAWN_SLEEPS, limits=Limits(wall_s=60, cpu_s=60, nproc=16))
    uid, spawned = map(int, result.stdout.split())
    assert result.ok and 0 < spawned < 16
    assert_all_gone(uid)  # the sleeps outlived the program and were killed with its uid


@root_only
def test_fork_bomb_is_contained():
    held = run(SPAWN_SLEEPS, limits=Limits(wall_s=60, cpu_s=60, nproc=16))
    if not held.ok or int(held.stdout.split()[1]) >= 16:
        pytest.fail(f"the process limit does not hold; not running the fork bomb: {held}")
    source = """
        import os
        print(os.getuid(), flush=True)
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    result = run(source, limits=Limits(wall_s=2, cpu_s=2, nproc=16))
    assert not result.ok and result.timed_out
    assert_all_gone(first_int(result.stdout))
    assert_next_batch_scores()


@root_only
def test_files_outside_the_working_directory_are_untouched(tmp_path):
    shared = Path(tempfile.mkdtemp())  # world-readable directory holding a file the test owns
    try:
        shared.chmod(0o755)
        precious = shared / "precious.txt"
        precious.write_text("keep me")
        precious.chmod(0o644)
        before = precious.stat()
        source = f"""
            import os, shutil
            done = []
            attempts = {{
                "write": lambda: open({str(precious)!r}, "w").write("pwned"),
                "append": lambda: open({str(precious)!r}, "a").write("pwned"),
                "remove": lambda: os.remove({str(precious)!r}),
                "rename": lambda: os.rename({str(precious)!r}, {str(shared / "moved")!r}),
                "chmod": lambda: os.chmod({str(precious)!r}, 0o777),
                "new file": lambda: open({str(shared / "new.txt")!r}, "w").write("x"),
                "rmtree": lambda: shutil.rmtree({str(shared)!r}),
                "test tmp dir": lambda: open({str(tmp_path / "evil.txt")!r}, "w").write("x"),
                "own dir": lambda: open("mine.txt", "w").write("fine"),
            }}
            for name, attempt in attempts.items():
                try:
                    attempt()
                    done.append(name)
                except OSError:
                    pass
            print(os.getcwd())
            print(done)
        """
        result = run(source)
        workdir, done = result.stdout.splitlines()
        assert result.ok and done == "['own dir']"
        assert precious.read_text() == "keep me" and sorted(p.name for p in shared.iterdir()) == ["precious.txt"]
        after = precious.stat()
        assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (before.st_mode, before.st_uid, before.st_mtime_ns)
        assert list(tmp_path.iterdir()) == []
        assert not os.path.exists(workdir)  # the run's own directory is gone
    finally:
        shutil.rmtree(shared)


@root_only
def test_network_is_unreachable():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        source = f"""
            import socket
            s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
            s.sendall(b"hello")
        """
        result = run(source)
        assert not result.ok and "Network is unreachable" in result.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing arrived


@root_only
@pytest.mark.parametrize(
    "attack, survives",
    [
        (f"os.kill({os.getpid()}, signal.SIGKILL)", False),  # the caller: PermissionError
        ("os.kill(os.getppid(), signal.SIGKILL)", False),  # the fork server: PermissionError
        (f"os.killpg(os.getpgid({os.getpid()}), signal.SIGKILL)", False),  # the caller's group
        ("os.killpg(0, signal.SIGKILL)", False),  # its own group: ends the run
        ("os.kill(-1, signal.SIGKILL)", True),  # all it may signal: nothing but itself, spared
        ("os.setpgid(0, os.getpgid(os.getppid()))", False),  # leave its group for the server's
    ],
    ids=["caller", "fork-server", "callers-group", "own-group", "everyone", "leave-group"],  # not the pid: the same ids in every process
)
def test_killing_the_caller_fails_and_the_caller_keeps_working(attack, survives):
    result = run(f"import os, signal\n{attack}\nprint('survived')\n")
    assert result.ok is survives
    assert_next_batch_scores()  # the caller and the fork server are still there


@root_only
def test_daemons_do_not_outlive_the_run():
    drop = Path(tempfile.mkdtemp())
    try:
        drop.chmod(0o777)  # the daemons would write here if they were still alive
        daemon = f"""
            import os, time
            print(os.getuid(), flush=True)
            if os.fork() == 0:
                os.setsid()  # out of the run's process group
                if os.fork() == 0:
                    time.sleep(30)
                    open(os.path.join({str(drop)!r}, str(os.getuid())), "w").write("escaped")
                os._exit(0)
            time.sleep(0.2)
        """
        endings = ["", "os._exit(0)", "while True:\n    pass"]
        results = run_many([(textwrap.dedent(daemon) + end + "\n", "") for end in endings], Limits(wall_s=3, cpu_s=600))
        assert [r.ok for r in results] == [True, False, False]
        for r in results:
            assert_all_gone(first_int(r.stdout))  # a daemon still sleeping would be a process of its uid
        assert list(drop.iterdir()) == []
    finally:
        shutil.rmtree(drop)


# ---- without root ------------------------------------------------------------------------------

FALLBACK = """
import importlib.util, json, sys, warnings
spec = importlib.util.spec_from_file_location("sandbox", {path!r})
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    results = [sandbox.run_python(src) for src in {sources!r}]
print(json.dumps({{"isolation": sandbox.isolation(), "warned": len(caught),
                  "ok": [r.ok for r in results], "stderr": [r.stderr for r in results]}}))
"""


def _interpreter_for(uid: int) -> str | None:
    """An interpreter the unprivileged user can start (this one may sit under a private /root)."""
    for python in (sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"):
        try:
            subprocess.run([python, "-c", "pass"], user=uid, group=uid, extra_groups=[], check=True)
        except (OSError, subprocess.CalledProcessError):
            continue  # not this one
        return python
    return None


@root_only
def test_without_root_the_fallbacks_still_decide_and_block_sockets():
    nobody = 65534
    python = _interpreter_for(nobody)
    if python is None:
        pytest.skip("no Python interpreter the unprivileged user can run")
    sources = [CORRECT, WRONG, "import sys\nsys.exit(0)\n",
               "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n"]
    # A copy the unprivileged user can read: the checkout may sit in a private folder (mktemp -d).
    readable = Path(tempfile.mkdtemp(prefix="r1kit-sandbox-"))
    try:
        readable.chmod(0o755)
        for name in ("sandbox.py", "sandbox_server.py"):  # the module and the fork server it starts
            shutil.copy(Path(__file__).parents[1] / "r1kit" / "execution" / name, readable / name)
            (readable / name).chmod(0o644)
        script = FALLBACK.format(path=str(readable / "sandbox.py"), sources=sources)
        out = subprocess.run([python, "-c", script], user=nobody, group=nobody, extra_groups=[], cwd="/",
                             capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(readable)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["isolation"] == {"user": "caller's uid (not root)", "network": "socket guard (weaker)"}
    assert report["warned"] == 1
    assert report["ok"] == [True, False, False, False]
    assert "network access is disabled in the r1kit sandbox" in report["stderr"][3]


def test_the_fork_server_is_a_module_that_imports_without_side_effects():
    # Imported in a fresh interpreter: no socket touched, no namespace made, nothing run.
    probe = "import r1kit.execution.sandbox_server as s, sys; print(s.CONTROL, s.active, 'r1kit.execution.sandbox' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["-1", "{}", "False"], out.stderr


def test_run_program_reports_the_exit_status_and_marks_only_a_finished_program(tmp_path):
    # The child's last step, on its own: exit statuses as the interpreter gives them, and the
    # pass marker written only when the program ran to its end.
    probe = textwrap.dedent("""
        import os, sys
        import r1kit.execution.sandbox_server as s
        read, write = os.pipe()
        status = s.run_program(write, b"NONCE")
        os.close(write)
        print(status, os.read(read, 64).decode() or "-", file=sys.__stderr__)
    """)
    cases = {"x = 1\n": "0 NONCEP", "import sys\nsys.exit(3)\n": "3 -", "raise ValueError\n": "1 -", "import os\nos._exit(0)\n": None}
    for program, expected in cases.items():
        (tmp_path / "prog.py").write_text(program)
        out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else None
        assert last == expected, (program, out.stderr)


def test_processes_of_a_distributed_run_on_one_node_take_disjoint_uids(monkeypatch):
    """Each process of a node draws its per-run uids from its own part of the pool, so two
    processes judging at once never share a uid (RLIMIT_NPROC, the kill of a run's leftovers).
    The part follows the World the sandbox is given, not the environment."""
    from r1kit.hardware import World

    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(name, "not read")
    pools = [sandbox._uid_pool(World(rank=rank, world=3, local_rank=rank, local_world=3))[:2] for rank in range(3)]
    assert all(lo < hi for lo, hi in pools)
    assert pools[0][1] <= pools[1][0] and pools[1][1] <= pools[2][0]
