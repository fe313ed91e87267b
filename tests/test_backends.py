"""Sampling backends as one record each (r1kit.sampling.backends): every name a recipe or ``r1kit
eval --backend`` takes is a module of that package; sharding, the checks of a recipe, of a machine
and of a server come from the record; a new backend is one module, nothing else. And vLLM counts
as present only where it really imports."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from r1kit import hardware
from r1kit.errors import RecipeError
from r1kit.hardware import Machine, World
from r1kit.recipe import load_recipe
from r1kit.sampling import backends, load_sampler, resolve_backend, shard_of
from r1kit.sampling.base import Endpoint
from r1kit.stages import hooks

ROOT = Path(__file__).resolve().parents[1]


def test_every_backend_is_a_module_of_the_package_named_as_recipes_name_it():
    assert backends.names() == ["auto", "endpoint", "transformers", "vllm", "vllm_server"]
    for name in backends.names():
        assert backends.get(name).name == name
    assert [n for n in backends.names() if backends.get(n).served] == ["endpoint", "vllm_server"]
    with pytest.raises(RecipeError, match=r"backend: 'vlm' is not a sampling backend \(did you mean 'vllm'\?\); allowed: auto, "):
        backends.get("vlm")


@pytest.mark.parametrize("backend, endpoint, prefill, tools, problem", [
    ("vlm", Endpoint(), False, False, "backend: 'vlm' is not a sampling backend (did you mean 'vllm'?)"),
    ("transformers", Endpoint(url=["http://127.0.0.1:8000/v1"]), False, False,
     "endpoint: settings of a served model, but backend is transformers; set backend: endpoint"),
    ("endpoint", Endpoint(), False, False, "endpoint.url: backend endpoint needs the server's URL"),
    ("endpoint", Endpoint(url=["http://127.0.0.1:8000/v1"], chat=True), True, False, "endpoint.chat: the server writes the assistant's turn"),
    ("endpoint", Endpoint(url=["http://127.0.0.1:8000/v1"], chat=True), False, True, "endpoint.chat: tool rollouts continue"),
    ("endpoint", Endpoint(url=["ftp://x"]), False, False, "endpoint.url[0]: 'ftp://x' is not an http(s) URL"),
    ("vllm_server", Endpoint(url=["http://127.0.0.1:8000/v1"]), False, False, "endpoint.url: backend vllm_server starts its own servers"),
    ("vllm_server", Endpoint(concurrency=0), False, False, "endpoint: need concurrency >= 1"),
    ("endpoint", Endpoint(url=["http://127.0.0.1:8000/v1"], chat=True), False, False, None),
    ("auto", Endpoint(), True, True, None),
])
def test_what_each_backend_refuses_of_the_recipe(backend, endpoint, prefill, tools, problem):
    found = backends.settings_problem(backend, endpoint, prefill, tools)
    assert (found is None) if problem is None else found.startswith(problem), found


def test_shards_come_from_the_record(monkeypatch):
    from r1kit.sampling import vllm_backend

    two = World(rank=1, world=2, local_world=2)
    assert shard_of(two, "transformers") == (1, 2) and shard_of(two, "endpoint") == (1, 2)
    assert shard_of(two, "vllm_server") == (None, 1) and shard_of(World(world=2, local_world=2), "vllm_server") == (0, 1)
    assert shard_of(two, "vllm") == (1, 2)  # on a CPU: one engine per process
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: None)
    assert shard_of(two, "vllm", {"tensor_parallel_size": 2}) == (None, 1)  # one engine of 2 GPUs, on the first process
    assert shard_of(two, "auto") == (1, 2)  # auto is vLLM on a GPU where it imports


def test_auto_takes_vllm_on_a_gpu_only_where_it_imports(monkeypatch):
    from r1kit.sampling import vllm_backend

    assert resolve_backend("auto") == "transformers"  # no GPU here
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: "vllm is installed but does not import (ImportError: x)")
    assert resolve_backend("auto") == "transformers"
    monkeypatch.setattr(vllm_backend, "vllm_problem", lambda: None)
    assert resolve_backend("auto") == "vllm"


BROKEN_VLLM = 'raise ImportError("/site-packages/vllm/_C.abi3.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")\n'


def test_a_vllm_that_is_found_but_does_not_import_is_refused_with_its_error(tmp_path, write_recipe):
    """A vLLM whose compiled ops do not match the installed torch is found by the import system but
    fails to import: it counts as absent, with its import error quoted, in every check."""
    (tmp_path / "shadow" / "vllm").mkdir(parents=True)
    (tmp_path / "shadow" / "vllm" / "__init__.py").write_text(BROKEN_VLLM)
    recipe = write_recipe({"model": "tiny", "stages": [
        {"name": "eval", "kind": "eval", "benchmarks": ["task:addition"], "backend": "vllm", "samples": 1, "max_tokens": 8}]})
    code = textwrap.dedent(f"""
        import importlib.util
        from r1kit.sampling import vllm_available
        from r1kit.sampling.vllm_backend import vllm_problem
        print(importlib.util.find_spec("vllm") is not None, vllm_available())
        print(vllm_problem())
        from r1kit import pipeline
        from r1kit.recipe import load_recipe
        print(pipeline.machine_problems(load_recipe({str(recipe)!r}))[0])
    """)
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path / 'shadow'}:{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    found, problem, note = out.stdout.splitlines()
    assert found == "True False"  # found, yet not available
    assert problem.startswith("vllm is installed but does not import (ImportError: /site-packages/vllm/_C.abi3.so: undefined symbol")
    assert note.endswith("eval.backend: " + problem + "; or set backend: transformers (auto takes vLLM on a GPU when it imports)")


def test_the_machine_and_server_checks_ask_the_record(write_recipe, monkeypatch):
    rec = load_recipe(write_recipe({"model": "tiny", "stages": [
        {"name": "eval", "kind": "eval", "benchmarks": ["task:addition"], "backend": "endpoint", "samples": 1, "max_tokens": 8,
         "endpoint": {"url": ["http://127.0.0.1:9/v1"], "api_key_env": "R1KIT_TEST_NO_SUCH_KEY"}}]}))
    st = rec.stages[0]
    assert hooks.engine_problems(st, Machine(gpu=False)) == [
        "eval.endpoint.api_key_env: the environment variable R1KIT_TEST_NO_SUCH_KEY is not set (it holds the API key)"]
    monkeypatch.setenv("R1KIT_TEST_NO_SUCH_KEY", "k")
    assert hooks.engine_problems(st, Machine(gpu=False)) == []
    assert hooks.server_problems(st)[0].startswith("eval.endpoint: ")  # nothing answers on port 9


ECHO = '''
"""``backend: echo``: answers every prompt with its own last word (a backend added by one module)."""

from r1kit.sampling.backends import Backend
from r1kit.sampling.base import Completion


class Echo:
    backend = "echo"

    def generate_full(self, prompts, n, params, tools=None):
        return [[Completion(text=p.split()[-1], tokens=1, truncated=False)] * n for p in prompts]

    def generate(self, prompts, n, params):
        return [[c.text for c in row] for row in self.generate_full(prompts, n, params)]


BACKEND = Backend(name="echo", load=lambda model, engine: Echo(), loads_weights=False)
'''


def test_a_new_backend_is_one_module(tmp_path, monkeypatch, write_recipe):
    """Put a module beside the built-in ones (here: a folder added to the package's path) and the
    sampler loads, recipes validate with it, and sharding and the checks take its record's answers."""
    (tmp_path / "echo.py").write_text(ECHO)
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(tmp_path)])
    assert "echo" in backends.names()
    from r1kit.sampling import SamplingParams

    assert load_sampler(str(tmp_path), "echo").generate(["say hello"], 2, SamplingParams()) == [["hello", "hello"]]
    assert shard_of(World(rank=1, world=2), "echo") == (1, 2)
    rec = load_recipe(write_recipe({"model": "tiny", "stages": [
        {"name": "eval", "kind": "eval", "benchmarks": ["task:addition"], "backend": "echo", "samples": 1, "max_tokens": 8}]}))
    assert rec.stages[0].backend == "echo" and hooks.engine_problems(rec.stages[0], Machine(gpu=False)) == []
    sys.modules.pop("r1kit.sampling.backends.echo", None)


def test_an_unknown_backend_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    from r1kit.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--model", "tiny", "--benchmark", "task:addition", "--backend", "vlm", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("r1kit: error: --backend: 'vlm' is not a sampling backend (did you mean 'vllm'?); allowed: auto, endpoint, "
                   "transformers, vllm, vllm_server")
    assert not out.exists()
