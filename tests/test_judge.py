"""The `judge` reward against the fake OpenAI server (tests/fake_openai.py) scripted as a judge:
verdicts and scores parsed, an unreadable reply None and counted, the disk cache asked before the
server, faults retried or one line, validate's refusals; and a rejection stage that filters with it.
The same reward against a real vLLM server: tests/test_served.py."""

from __future__ import annotations

import json
import re
import socket

import pytest

from fake_openai import FakeServer
from r1kit import reward_registry
from r1kit.cli import main
from r1kit.errors import RecipeError, RewardError
from r1kit.rewards import judge as judge_module

QUESTIONS = ["What is 2+2?", "What is 2+3?", "What is 3+3?", "What is 1+1?"]


def grader(body: dict) -> str:
    """A judge that says yes when the response's last number is the reference, and mumbles when
    the response is 'mumble'."""
    text = body["messages"][-1]["content"]
    reference = re.search(r"Reference answer:\n(.*)\n", text).group(1)
    response = text.split("Response:\n", 1)[1].split("\n\nIs the final answer")[0]
    if "mumble" in response:
        return "Hmm, hard to say."
    numbers = re.findall(r"\d+", response)
    return f"Let me compare.\nVerdict: {'yes' if numbers and numbers[-1] == reference else 'no'}"


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test with its own cache folder, no cached clients or caches, and zero counts."""
    monkeypatch.setenv("R1KIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(reward_registry.STAGE_DIR, raising=False)
    judge_module.client.cache_clear()
    judge_module._caches.clear()
    monkeypatch.setattr(judge_module, "counts", {"asked": 0, "cached": 0, "unparsed": 0})
    yield
    judge_module.client.cache_clear()
    judge_module._caches.clear()


@pytest.fixture
def server():
    with FakeServer(names=["judge"]) as fake:
        fake.chat_reply = grader
        yield fake


def judge(url, **params):
    return reward_registry.build("judge", {"url": url, "model": "judge", **params})


def test_a_batch_is_graded_and_an_unreadable_reply_is_none_and_counted(server, caplog):
    completions = ["<think>2 and 2 make 5</think> The answer is 4.", "<think>so</think> 6", "mumble", "2", "7"]
    answers = ["4", "5", "6", None, "7"]
    logged = []
    scores = judge(server.url)(completions, answer=answers, prompt=QUESTIONS + ["What is 3+4?"], log_metric=lambda *kv: logged.append(kv))
    assert scores == [1.0, 0.0, None, None, 1.0]  # no reference: None, and no request
    assert logged == [("judge/unparsed", 1.0)]  # TRL's figure in a grpo stage's metrics
    assert len(server.requests) == 4 and judge_module.counts == {"asked": 4, "cached": 0, "unparsed": 1}
    assert all(r["path"] == "/v1/chat/completions" and (r["body"]["temperature"], r["body"]["max_tokens"]) == (0.0, 1024)
               for r in server.requests)
    # the batch is asked concurrently: the first completion's request is the one about 2+2, in any order
    sent = [r["prompt"][0]["content"] for r in server.requests if "What is 2+2?" in r["prompt"][0]["content"]]
    assert len(sent) == 1 and "make 5" not in sent[0] and "The answer is 4." in sent[0]  # the summary is judged
    assert "judge: 1 of 4 replies have no verdict (scored None); the first ends: 'Hmm, hard to say.'" in caplog.text


def test_scores_parse_on_a_rubric_and_a_template_of_ones_own(server):
    server.chat_reply = lambda body: {"a": "Fine.\nScore: 8", "b": "**Score:** 7/10", "c": "Score: 12", "d": "3"}[
        body["messages"][-1]["content"].split("Response:\n")[1][0]]
    assert judge(server.url, template="rubric")(["a", "b", "c", "d"], prompt=["q"] * 4) == [0.8, 0.7, None, 0.3]
    assert judge_module.counts["unparsed"] == 1
    server.chat_reply = lambda body: "EQUIVALENT" if "4 vs 4" in body["messages"][-1]["content"] else "Not equivalent."
    mine = judge(server.url, template="Compare: {response} vs {reference}. Say EQUIVALENT or NOT EQUIVALENT.", parse="verdict")
    assert mine.columns() == ["answer"]  # no {question}: no question column needed
    assert mine(["4", "5"], answer=["4", "4"]) == [1.0, 0.0]


def test_the_cache_answers_a_rerun_and_a_new_process_without_asking_again(server, tmp_path):
    completions, answers = ["4", "5", "mumble"], ["4", "4", "4"]
    reward = judge(server.url)
    first = reward(completions, answer=answers, prompt=QUESTIONS[:3])
    assert len(server.requests) == 3
    assert reward(completions, answer=answers, prompt=QUESTIONS[:3]) == first and len(server.requests) == 3
    assert judge_module.counts == {"asked": 3, "cached": 3, "unparsed": 2}  # the cached mumble is counted again
    cache = tmp_path / "cache" / "judge_cache.jsonl"
    with open(cache, "a") as f:
        f.write('{"key": "torn')  # a kill in the middle of a line
    judge_module._caches.clear()  # as a new process
    judge_module.client.cache_clear()
    assert judge(server.url)(completions, answer=answers, prompt=QUESTIONS[:3]) == first and len(server.requests) == 3
    assert cache.read_text().endswith("}\n") and len(cache.read_text().splitlines()) == 3
    judge(server.url, max_tokens=64)(completions[:1], answer=answers[:1], prompt=QUESTIONS[:1])  # other settings: asked
    assert len(server.requests) == 4


def test_the_cache_lives_in_the_stage_folder_during_a_stage(server, tmp_path):
    with reward_registry.in_stage(tmp_path / "run" / "rl"):
        assert judge(server.url)(["4"], answer=["4"], prompt=["q"]) == [1.0]
    assert (tmp_path / "run" / "rl" / "judge_cache.jsonl").exists() and not (tmp_path / "cache").exists()
    assert reward_registry.folder() == tmp_path / "cache"


def test_faults_are_retried(server):
    server.faults = ["429", "500", "drop", "garbage"]  # four requests at once, one fault each
    assert judge(server.url, concurrency=4)(["4", "5", "6", "7"], answer=["4", "4", "4", "4"], prompt=["q"] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert sorted(r["fault"] or "" for r in server.requests) == ["", "", "", "", "429", "500", "drop", "garbage"]


@pytest.mark.parametrize("fault, says", [("500", "HTTP 500: injected fault 500; 0 retries exhausted"),
                                         ("drop", "connection dropped"), ("garbage", "a reply that is not JSON")])
def test_a_fault_past_the_retries_is_one_line(server, fault, says):
    server.faults = [fault]
    with pytest.raises(RewardError) as error:
        judge(server.url, retries=0)(["4"], answer=["4"], prompt=["q"])
    assert str(error.value).startswith(f"judge: {server.url}/chat/completions: ") and says in str(error.value)
    assert "\n" not in str(error.value)


def test_a_wrong_key_a_wrong_model_and_no_server_are_one_line_each(monkeypatch):
    with FakeServer(names=["judge"], key="sk-right") as server:
        monkeypatch.setenv("JUDGE_KEY", "sk-wrong")
        cases = [({"api_key_env": "JUDGE_KEY"}, "the server refused the API key (HTTP 401); set JUDGE_KEY to a valid key"),
                 ({}, "refused the API key (HTTP 401); name the variable holding the key in the judge's api_key_env"),
                 ({"api_key_env": "JUDGE_UNSET"}, "judge: api_key_env: the environment variable JUDGE_UNSET is not set"),
                 ({"model": "big", "api_key_env": "JUDGE_RIGHT"}, "serves no model 'big'; it serves: judge (set the judge's model)")]
        monkeypatch.setenv("JUDGE_RIGHT", "sk-right")
        for params, says in cases:
            with pytest.raises(RewardError) as error:
                reward_registry.build("judge", {"url": server.url, "model": "judge", **params})(["4"], answer=["4"], prompt=["q"])
            assert says in str(error.value) and "\n" not in str(error.value)
        assert server.requests == []  # found before any grading request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RewardError, match=r"^judge: http://127.0.0.1:\d+/v1: no server answers \(connection refused"):
        judge(f"http://127.0.0.1:{port}/v1")(["4"], answer=["4"], prompt=["q"])


def test_rewards_score_grades_a_file_and_a_rerun_asks_nothing(server, tmp_path, capsys):
    rows = [{"completion": "4", "answer": "4", "prompt": "What is 2+2?"}, {"completion": "mumble", "answer": "4", "prompt": "?"}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["rewards", "score", "judge", "--input", str(src), "--output", str(dst), "--param", f"url={server.url}", "--param", "model=judge"]
    assert main(args) == 0
    assert [json.loads(line)["reward"] for line in dst.read_text().splitlines()] == [1.0, None]
    assert "judge: 2 rows, mean 1.0000, nulls 1" in capsys.readouterr().err
    assert (tmp_path / "cache" / "judge_cache.jsonl").exists()
    judge_module._caches.clear()
    assert main(args) == 0 and len(server.requests) == 2
    capsys.readouterr()
    src.write_text(json.dumps({"completion": "4", "prompt": "?"}) + "\n")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "judge: template reference needs the references, column 'answer', which the batch lacks" in err and err.count("\n") == 1


def recipe(tmp_path, reward: dict, data: dict | None = None) -> str:
    stage = {"name": "rej", "kind": "rejection", "template": "plain", "data": data or {"source": "task:addition", "task": {"n": 4}},
             "rewards": [{"name": "judge", "url": "http://127.0.0.1:8000/v1", "model": "judge", **reward}]}
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    return str(path)


def test_validate_refuses_bad_judge_settings_in_one_line(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 2+2?", "solution": "4"}) + "\n")
    cases = [({"template": "refrence"}, None, "rej.rewards[0]: reward 'judge': template: unknown judge template 'refrence' (did you mean 'reference'?)"),
             ({"template": "rubric", "parse": "verdict"}, None, "parse: template rubric ends with a score, which parse rule verdict cannot read"),
             ({"template": "Is {response} right?"}, None, "parse: a template of your own needs its parse rule"),
             ({}, {"source": str(rows)}, f"rej.rewards[0]: reward 'judge' reads column 'answer', which the rows of {rows} lack; "
                                         "they have: prompt, solution"),
             ({"url": "127.0.0.1:8000"}, None, "url[0]: '127.0.0.1:8000' is not an http(s) URL")]
    for reward, data, says in cases:
        assert main(["validate", recipe(tmp_path, reward, data)]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
        assert not (tmp_path / "run").exists()
    assert main(["validate", recipe(tmp_path, {"answer_column": "solution"}, {"source": str(rows)})]) == 0
    assert main(["validate", recipe(tmp_path, {}, {"source": str(rows), "columns": {"answer": "solution"}})]) == 0
    assert main(["validate", recipe(tmp_path, {"template": "rubric"}, {"source": str(rows)})]) == 0  # a rubric reads no reference


def test_a_rejection_stage_keeps_what_the_judge_accepts(server, tiny_model, tmp_path):
    from r1kit import pipeline
    from r1kit.recipe import load_recipe

    server.chat_reply = lambda body: "Verdict: " + ("yes" if len(body["messages"][-1]["content"]) % 2 else "no")
    path = tmp_path / "r.yaml"
    stage = {"name": "rej", "kind": "rejection", "template": "plain", "data": {"source": "task:addition", "task": {"n": 3, "digits": 1}},
             "rewards": [{"name": "judge", "url": server.url, "model": "judge"}], "samples": 4, "backend": "transformers",
             "temperature": 1.0, "max_tokens": 8, "min_total": 1.0,
             "filters": {"truncated": False, "mixed_language": False, "repetition": False}}
    path.write_text(json.dumps({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    record = pipeline.run(load_recipe(path))["rej"]
    kept = [json.loads(line) for line in open(record["dataset"])]
    cached = (tmp_path / "run" / "rej" / "judge_cache.jsonl").read_text().splitlines()
    assert 0 < len(kept) < 12 and all(r["rewards"] == {"judge": 1.0} for r in kept)
    assert len(server.requests) == len(cached) <= 12


def test_an_eval_reports_a_judged_column_beside_the_verifier_and_a_rerun_asks_nothing(server, tmp_path, capsys):
    """`r1kit eval --judge` grades saved generations: each sample's `judged`, the judge's pass@1, its
    agreement with the verifier and the samples it left unscored; the replies are cached in the
    evaluation's folder, so a rerun asks the server nothing."""
    from r1kit.evaluation.benchmarks import load_benchmark

    problems = load_benchmark("task:addition", task_args={"n": 3}).problems
    right = lambda p: f"<answer>{p.answer}</answer>"  # noqa: E731
    wrong = lambda p: f"<answer>{int(p.answer) + 1}</answer>"  # noqa: E731
    samples = [(problems[0], right), (problems[0], wrong), (problems[1], right), (problems[1], lambda p: "mumble"),
               (problems[2], wrong), (problems[2], wrong)]
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": make(p)}) + "\n" for p, make in samples))
    args = ["eval", "--benchmark", "task:addition", "--task-arg", "n=3", "--completions", str(gen), "--output", str(tmp_path / "ev"),
            "--judge", f"{{url: {server.url}, model: judge}}"]
    assert main(args) == 0
    table = capsys.readouterr().out
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert [r["judged"] for r in rows] == [1.0, 0.0, 1.0, None, 0.0, 0.0]
    assert summary["pass@1"] == pytest.approx(1 / 3) and summary["judged"] == pytest.approx(0.5)  # the mumble is not a fail
    assert summary["judge_agreement"] == 1.0 and summary["judge_unscored"] == 1 and summary["judge"]["model"] == "judge"
    assert "| judged | agreement % |" in table and "| 50.0 | 100.0 |" in table and "1 have no score" in table
    asked = len(server.requests)
    assert asked == 5 and len((tmp_path / "ev" / "judge_cache.jsonl").read_text().splitlines()) == 5
    judge_module._caches.clear()  # as a new process reads it
    assert main(args) == 0 and len(server.requests) == asked
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["judged"] == pytest.approx(0.5)


