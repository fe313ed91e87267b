"""The vLLM server r1kit starts for an async_grpo stage (r1kit.stages.async_grpo), built through
r1kit.sampling.serve.Servers with a stand-in for vLLM's server script, on a CPU: the command and
environment TRL's client needs, the weights' precision of the built trainer config, and NO_PROXY
while it runs."""

from __future__ import annotations

import json
import os
import sys

import pytest

from r1kit.stages import async_grpo
from r1kit.trainers.training import trainer_args
from test_async_trl import load


FAKE_SERVER = '''
import http.server, json, os, sys
argv = sys.argv[1:]
env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "VLLM_SERVER_DEV_MODE", "NO_PROXY")}
with open(os.environ["FAKE_OUT"], "w") as f:
    json.dump({"argv": argv, "env": env}, f)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health).serve_forever()
'''


@pytest.mark.parametrize("changes, dtype", [
    ({}, "float32"),  # TRL's default
    ({"peft": {"r": 4}}, "auto"),  # r1kit's LoRA default, model_init_kwargs {dtype: auto}: absent from the raw recipe
    ({"trainer": {"dtype": "bfloat16"}}, "bfloat16"),
    ({"trainer": {"dtype": "float32", "model_init_kwargs": {"dtype": "bfloat16"}}}, "bfloat16"),  # TRL: model_init_kwargs first
])
def test_the_started_server_gets_the_command_environment_and_precision_trl_needs(write_recipe, tmp_path, monkeypatch, changes, dtype):
    """What r1kit starts for TRL's trainer, built through `Servers` with a stand-in for vLLM's server:
    the flags TRL's client needs, the served name it asks for, the GPUs the recipe gives, the weights'
    precision of the config the trainer is built with, and a NO_PROXY that keeps TRL's HTTP client
    (requests, which honours HTTP_PROXY) off a proxy while the server runs."""
    import functools

    import requests

    from r1kit import hardware
    from r1kit.sampling import serve, vllm_backend
    from r1kit.stages.base import StageContext

    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setenv("FAKE_OUT", str(tmp_path / "seen.json"))
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(serve, "Servers", functools.partial(serve.Servers, command=[sys.executable, str(script)]))
    monkeypatch.setattr(vllm_backend, "visible_gpus", lambda: ["0", "1", "2"])
    rec = load(write_recipe, server_gpus=[1], **{**changes, "trainer": {"vllm_server_base_url": None, **changes.get("trainer", {})}})
    st = rec.stages[0]
    ctx = StageContext(recipe=rec, stage=st, dir=tmp_path / "rl", model="/models/m", datasets={})
    ctx.dir.mkdir()
    args = trainer_args(async_grpo.trl_async().AsyncGRPOConfig, ctx, **async_grpo.trainer_defaults(st))
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)  # the config built as on this CPU; the server as on a GPU machine
    with async_grpo.server(ctx, args) as url:
        assert requests.utils.should_bypass_proxies(url + "/health", no_proxy=None)
        assert requests.get(url + "/health", timeout=10).status_code == 200  # through no proxy
    assert "NO_PROXY" not in os.environ and not requests.utils.should_bypass_proxies(url + "/health", no_proxy=None)
    seen = json.loads((tmp_path / "seen.json").read_text())
    argv = seen["argv"]
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--model"] == flags["--served-model-name"] == "/models/m"  # the name TRL's worker asks for
    assert flags["--dtype"] == dtype
    assert json.loads(flags["--weight-transfer-config"]) == {"backend": "nccl"}
    assert (flags["--logprobs-mode"], flags["--max-logprobs"], flags["--tensor-parallel-size"]) == ("processed_logprobs", "-1", "1")
    assert flags["--host"] == "127.0.0.1"
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "1" and seen["env"]["VLLM_SERVER_DEV_MODE"] == "1"
