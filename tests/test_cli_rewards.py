"""`r1kit rewards list` and `r1kit rewards score`: how users try a verifier on their own rows."""

from __future__ import annotations

import json

import pytest

from r1kit.cli import main


def test_list_shows_every_builtin_with_its_parameters(capsys):
    assert main(["rewards", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("math_accuracy", "format", "language_consistency", "code_tests", "overlong_penalty", "reward_model"):
        assert name in out
    assert "answer_column='answer'" in out and "mode='strict'" in out and "model (required)" in out


def test_score_writes_rows_with_reward_and_a_summary(tmp_path, capsys):
    rows = [
        {"completion": "<think> 2+2 </think> <answer> 4 </answer>", "answer": "4", "id": 1},
        {"completion": "the answer is 5", "answer": "4", "id": 2},
        {"completion": "the answer is 4", "answer": "4", "id": 3},
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["rewards", "score", "math_accuracy", "--input", str(src), "--output", str(dst), "--param", "fallback=last_number"]) == 0
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["reward"] for r in out] == [1.0, 0.0, 1.0]
    assert [r["id"] for r in out] == [1, 2, 3]
    err = capsys.readouterr().err
    assert "math_accuracy: 3 rows, mean 0.6667, nulls 0" in err


def test_score_errors_are_one_line_exit_2(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"completion": "x", "answer": "1"}\n{"answer": "1"}\n')
    assert main(["rewards", "score", "math_accuracy", "--input", str(src)]) == 2
    assert "row 2: each row needs a string field 'completion'" in capsys.readouterr().err
    assert main(["rewards", "score", "math_acc", "--input", str(src)]) == 2
    assert "did you mean 'math_accuracy'" in capsys.readouterr().err
    assert main(["rewards", "score", "format", "--param", "mood=strict", "--input", str(src)]) == 2
    assert "has no parameter 'mood'" in capsys.readouterr().err
    assert main(["rewards", "score", "format", "--input", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    src.write_text('{"completion": "x", "answer": "1"}\n')
    assert main(["rewards", "score", "format", "--input", str(src), "--output", str(tmp_path / "no" / "such" / "out.jsonl")]) == 2
    assert "cannot write the scores" in capsys.readouterr().err
    for size in ("0", "-1"):  # no row would be scored: a usage error, not an empty output
        with pytest.raises(SystemExit) as exit:
            main(["rewards", "score", "format", "--input", str(src), "--batch-size", size])
        assert exit.value.code == 2 and "--batch-size: expected a whole number of at least 1" in capsys.readouterr().err


def test_a_users_own_rewards_module_does_not_shadow_the_builtins(tmp_path):
    import subprocess
    import sys

    (tmp_path / "rewards.py").write_text("def mine(completions, **columns):\n    return [1.0] * len(completions)\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    listed = subprocess.run([sys.executable, "-m", "r1kit.cli", "rewards", "list"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "math_accuracy" in listed.stdout and "r1kit.rewards.math:math_accuracy" in listed.stdout
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"completion": "x"}) + "\n")
    scored = subprocess.run([sys.executable, "-m", "r1kit.cli", "rewards", "score", "rewards:mine", "--input", str(rows)],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert json.loads(scored.stdout.splitlines()[0])["reward"] == 1.0  # and the user's module is theirs


BROKEN_REWARDS = '''
def right(completions, **columns):
    return [1.0] * len(completions)


def raises(completions, *, answer, **columns):
    return [float(a) for a in answer]


def words(completions, **columns):
    return ["yes"] * len(completions)
'''


def test_a_reward_module_beside_the_recipe_is_found_and_its_failures_are_one_line(tmp_path, monkeypatch, capsys):
    from r1kit import reward_registry as rewards
    from r1kit.errors import RewardError

    folder = tmp_path / "experiment"
    folder.mkdir()
    (folder / "beside_rewards.py").write_text(BROKEN_REWARDS)
    stage = {"name": "rl", "kind": "grpo", "data": {"source": "task:addition"}, "rewards": [{"name": "beside_rewards:right"}]}
    recipe = folder / "recipe.yaml"
    recipe.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    monkeypatch.chdir(tmp_path)  # not the recipe's folder, and no PYTHONPATH
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    assert main(["validate", str(recipe)]) == 0
    capsys.readouterr()
    with pytest.raises(RewardError, match=r"reward 'beside_rewards:raises' raised ValueError: could not convert string to float: 'x' \(at .*beside_rewards.py:\d+\); the batch had columns: answer"):
        rewards.build("beside_rewards:raises")(["c"], answer=["x"])
    with pytest.raises(RewardError, match="reward 'beside_rewards:words' returned 'yes' for completion 0; a reward returns one finite float"):
        rewards.build("beside_rewards:words")(["c"])


def test_a_reward_returning_nan_or_infinity_fails_in_one_line(tmp_path, monkeypatch, capsys):
    """`rewards score` printed invalid JSON (`NaN`) with exit 0 and GRPO logged null: a score that
    is not finite is the reward's bug, named with the completion it scored."""
    (tmp_path / "nan_rewards.py").write_text("def nan(completions, **kw):\n    return [0.5, float('nan')][: len(completions)]\n"
                                             "def inf(completions, **kw):\n    return [float('-inf')] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"completion": "a"}\n{"completion": "b"}\n')
    for name, says in [("nan_rewards:nan", "returned nan for completion 1"), ("nan_rewards:inf", "returned -inf for completion 0")]:
        assert main(["rewards", "score", name, "--input", "in.jsonl"]) == 2
        out = capsys.readouterr()
        assert says in out.err and "a reward returns one finite float" in out.err and out.out == ""


@pytest.mark.parametrize("name", ["../rec/badrew:boom", ".badrew:boom", "rec/badrew:boom"])
def test_a_path_given_as_a_reward_module_is_one_line(tmp_path, capsys, name):
    """A path (or a name starting with '.') crashed import_module with a TypeError traceback."""
    recipe = tmp_path / "r.yaml"
    stage = {"name": "rl", "kind": "grpo", "data": {"source": "task:addition"}, "rewards": [{"name": name}]}
    recipe.write_text(json.dumps({"model": "tiny", "output_dir": str(tmp_path / "run"), "stages": [stage]}))
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "is not a module name (dotted Python names, not a path)" in err and err.count("\n") == 1
