"""What a served evaluation records, refuses and says, against tests/fake_openai.py (issue 66): a
folder resumes only under the settings that sampled it, chat mode with a template the server would
wrap again is refused, no two samples share a random stream, a prompt past the served context stops
the run in one line, closing ends a back-off at once, progress is logged every 10 s, and Ctrl-C
during a request returns at once. No vLLM, no GPU."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from r1kit.sampling import endpoint
from r1kit.sampling.endpoint import EndpointError
from test_endpoint import PARAMS, PROMPTS, cli, make_sampler, server, short_backoff, tokenizer  # noqa: F401 - fixtures


def served_eval(server, tiny_model, out: Path, *extra: str, problems: int = 3) -> list[str]:
    return ["eval", "--benchmark", "task:addition", "--task-arg", f"n={problems}", "--endpoint", server.url, "--served-model", "tiny",
            "--model", str(tiny_model), "--output", str(out), "--samples", "2", "--max-tokens", "16", "--template", "plain", *extra]


def test_a_folder_resumes_only_under_the_sampling_settings_that_made_it(server, tiny_model, tmp_path, capsys):
    """Point 1: a folder made with --chat was reused, silently, without it."""
    from r1kit.cli import main

    out = tmp_path / "eval"
    assert main(served_eval(server, tiny_model, out, "--chat")) == 0
    settings, summary = (json.loads((out / name).read_text()) for name in ("settings.json", "summary.json"))
    assert (settings["backend"], settings["served_model"], settings["chat"]) == ("endpoint", "tiny", True)
    assert (summary["backend"], summary["chat"], summary["endpoint"]) == ("endpoint", True, [server.url])
    assert f"endpoint backend serving tiny at {server.url}, chat messages" in capsys.readouterr().out  # point 4
    asked = len(server.requests)
    for extra, changed in [([], "chat"), (["--chat", "--answer-fallback", "last_number"], "answer_fallback"),
                           (["--chat", "--served-model", "other"], "served_model")]:
        assert main(served_eval(server, tiny_model, out, *extra)) == 2
        assert f"holds an evaluation with other settings (changed: {changed})" in capsys.readouterr().err
    local = ["eval", "--benchmark", "task:addition", "--task-arg", "n=3", "--model", str(tiny_model), "--output", str(out),
             "--samples", "2", "--max-tokens", "16", "--template", "plain", "--backend", "transformers"]
    assert main(local) == 2
    assert "(changed: backend, chat, served_model)" in capsys.readouterr().err
    assert len(server.requests) == asked
    assert main(served_eval(server, tiny_model, out, "--chat")) == 0  # the same settings: nothing left to ask
    assert len(server.requests) == asked


def test_chat_with_a_template_the_server_would_wrap_again_is_refused(server, tiny_model, tmp_path, capsys):
    """Point 7: --chat sent the whole R1-Zero prompt as the user message."""
    from r1kit.cli import main

    out = tmp_path / "eval"
    args = [a for a in served_eval(server, tiny_model, out, "--chat") if a not in ("--template", "plain")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "endpoint.chat: the server wraps the user message in its own chat template, so template r1_zero's prompt" in err
    assert err.count("\n") == 1 and not server.requests and not out.exists()
    assert main([*args, "--template", "chat"]) == 0
    (first, *_) = server.requests
    assert first["prompt"][0]["content"].startswith("What is") and "Assistant:" not in first["prompt"][0]["content"]


def test_no_two_samples_share_a_stream(server, make_sampler, tiny_model, tmp_path):
    """Point 11: vLLM draws sample j of a request from seed + j, and problem i's request was seeded
    seed + i, so sample j of problem i drew what sample j - 1 of problem i + 1 drew."""
    from r1kit.cli import main

    assert main(served_eval(server, tiny_model, tmp_path / "eval", "--samples", "4", problems=5)) == 0
    make_sampler(server).generate_full(PROMPTS, 3, PARAMS)  # a call of several prompts (a rejection stage's chunk)
    for requests in (server.requests[:5], server.requests[5:]):
        streams = [r["seed"] + j for r in requests for j in range(r["n"])]
        assert len(streams) == sum(r["n"] for r in requests) and len(set(streams)) == len(streams)


def test_a_prompt_past_the_served_context_stops_the_run_in_one_line(server, make_sampler, tokenizer):
    """Point 5: vLLM cut completions short in silence when prompt plus max_tokens passed max_model_len."""
    ids = tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    server.max_model_len = len(ids) + PARAMS.max_tokens - 1
    with pytest.raises(EndpointError, match=rf"a prompt of {len(ids)} tokens plus max_tokens 8 passes the served context of "
                                            rf"{server.max_model_len} tokens \(max_model_len\).*lower max_tokens"):
        make_sampler(server).generate_full(PROMPTS[:1], 2, PARAMS)
    assert not server.requests  # refused before asking
    with pytest.raises(EndpointError, match=r"passes the served context"):  # chat: the server renders the prompt, so its first reply tells
        make_sampler(server, chat=True).generate_full(["one two three four five six seven eight nine ten eleven twelve"], 1, PARAMS)
    server.max_model_len = len(ids) + PARAMS.max_tokens
    assert len(make_sampler(server).generate_full(PROMPTS[:1], 2, PARAMS)[0]) == 2


def test_closing_ends_a_backoff_wait_at_once(server, make_sampler, monkeypatch, caplog):
    """Point 3: a retry's back-off sleep delayed Ctrl-C by up to a minute."""
    monkeypatch.setattr(endpoint, "MAX_WAIT", 60.0)
    server.retry_after, server.faults = "60", ["429"]
    sampler = make_sampler(server, retries=2)
    failed = []
    worker = threading.Thread(target=lambda: failed.append(pytest.raises(EndpointError, sampler.generate_full, PROMPTS[:1], 1, PARAMS)))
    worker.start()
    deadline = time.monotonic() + 10
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # into the 60 s wait
    sampler.close()
    worker.join(5)
    assert not worker.is_alive() and "the client was closed" in str(failed[0].value)


