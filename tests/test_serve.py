"""The vLLM servers r1kit starts (r1kit.sampling.serve), with tests/fake_openai.py standing in for
vLLM's server: a started server answers and `stop` leaves no process, one that exits at once or
never answers is an error quoting its log, and a killed starter leaves no server behind. No vLLM,
no GPU."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import gone
from r1kit.sampling.base import Endpoint
from r1kit.sampling.endpoint import EndpointError, EndpointSampler
from r1kit.sampling.serve import Servers
from test_endpoint import PARAMS, PROMPTS, make_sampler, short_backoff, tokenizer  # noqa: F401 - fixtures

HERE = Path(__file__).parent
ROOT, FAKE = HERE.parent, str(HERE / "fake_openai.py")


@pytest.fixture
def gone_soon(wait_gone):
    """`wait_gone`, then SIGKILL whatever of `pids` a failed check left running (no test leaves a process)."""

    def wait(pids, limit_s: float) -> None:
        try:
            wait_gone(pids, limit_s=limit_s)
        finally:
            for pid in pids:
                if not gone(pid):
                    os.kill(pid, signal.SIGKILL)

    return wait


def child_of(log: Path) -> int:
    return int(re.search(r"fake_openai: child (\d+)", log.read_text()).group(1))


def test_started_server_answers_and_stop_leaves_no_process(tiny_model, tmp_path, make_sampler, tokenizer, gone_soon):
    # --keep-child: the server leaves its child behind when it exits, so only a signal to its process group ends it
    servers = Servers(str(tiny_model), {"max_model_len": 64, "keep_child": True}, tmp_path, start_timeout=30, command=[sys.executable, FAKE])
    servers.start()
    try:
        pids = [p.pid for p in servers.processes] + [child_of(tmp_path / f"server{i}.log") for i in range(len(servers.processes))]
        assert servers.urls and not any(map(gone, pids))
        argv = (tmp_path / "server0.log").read_text()
        assert "'--served-model-name', 'r1kit'" in argv and f"'--model', '{tiny_model}'" in argv
        assert "'--max-model-len', '64'" in argv and "'--keep-child'" in argv
        sampler = EndpointSampler(str(tiny_model), Endpoint(url=servers.urls, name=servers.name), tokenizer=tokenizer)
        try:
            assert len(sampler.generate(PROMPTS, 2, PARAMS)[2]) == 2
        finally:
            sampler.close()
    finally:
        servers.stop()
    assert servers.processes == [] and servers.urls == []
    gone_soon(pids, limit_s=10)


def test_a_server_that_exits_at_once_is_an_error_quoting_its_log(tmp_path):
    code = "import sys; print('fake: CUDA out of memory'); sys.exit(3)"
    servers = Servers("m", {}, tmp_path, start_timeout=30, command=[sys.executable, "-c", code])
    with pytest.raises(EndpointError) as error:
        servers.start()
    message = str(error.value)
    assert "\n" not in message and "server 0 exited with status 3: fake: CUDA out of memory" in message and "server0.log" in message
    assert servers.processes == []


def test_a_server_that_never_answers_is_stopped(tmp_path, gone_soon):
    code = "import os, time; print('loading', os.getpid(), flush=True); time.sleep(600)"
    servers = Servers("m", {}, tmp_path, start_timeout=2, command=[sys.executable, "-c", code])
    with pytest.raises(EndpointError, match=r"server 0 did not answer /health in 2 s \(endpoint.start_timeout\): loading \d+"):
        servers.start()
    gone_soon([int((tmp_path / "server0.log").read_text().split()[1])], limit_s=10)


STARTER = """
import sys, time
from r1kit.sampling.serve import Servers
servers = Servers(sys.argv[1], {}, sys.argv[2], 30, command=[sys.executable, sys.argv[3]]).start()
print(servers.processes[0].pid, flush=True)
time.sleep(600)
"""


def test_a_killed_starter_leaves_no_server(tiny_model, tmp_path, gone_soon):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tiny_model), str(tmp_path), FAKE], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        server = int(starter.stdout.readline())
        pids = [server, child_of(tmp_path / "server0.log")]
        assert not any(map(gone, pids))
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    gone_soon(pids, limit_s=20)
