"""The command line describes itself: a version, and help for every flag with its default, the
eval flags generated from the same declarations as the eval stage's fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from r1kit.cli import _parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("r1kit 0.")


def test_eval_help_shows_the_r1_protocol_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in [("--temperature", "0.6"), ("--top-p", "0.95"), ("--max-tokens", "32768"), ("--samples", "16"), ("--backend", "auto")]:
        assert flag in text and f"(default: {default})" in text
    assert text.count("side-by-side table of evaluations") == 1


def test_every_flag_has_help():
    def walk(parser):
        for action in parser._actions:
            if action.choices and isinstance(action.choices, dict):  # subcommands
                for sub in action.choices.values():
                    yield from walk(sub)
            else:
                yield parser.prog, action

    missing = [(prog, action.dest) for prog, action in walk(_parser()) if not action.help and action.dest != "help"]
    assert missing == []


def test_eval_flags_and_the_eval_stage_share_their_declarations():
    from r1kit.evaluation.evaluate import Protocol
    from r1kit.stages.evaluate import EvalStage

    def default(f):
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

    protocol = {f.name: default(f) for f in dataclasses.fields(Protocol)}
    stage = {f.name: default(f) for f in dataclasses.fields(EvalStage)}
    assert {k: stage[k] for k in protocol} == protocol
    parsed = vars(_parser().parse_args(["eval", "--benchmark", "b", "--output", "o", "--model", "m"]))
    assert {k: parsed[k] for k in protocol} == protocol


def test_overrides_may_follow_a_flag(tmp_path, capsys):
    # `r1kit run R --accelerate-config F k=v`: argparse alone takes positionals in one run only.
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny_sft.yaml"
    assert main(["validate", str(recipe), "--here", "sft.trainer.max_steps=3"]) == 0
    assert main(["validate", str(recipe), "--here", "sft.trainer.max_stepz=3"]) == 2  # the override after the flag is read
    assert "max_stepz" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        main(["validate", str(recipe), "--here", "--bogus"])
    assert exit.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