def test_an_eval_stage_with_a_judge_reports_the_judged_column(server, tiny_model, tmp_path):
    parity = []  # the verdict of each request, by its message's length

    def reply(body):
        parity.append(float(len(body["messages"][-1]["content"]) % 2))
        return "Verdict: " + ("yes" if parity[-1] else "no")

    server.chat_reply = reply
    path = tmp_path / "r.yaml"
    stage = {"name": "ev", "kind": "eval", "template": "plain", "benchmarks": ["task:addition"], "task": {"n": 4, "digits": 1},
             "samples": 2, "backend": "transformers", "max_tokens": 8, "judge": {"url": server.url, "model": "judge"}}
    path.write_text(json.dumps({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    assert main(["run", str(path)]) == 0
    record = json.loads((tmp_path / "run" / "ev" / "DONE.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "run" / "ev" / "addition" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and sorted(r["judged"] for r in rows) == sorted(parity)
    assert record["metrics"]["addition/judged"] == pytest.approx(sum(parity) / 8)
    assert "judge_agreement" in (tmp_path / "run" / "report.md").read_text()
    assert "| judged | agreement % |" in (tmp_path / "run" / "ev" / "results.md").read_text()


@pytest.mark.parametrize("flag, says", [("{model: judge}", "--judge: reward 'judge': url: the judge's server"),
                                        ("{url: http://127.0.0.1:9/v1, model: judge, template: rubrik}", "--judge: reward 'judge': template: unknown"),
                                        ("[1, 2]", "--judge: a mapping of the judge reward's parameters"),
                                        ("{serve: {model: m}}", "--judge: serve: r1kit starts a judge's server for an eval stage of a recipe")])
def test_bad_judge_flags_are_one_line(tmp_path, capsys, flag, says):
    gen = tmp_path / "gen.jsonl"
    gen.write_text("")
    assert main(["eval", "--benchmark", "task:addition", "--completions", str(gen), "--output", str(tmp_path / "ev"), "--judge", flag]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "ev").exists()


def test_validate_refuses_a_bad_judge_in_an_eval_stage(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    stage = {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "judge": {"url": "http://127.0.0.1:9/v1", "model": "judge", "weight": 2}}
    path.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "ev.judge: a judged column has no weight or when" in err and err.count("\n") == 1, err


def test_a_judge_server_that_r1kit_starts_for_a_rejection_stage(tiny_model, tmp_path, monkeypatch, wait_gone):
    """serve: r1kit starts the judge's server for the stage (the fake server standing in for vLLM's,
    scripted to say yes), the rewards read it as if the recipe named its url, and it is gone after."""
    import functools
    import sys
    from pathlib import Path

    from r1kit import pipeline
    from r1kit.recipe import load_recipe
    from r1kit.sampling import serve

    fake = str(Path(__file__).parent / "fake_openai.py")
    monkeypatch.setattr(serve, "Servers", functools.partial(serve.Servers, command=[sys.executable, fake]))
    path = tmp_path / "r.yaml"
    judge = {"name": "judge", "serve": {"model": str(tiny_model), "options": {"chat_reply": "Verdict: yes"}, "start_timeout": 60}}
    stage = {"name": "rej", "kind": "rejection", "template": "plain", "data": {"source": "task:addition", "task": {"n": 3, "digits": 1}},
             "rewards": [judge], "samples": 2, "backend": "transformers", "temperature": 1.0, "max_tokens": 8, "min_total": 1.0,
             "filters": {"truncated": False, "mixed_language": False, "repetition": False}}
    path.write_text(json.dumps({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    record = pipeline.run(load_recipe(path))["rej"]
    kept = [json.loads(line) for line in open(record["dataset"])]
    assert len(kept) == 6 and all(r["rewards"] == {"judge": 1.0} for r in kept)
    log = (tmp_path / "run" / "rej" / "reward_server0" / "server0.log").read_text()
    assert f"'--model', '{tiny_model}'" in log and "'--served-model-name', 'reward0'" in log
    wait_gone([int(re.search(r"fake_openai: child (\d+)", log).group(1))], limit_s=30)
    assert record["config"]["stage"]["rewards"][0]["serve"]["model"] == str(tiny_model)  # the recipe's entry, as written


def test_an_eval_stages_judge_names_a_reward_stages_model_by_the_stages_name(tmp_path):
    """judge: {name: reward_model, model: rm} reads the folder the stage named rm wrote, for the
    stage only; a judge left unnamed stays the `judge` reward."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from r1kit.stages.served_rewards import started

    @dataclass
    class Stage:
        name: str
        judge: dict | None

    for judge, inside in [({"name": "reward_model", "model": "rm"}, {"name": "reward_model", "model": str(tmp_path / "rm" / "model")}),
                          ({"url": "http://127.0.0.1:9/v1", "model": "judge"}, {"url": "http://127.0.0.1:9/v1", "model": "judge"})]:
        ctx = SimpleNamespace(stage=Stage("ev", judge), world=1, dir=tmp_path, models={"rm": str(tmp_path / "rm" / "model")})
        with started(ctx):
            assert {k: v for k, v in ctx.stage.judge.items() if k != "name"} == {k: v for k, v in inside.items() if k != "name"}
            assert ctx.stage.judge.get("name", "judge") == inside.get("name", "judge")
        assert ctx.stage.judge == judge
    ctx = SimpleNamespace(stage=Stage("ev", {"serve": {"model": "m"}}), world=2, dir=tmp_path, models={})
    with pytest.raises(RecipeError, match=r"^ev\.judge: serve starts reward servers in a run of one process"):
        with started(ctx):
            pass


def test_a_judge_server_that_r1kit_starts_for_an_eval_stages_judged_column(tiny_model, tmp_path, monkeypatch, wait_gone):
    """An eval stage's `judge:` with serve: r1kit starts the server for the stage (the fake server
    standing in, scripted to say yes), the judged column reads it, and it is gone after."""
    import functools
    import sys
    from pathlib import Path

    from r1kit import pipeline
    from r1kit.recipe import load_recipe
    from r1kit.sampling import serve

    fake = str(Path(__file__).parent / "fake_openai.py")
    monkeypatch.setattr(serve, "Servers", functools.partial(serve.Servers, command=[sys.executable, fake]))
    path = tmp_path / "r.yaml"
    stage = {"name": "ev", "kind": "eval", "benchmarks": ["task:addition"], "task": {"addition": {"n": 3}}, "samples": 2,
             "backend": "transformers", "template": "plain", "max_tokens": 8,
             "judge": {"serve": {"model": str(tiny_model), "options": {"chat_reply": "Verdict: yes"}, "start_timeout": 60}}}
    path.write_text(json.dumps({"model": str(tiny_model), "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    pipeline.run(load_recipe(path))
    summary = json.loads((tmp_path / "run" / "ev" / "addition" / "summary.json").read_text())
    assert summary["judged"] == 1.0 and summary["judge_unscored"] == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "ev" / "addition" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["judged"] == 1.0 for r in rows)
    log = (tmp_path / "run" / "ev" / "reward_server0" / "server0.log").read_text()
    assert f"'--model', '{tiny_model}'" in log and "'--served-model-name', 'reward0'" in log
    wait_gone([int(re.search(r"fake_openai: child (\d+)", log).group(1))], limit_s=30)


@pytest.mark.parametrize("entry, says", [
    ({"serve": {"model": "m"}, "url": "http://127.0.0.1:8000/v1"}, "serve: r1kit starts the judge's server, so it takes no url"),
    ({"serve": {"gpus": [0]}}, "serve.model: the folder or hub id of the model to serve"),
    ({"serve": {"model": "m", "gpus": "6"}}, "serve.gpus: a list of GPU indices like [6, 7]"),
    ({"serve": {"model": "m", "port": 8000}}, "serve.port: not a key of serve"),
    ({"serve": {"model": "m"}, "model": "judge"}, "model: r1kit names the model it serves"),
])
def test_validate_refuses_bad_serve_settings_in_one_line(tmp_path, capsys, entry, says):
    path = tmp_path / "r.yaml"
    stage = {"name": "rej", "kind": "rejection", "data": {"source": "task:addition"}, "rewards": [{"name": "judge", **entry}]}
    path.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
