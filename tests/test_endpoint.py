"""The endpoint backend (r1kit.sampling.endpoint) against tests/fake_openai.py: retries that change
no sample, one-line errors that leave no output folder, a key written nowhere, a SIGKILLed or
interrupted ``r1kit eval`` that resumes without asking twice, chat mode, the concurrency bound, and
what a served run records, refuses and says. The servers r1kit starts: tests/test_serve.py. No
vLLM, no GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from conftest import interruptible
from fake_openai import FakeServer, Gauge, completion
from r1kit.sampling import backends, endpoint
from r1kit.sampling.base import Completion, Endpoint, SamplingParams
from r1kit.sampling.endpoint import ChatTurns, EndpointError, EndpointSampler
from r1kit.sampling.serve import free_port

HERE = Path(__file__).parent
ROOT, FAKE = HERE.parent, str(HERE / "fake_openai.py")
PROMPTS = ["What is 2+3?", "What is 7+8?", "What is 1+9?"]
PARAMS = SamplingParams(temperature=0.6, top_p=0.95, max_tokens=8, seed=5)
KEY, KEY_ENV = "sk-r1kit-test-5f2e9d41c7", "R1KIT_TEST_FAKE_KEY"


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch):
    """Backoff waits of at most 10 ms (the schedule itself: test_backoff_doubles_and_follows_retry_after)."""
    monkeypatch.setattr(endpoint, "MAX_WAIT", 0.01)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def server():
    with FakeServer(["tiny"]) as fake:
        yield fake


@pytest.fixture
def make_sampler(tokenizer):
    """EndpointSampler(s) of served model "tiny" at the fake servers given, closed at the end."""
    made = []

    def make(servers, tok=tokenizer, **fields) -> EndpointSampler:
        urls = [s.url for s in (servers if isinstance(servers, list) else [servers])]
        made.append(EndpointSampler("tiny", Endpoint(url=urls, name="tiny", **fields), tokenizer=tok))
        return made[-1]

    yield make
    for sampler in made:
        sampler.close()


def key(request: dict) -> str:
    return json.dumps([request["prompt"], request["seed"]])


# -- the protocol ----------------------------------------------------------------------------


def test_completions_send_token_ids_and_read_the_reply(server, make_sampler, tokenizer):
    got = make_sampler(server).generate_full(PROMPTS, 3, PARAMS)
    assert len(server.requests) == len(PROMPTS)  # one request a prompt, with n samples
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        (request,) = [r for r in server.requests if r["prompt"] == ids]
        assert request["path"] == "/v1/completions"
        assert request["body"] == {"model": "tiny", "n": 3, "temperature": 0.6, "top_p": 0.95, "max_tokens": 8,
                                   "seed": PARAMS.seed + 3 * i, "return_token_ids": True}  # vLLM draws sample j from seed + j
        want = [completion(ids, PARAMS.seed + 3 * i, j, 0.6, 8) for j in range(3)]  # the fake answers choices in reverse: read by index
        assert got[i] == [Completion(w["text"], len(w["token_ids"]), w["finish_reason"] == "length") for w in want]
    truncated = [c.truncated for row in got for c in row]
    assert any(truncated) and not all(truncated)
    assert len({c.text for row in got for c in row}) == 9


def test_greedy_draws_once(server, make_sampler):
    got = make_sampler(server).generate_full(PROMPTS[:1], 4, SamplingParams(temperature=0.0, max_tokens=8))
    (request,) = server.requests
    assert request["n"] == 1 and request["body"]["top_p"] == 1.0
    assert len(got[0]) == 4 and len(set(map(str, got[0]))) == 1


# -- retries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["429", "500", "503", "drop", "slow", "cut", "garbage"])
def test_a_fault_is_retried_and_changes_no_sample(server, make_sampler, fault):
    sampler = make_sampler(server, retries=2, timeout=0.5, concurrency=2)
    clean = sampler.generate_full(PROMPTS, 2, PARAMS)
    before = len(server.requests)
    server.faults = [fault, fault]
    assert sampler.generate_full(PROMPTS, 2, PARAMS) == clean
    run = server.requests[before:]
    assert sorted(r["fault"] or "" for r in run) == ["", "", "", fault, fault]
    assert Counter(key(r) for r in run if r["fault"] is None) == Counter(key(r) for r in server.requests[:before])  # each once
    assert sampler.client.requests == 2 * len(PROMPTS)


@pytest.mark.parametrize("fault, reason", [("500", "HTTP 500: injected fault 500"), ("drop", "connection dropped"),
                                           ("garbage", "not JSON"), ("cut", "cut short")])
def test_exhausted_retries_are_one_line(server, make_sampler, fault, reason):
    server.faults = [fault] * 3
    with pytest.raises(EndpointError) as error:
        make_sampler(server, retries=2).generate_full(PROMPTS[:1], 2, PARAMS)
    message = str(error.value)
    assert "\n" not in message and reason in message and "2 retries exhausted" in message and server.url in message
    assert len(server.requests) == 3 and not server.faults


def test_a_rejected_request_is_not_retried(server, make_sampler):
    server.faults = ["400"]
    with pytest.raises(EndpointError, match=r"refused the request \(HTTP 400\): injected fault 400$"):
        make_sampler(server, retries=3).generate_full(PROMPTS[:1], 2, PARAMS)
    assert len(server.requests) == 1


def test_backoff_doubles_and_follows_retry_after(server, make_sampler, monkeypatch):
    monkeypatch.setattr(endpoint, "MAX_WAIT", 60.0)
    waits: list[float] = []
    sampler = make_sampler(server, retries=4, concurrency=1)
    sampler.client.closed = SimpleNamespace(is_set=lambda: False, wait=waits.append, set=lambda: None)  # back-off waits on `closed`
    server.faults = ["500", "drop", "503"]
    sampler.generate_full(PROMPTS[:1], 1, PARAMS)
    assert len(waits) == 3 and all(2**i / 2 <= w <= 2**i for i, w in enumerate(waits))
    for retry_after, wait in [("7", 7.0), ("3600", 60.0)]:
        waits.clear()
        server.retry_after, server.faults = retry_after, ["429"]
        sampler.generate_full(PROMPTS[:1], 1, PARAMS)
        assert waits == [wait]


# -- settings and one-line errors ------------------------------------------------------------


@pytest.mark.parametrize("fields, where", [
    ({"url": []}, "endpoint.url: backend endpoint needs"),
    ({"url": ["127.0.0.1:8000/v1"]}, "endpoint.url[0]"),
    ({"url": ["ftp://host:8000/v1"]}, "endpoint.url[0]"),
    ({"url": ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1?x=1"]}, "endpoint.url[1]"),
    ({"concurrency": 0}, "concurrency 0"),
    ({"retries": -1}, "retries -1"),
    ({"timeout": 0}, "timeout 0"),
])
def test_bad_endpoint_settings_are_refused(fields, where):
    settings = Endpoint(**{"url": ["http://127.0.0.1:8000/v1"], **fields})
    problem = backends.settings_problem("endpoint", settings)
    assert problem and where in problem and "\n" not in problem
    with pytest.raises(EndpointError, match=re.escape(where)):
        EndpointSampler("tiny", settings, tokenizer=object())


def test_an_unset_key_variable_is_refused(monkeypatch):
    monkeypatch.delenv("R1KIT_TEST_UNSET_KEY", raising=False)
    settings = Endpoint(url=["http://127.0.0.1:8000/v1"], api_key_env="R1KIT_TEST_UNSET_KEY")
    assert settings.machine_problem() == ("endpoint.api_key_env: the environment variable R1KIT_TEST_UNSET_KEY is not set "
                                          "(it holds the API key)")
    with pytest.raises(EndpointError, match="variable R1KIT_TEST_UNSET_KEY is not set"):
        EndpointSampler("tiny", settings, tokenizer=object())
    monkeypatch.setenv("R1KIT_TEST_UNSET_KEY", KEY)
    assert settings.machine_problem() is None


def test_good_endpoint_settings_pass(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    served = Endpoint(url=["http://127.0.0.1:8000/v1"])
    assert backends.settings_problem("endpoint", Endpoint(url=[*served.url, "https://api.example.com/v1"], api_key_env=KEY_ENV)) is None
    assert backends.settings_problem("vllm_server", Endpoint()) is None
    assert "set backend: endpoint" in backends.settings_problem("vllm", served)
    assert "starts its own servers" in backends.settings_problem("vllm_server", served)


def eval_args(url: str, out: Path, model: Path, *extra: str, served: str = "tiny", problems: int = 8) -> list[str]:
    return [sys.executable, "-m", "r1kit.cli", "eval", "--benchmark", "task:addition", "--task-arg", f"n={problems}",
            "--endpoint", url, "--served-model", served, "--model", str(model), "--output", str(out),
            "--samples", "2", "--max-tokens", "16", "--concurrency", "2", *extra]


def cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    return subprocess.run(args, cwd=ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=300)


@pytest.fixture
def keyed_server():
    with FakeServer(["tiny", "other"], key=KEY) as fake:
        yield fake


@pytest.mark.parametrize("case, extra, env, says", [
    ("wrong key", ["--api-key-env", KEY_ENV], {KEY_ENV: "sk-wrong-0000"}, [f"set {KEY_ENV} to a valid key", "HTTP 401"]),
    ("no key", [], {}, ["HTTP 401", "api_key_env"]),
    ("unset key variable", ["--api-key-env", KEY_ENV], {}, [f"--api-key-env: the environment variable {KEY_ENV} is not set"]),
    ("wrong model", ["--api-key-env", KEY_ENV, "--served-model", "absent"], {KEY_ENV: KEY}, ["serves no model 'absent'; it serves: tiny, other (set endpoint.name; r1kit eval: --served-model)"]),
    ("closed port", [], {}, ["no server answers", "connection refused"]),
])
def test_cli_refusals_are_one_line_and_write_nothing(keyed_server, tiny_model, tmp_path, case, extra, env, says):
    url = f"http://127.0.0.1:{free_port()}/v1" if case == "closed port" else keyed_server.url
    out = tmp_path / "eval"
    done = cli(eval_args(url, out, tiny_model) + extra, env)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("r1kit: error: ") and done.stderr.rstrip().endswith(errors[0]), done.stderr
    assert all(s in errors[0] for s in says), errors[0]
    assert "sk-wrong" not in done.stderr + done.stdout and KEY not in done.stderr + done.stdout
    assert not out.exists() and not keyed_server.requests  # refused before any sample


def test_the_api_key_is_written_nowhere(keyed_server, tiny_model, tmp_path):
    out = tmp_path / "eval"
    done = cli(eval_args(keyed_server.url, out, tiny_model, "--api-key-env", KEY_ENV), {KEY_ENV: KEY})
    assert done.returncode == 0, done.stderr
    assert len(keyed_server.answered()) == 8  # sampled with the key: one request a problem
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"settings.json", "journal.jsonl", "samples.jsonl", "summary.json"}
    assert [p for p in files if KEY.encode() in p.read_bytes()] == []
    assert KEY not in done.stdout + done.stderr
    # Each row is its problem's request's sample: seeded by its first sample's place (problem x 2
    # samples, so that vLLM's streams seed + j never overlap), sample j from choice j.
    seeds = {r["seed"]: r["prompt"] for r in keyed_server.answered()}
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and sorted(seeds) == list(range(0, 16, 2))
    for row in rows:
        problem = int(row["id"].rsplit("-", 1)[1])
        want = completion(seeds[2 * problem], 2 * problem, row["sample"], 0.6, 16)
        assert (row["completion"], row["tokens"], row["truncated"]) == (want["text"], len(want["token_ids"]), want["finish_reason"] == "length")


# -- a killed run resumes --------------------------------------------------------------------


@pytest.fixture
def script_server(tmp_path):
    """tests/fake_openai.py as a process of its own, 0.3 s a request, its POSTs logged to a file."""
    port, log = free_port(), tmp_path / "requests.jsonl"
    args = [sys.executable, FAKE, "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--delay", "0.3", "--log", str(log)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "the fake server did not start"
                time.sleep(0.05)
        yield SimpleNamespace(url=url + "/v1", requests=lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else [])
    finally:
        proc.terminate()  # its handler ends its child too
        proc.wait(10)


def journaled(journal: Path) -> list[int]:
    """The first problem of each complete chunk line of `journal`."""
    starts = []
    for line in journal.read_text().splitlines(keepends=True) if journal.exists() else []:
        if line.endswith("\n") and '"chunk"' in line:
            starts.append(json.loads(line)["start"])
    return starts


def test_sigkill_mid_eval_resumes_without_asking_twice(script_server, server, tiny_model, tmp_path):
    out, problems = tmp_path / "eval", 12
    args = eval_args(script_server.url, out, tiny_model, problems=problems)
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("killed", "reference")}
    run = subprocess.Popen(args, cwd=ROOT, stdout=logs["killed"], stderr=logs["killed"])
    # Meanwhile, a run without interruption: `server` gives the same replies, without the delay.
    reference = subprocess.Popen(eval_args(server.url, tmp_path / "reference", tiny_model, problems=problems), cwd=ROOT,
                                 stdout=logs["reference"], stderr=logs["reference"])
    try:
        deadline = time.monotonic() + 120
        while len(journaled(out / "journal.jsonl")) < 3:
            assert run.poll() is None, (tmp_path / "killed.log").read_text()
            assert time.monotonic() < deadline, "no chunk journaled"
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)
        run.wait()
        done_at_kill, asked_at_kill = set(journaled(out / "journal.jsonl")), len(script_server.requests())
        assert 3 <= len(done_at_kill) < problems and not (out / "samples.jsonl").exists()

        rerun = cli(args)
        assert rerun.returncode == 0, rerun.stderr
        assert f"resuming, {len(done_at_kill)} of {problems} chunks already done" in rerun.stderr
        assert reference.wait(300) == 0, (tmp_path / "reference.log").read_text()
    finally:
        for proc in (run, reference):
            proc.kill()
            proc.wait()
        for log in logs.values():
            log.close()

    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert Counter(r["id"] for r in rows) == Counter({f"addition-test-{i}": 2 for i in range(problems)})
    assert (out / "samples.jsonl").read_text() == (tmp_path / "reference" / "samples.jsonl").read_text()
    summaries = [json.loads(path.read_text()) for path in (out / "summary.json", tmp_path / "reference" / "summary.json")]
    assert summaries[0]["endpoint"] != summaries[1]["endpoint"]  # where it answered: each run's own server
    same = [{k: v for k, v in summary.items() if k != "endpoint"} for summary in summaries]
    assert same[0] == same[1]
    assert sorted(journaled(out / "journal.jsonl")) == list(range(problems))  # each problem journaled once

    requests = script_server.requests()
    asked = Counter(r["seed"] // 2 for r in requests)  # problem i's request has seed 2i (2 samples each)
    assert sorted(asked) == list(range(problems))
    assert not [r["seed"] for r in requests[asked_at_kill:] if r["seed"] // 2 in done_at_kill]  # a journaled problem is not asked again
    assert all(asked[i] == 1 for i in done_at_kill)
    assert sum(asked.values()) - problems <= 2  # only the requests in flight at the kill (concurrency 2) were asked again
    assert all(len({json.dumps(r["prompt"]) for r in requests if r["seed"] // 2 == i}) == 1 for i in asked)
    assert max(r["inflight"] for r in requests) <= 2  # --concurrency 2 over the chunks run at once


def test_ctrl_c_mid_eval_is_one_line_and_the_rerun_resumes(script_server, tiny_model, tmp_path):
    """Issue 66, point 3: Ctrl-C printed a 50-100-line traceback ending in KeyboardInterrupt."""
    out, problems = tmp_path / "eval", 12
    args = eval_args(script_server.url, out, tiny_model, problems=problems)
    with open(tmp_path / "run.log", "w") as log:
        run = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=log, preexec_fn=interruptible)
        try:
            deadline = time.monotonic() + 120
            while len(journaled(out / "journal.jsonl")) < 3:
                assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
                time.sleep(0.02)
            run.send_signal(signal.SIGINT)
            assert run.wait(30) == 130
        finally:
            run.kill()
            run.wait()
    said = (tmp_path / "run.log").read_text()
    assert said.rstrip().endswith("r1kit: interrupted; run the same command again to resume from what finished")
    assert "Traceback" not in said and "KeyboardInterrupt" not in said and "retry" not in said, said
    done = set(journaled(out / "journal.jsonl"))
    rerun = cli(args)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming, {len(done)} of {problems} chunks already done" in rerun.stderr


# -- chat mode and the concurrency bound -----------------------------------------------------


def test_chat_mode_posts_messages_and_reads_message_content(server, make_sampler):
    """Each sample its own request (seed + j, as vLLM seeds sample j of one), so its token count is
    the server's usage, never a re-tokenization of the text (issue 66, point 6)."""
    got = make_sampler(server, chat=True).generate_full(PROMPTS[:2], 2, PARAMS)
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"] * 4
    for i, prompt in enumerate(PROMPTS[:2]):
        requests = sorted((r for r in server.requests if r["prompt"] == [{"role": "user", "content": prompt}]), key=lambda r: r["seed"])
        assert [(r["n"], r["seed"]) for r in requests] == [(1, PARAMS.seed + 2 * i), (1, PARAMS.seed + 2 * i + 1)]
        assert "return_token_ids" not in requests[0]["body"]
        want = [completion(requests[0]["prompt"], PARAMS.seed + 2 * i + j, 0, 0.6, 8) for j in range(2)]
        assert got[i] == [Completion(w["text"], len(w["token_ids"]), w["finish_reason"] == "length") for w in want]


