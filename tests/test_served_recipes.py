"""Served models in recipes and jobs, without a server: what validate refuses before any request,
what --here and run ask the servers, the server flags r1kit writes, and a job that samples
chunks concurrently and still journals each once, in any order, read back in item order."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from r1kit.cli import main
from r1kit.hardware import World
from r1kit.sampling import shard_of
from r1kit.sampling.base import Completion
from r1kit.sampling.jobs import Chunk, Job, Request
from r1kit.sampling.serve import flags

CLOSED = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there


def recipe(tmp_path, **stage) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": [
        {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "max_tokens": 16,
         "backend": "endpoint", "endpoint": {"url": [CLOSED], "name": "m"}, **stage}]}))
    return str(path)


@pytest.mark.parametrize("stage, says", [
    ({"endpoint": {"url": ["127.0.0.1:8000/v1"]}}, "ev.endpoint.url[0]: '127.0.0.1:8000/v1' is not an http(s) URL"),
    ({"endpoint": {"url": [CLOSED], "concurrency": 0}}, "ev.endpoint: need concurrency >= 1"),
    ({"endpoint": {"url": [CLOSED], "retries": -1}}, "retries -1"),
    ({"endpoint": {}}, "ev.endpoint.url: backend endpoint needs the server's URL"),
    ({"backend": "transformers"}, "ev.endpoint: settings of a served model, but backend is transformers"),
    ({"backend": "vllm_server"}, "ev.endpoint.url: backend vllm_server starts its own servers"),
    ({"endpoint": {"url": [CLOSED], "chat": True}, "think_prefill": True}, "ev.endpoint.chat: the server writes the assistant's turn"),
    ({"endpoint": {"url": [CLOSED], "chat": True}, "tools": ["python"]}, "ev.endpoint.chat: tool rollouts continue r1kit's own prompt"),
    ({"endpoint": {"url": [CLOSED], "concurency": 4}}, "unknown key 'concurency' (did you mean 'concurrency'?)"),
])
def test_validate_refuses_bad_endpoint_settings_in_one_line(tmp_path, capsys, stage, says):
    assert main(["validate", recipe(tmp_path, **stage)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_validate_notes_what_only_this_machine_lacks_and_here_asks_the_server(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("R1KIT_TEST_KEY", raising=False)
    path = recipe(tmp_path, endpoint={"url": [CLOSED], "name": "m", "api_key_env": "R1KIT_TEST_KEY"})
    assert main(["validate", path]) == 0
    assert "note: not runnable on this machine" in capsys.readouterr().err  # an unset key: a note, the recipe is fine
    assert main(["validate", path, "--here"]) == 2
    assert "R1KIT_TEST_KEY is not set" in capsys.readouterr().err
    monkeypatch.setenv("R1KIT_TEST_KEY", "secret")
    assert main(["validate", path]) == 0  # asks nothing without --here
    assert main(["validate", path, "--here"]) == 2
    assert "ev.endpoint: http://127.0.0.1:9/v1: no server answers (connection refused" in capsys.readouterr().err
    assert main(["run", path]) == 2  # run asks before it writes anything
    assert "no server answers" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_eval_flags_for_a_served_model(tmp_path, capsys):
    out = str(tmp_path / "out")
    for argv, says in [
        (["--endpoint", CLOSED], "--endpoint needs --served-model NAME"),
        (["--endpoint", "ftp://x", "--model", "m"], "--endpoint[0]: 'ftp://x' is not an http(s) URL"),
        (["--endpoint", CLOSED, "--model", "m", "--backend", "vllm"], "--endpoint samples a served model; it takes no --backend vllm"),
        (["--served-model", "m", "--model", "m"], "--served-model, --api-key-env and --chat go with --endpoint URL"),
        (["--endpoint", CLOSED, "--model", "m", "--api-key-env", "R1KIT_UNSET_KEY"], "--api-key-env: the environment variable R1KIT_UNSET_KEY is not set"),
        (["--endpoint", CLOSED, "--served-model", "m"], "http://127.0.0.1:9/v1: no server answers"),
    ]:
        assert main(["eval", "--benchmark", "task:addition", "--output", out, *argv]) == 2, argv
        assert says in capsys.readouterr().err, argv
    assert not (tmp_path / "out").exists()


def test_server_flags_are_the_backend_options_spelled_as_vllm_takes_them():
    assert flags({"max_model_len": 8192, "enforce_eager": True, "enable_chunked_prefill": False, "limit_mm_per_prompt": {"image": 0}}) == [
        "--max-model-len", "8192", "--enforce-eager", "--no-enable-chunked-prefill", "--limit-mm-per-prompt", '{"image": 0}']


def test_started_servers_are_sampled_by_the_main_process_only_and_endpoints_by_every_one():
    world = World(rank=1, world=4, local_rank=1, local_world=4)
    assert shard_of(world, "vllm_server") == (None, 1)
    assert shard_of(World(rank=0, world=4, local_rank=0, local_world=4), "vllm_server") == (0, 1)
    assert shard_of(world, "endpoint") == (1, 4)


class Slow:
    """A served engine's stand-in: `concurrency` calls at once, each taking a random time."""

    backend, tokenizer = "endpoint", None

    def __init__(self, concurrency: int):
        self.concurrency, self.active, self.most, self.calls = concurrency, 0, 0, []
        self.lock = threading.Lock()

    def generate_full(self, prompts, n, params, tools=None):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            self.calls.append(prompts)
        time.sleep(random.Random(prompts[0]).uniform(0.0, 0.05))
        with self.lock:
            self.active -= 1
        return [[Completion(f"{p}-{i}", 1, False) for i in range(n)] for p in prompts]


class Work:
    def request(self, chunk: Chunk, sampler) -> Request:
        return Request([f"p{i}" for i in range(chunk.start, chunk.stop)], 2, None)

    def records(self, chunk, request, completions, sampler):
        return [{"item": chunk.start + j, "texts": [c.text for c in row]} for j, row in enumerate(completions)]


def test_a_concurrent_job_journals_chunks_as_they_finish_and_reads_them_in_order(tmp_path):
    engine = Slow(concurrency=4)
    job = Job(tmp_path, {"h": 1}, items=30, chunk=1, name="t")
    assert job.sample(Work(), lambda: engine) == 30
    assert 1 < engine.most <= 4  # several at once, never more than the engine takes
    lines = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()[1:]]
    assert sorted(line["start"] for line in lines) == list(range(30))
    assert [r["item"] for r in job.records()] == list(range(30))
    assert [r["texts"] for r in job.records()][7] == ["p7-0", "p7-1"]
    assert job.sample(Work(), lambda: engine) == 0 and len(engine.calls) == 30  # nothing asked twice


def test_the_docs_say_what_validate_asks():
    """Issue 66, point 9: docs/served.md said that plain validate notes a server that does not
    answer; it asks no server (test_validate_notes_what_only_this_machine_lacks_and_here_asks_the_server)."""
    from pathlib import Path

    text = " ".join((Path(__file__).parents[1] / "docs" / "served.md").read_text().split())
    assert "notes an unset key variable; it asks no server. `--here` refuses an unset key variable and asks each server" in text
    assert "or a server that does not answer" not in text