def test_a_request_cut_by_closing_announces_no_retry(server, make_sampler, caplog):
    """Point 13: after an HTTP 400 ended the job, the closed client's other request logged
    'connection dropped: [Errno 9] Bad file descriptor; retry 1 of 8'."""
    server.slow, server.faults = 2.0, ["slow"]
    sampler = make_sampler(server)
    worker = threading.Thread(target=lambda: pytest.raises(EndpointError, sampler.generate_full, PROMPTS[:1], 1, PARAMS))
    worker.start()
    deadline = time.monotonic() + 10
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    with caplog.at_level("WARNING", logger="r1kit"):
        sampler.close()
        worker.join(10)
    assert not worker.is_alive() and "retry" not in caplog.text


def test_a_served_eval_logs_its_progress_not_a_line_per_problem(server, tiny_model, tmp_path, caplog):
    """Point 13: an endpoint eval logged a line per problem beside the documented 10-second line."""
    from r1kit.cli import main

    with caplog.at_level("INFO", logger="r1kit"):
        assert main(served_eval(server, tiny_model, tmp_path / "eval", problems=6)) == 0
    assert "addition: 6/6 chunks, 12 samples" in caplog.text
    assert not [r for r in caplog.records if "sampled" in r.getMessage()], caplog.text


def test_ctrl_c_during_a_request_returns_at_once(server, make_sampler, ctrl_c_reaches_python):
    """Point 3: Ctrl-C waited for the requests in flight (a long sample, or a minute of back-off)."""
    server.slow, server.faults = 5.0, ["slow"]
    sampler = make_sampler(server)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sampler.generate_full(PROMPTS[:1], 1, PARAMS)
    assert time.monotonic() - start < 3