def test_chat_mode_counts_no_tokens_the_server_does_not(server, make_sampler):
    server.usage = False
    got = make_sampler(server, chat=True).generate_full(PROMPTS[:1], 2, PARAMS)
    assert [c.tokens for c in got[0]] == [None, None] and all(c.text for c in got[0])


def test_chat_mode_without_a_tokenizer_draws_one_sample_a_request(server, make_sampler, monkeypatch):
    """An API's model (no tokenizer to load): each sample its own request, its tokens from usage."""
    import r1kit.sampling.endpoint

    monkeypatch.setattr(r1kit.sampling.endpoint, "_tokenizer", lambda model, chat: None)
    sampler = make_sampler(server, tok=None, chat=True)
    assert isinstance(sampler.tokenizer, ChatTurns) and sampler.counting is None
    got = sampler.generate_full(PROMPTS[:1], 3, PARAMS)
    assert [(r["n"], r["seed"]) for r in sorted(server.requests, key=lambda r: r["seed"])] == [(1, 5), (1, 6), (1, 7)]
    messages = [{"role": "user", "content": PROMPTS[0]}]
    want = [completion(messages, PARAMS.seed + j, 0, 0.6, 8) for j in range(3)]
    assert got[0] == [Completion(w["text"], len(w["token_ids"]), w["finish_reason"] == "length") for w in want]


def test_concurrency_bounds_requests_in_flight_over_all_servers(make_sampler):
    gauge = Gauge()
    with FakeServer(["tiny"], delay=0.2, gauge=gauge) as a, FakeServer(["tiny"], delay=0.2, gauge=gauge) as b:
        sampler = make_sampler([a, b], concurrency=3)
        prompts = [f"What is {i}+1?" for i in range(12)]
        with ThreadPoolExecutor(3) as pool:  # three callers at once (the chunks of a job), each wanting 3 requests
            list(pool.map(lambda k: sampler.generate_full(prompts[k::3], 1, PARAMS), range(3)))
        assert gauge.peak == 3 and len(a.requests) + len(b.requests) == 12
        assert a.requests and b.requests  # spread over both servers
