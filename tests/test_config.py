"""Strict recipes and overrides: every bad-recipe kind exits 2, names the key, writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1kit.cli import main
from r1kit.config import apply_overrides, parse_override
from r1kit.errors import RecipeError
from r1kit.recipe import load_recipe

SFT = {"name": "sft", "kind": "sft", "data": {"source": "task:addition"}, "trainer": {"max_steps": 5}}


def base(**top):
    return {"model": "tiny", "stages": [dict(SFT)], **top}


def test_valid_recipe_loads_with_typed_sections(write_recipe):
    recipe = load_recipe(write_recipe(base(seed=7)))
    stage = recipe.stages[0]
    assert recipe.seed == 7 and stage.kind == "sft"
    assert stage.data.source == "task:addition" and stage.data.split == "train"
    assert stage.trainer == {"max_steps": 5}


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r.update(sed=1), "unknown key 'sed' (did you mean 'seed'?)"),
        (lambda r: r["stages"][0].update(dta={}), "sft: unknown key 'dta' (did you mean 'data'?)"),
        (lambda r: r["stages"][0]["data"].update(splt="x"), "sft.data: unknown key 'splt' (did you mean 'split'?)"),
        (lambda r: r["stages"][0]["trainer"].update(learing_rate=1.0), "sft.trainer: 'learing_rate' is not a field of trl.SFTConfig (did you mean 'learning_rate'?)"),
        (lambda r: r["stages"][0]["trainer"].update(max_steps="ten"), "sft.trainer.max_steps: expected int, got 'ten'"),
        (lambda r: r.update(seed="abc"), "seed: expected int, got 'abc'"),
        (lambda r: r["stages"][0]["data"].update(limit=1.5), "sft.data.limit: expected int | None, got 1.5"),
        (lambda r: r.pop("model"), "missing required key 'model'"),
        (lambda r: r["stages"][0].pop("data"), "sft: missing required key 'data'"),
        (lambda r: r["stages"][0].update(kind="gpro"), "sft.kind: unknown stage kind 'gpro' (did you mean 'grpo'?)"),
        (lambda r: r["stages"].append(dict(SFT)), "duplicate stage name 'sft'"),
        (lambda r: r["stages"][0].update(model="later"), None),  # a path: allowed
        (lambda r: r.update(stages=[]), "stages: expected a non-empty list"),
        (lambda r: r["stages"][0].update(format="chat"), "sft.format: 'chat' is not allowed; choose one of 'auto', 'messages', 'prompt_completion'"),
    ],
)
def test_bad_recipes_exit_2_name_the_key_and_write_nothing(write_recipe, tmp_path, capsys, mutate, expected):
    recipe = base()
    recipe["stages"][0] = {**SFT, "data": dict(SFT["data"]), "trainer": dict(SFT["trainer"])}
    mutate(recipe)
    path = write_recipe(recipe)
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    if expected is None:
        assert code == 0
        return
    assert code == 2
    assert err.startswith(f"r1kit: error: {path}: ")
    assert expected in err
    assert err.count("\n") == 1  # one line
    assert main(["run", str(path)]) == 2
    assert not (tmp_path / "run").exists()


def test_forward_stage_reference_is_an_error(write_recipe, capsys):
    recipe = base()
    recipe["stages"] = [
        {**SFT, "name": "a", "data": {"source": "b"}},
        {**SFT, "name": "b"},
    ]
    assert main(["validate", str(write_recipe(recipe))]) == 2
    assert "a.data.source: stage 'b' runs after 'a'" in capsys.readouterr().err


def test_invalid_yaml_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    assert main(["validate", str(bad)]) == 2
    assert f"{bad}: not valid YAML at line" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read recipe" in capsys.readouterr().err
    listed = tmp_path / "listed.yaml"
    listed.write_text("model: tiny\n? [a, b]\n: 1\n")
    assert main(["validate", str(listed)]) == 2
    assert f"{listed}: not valid YAML at line 2: a key must be a plain value, not list" in capsys.readouterr().err
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("model: café\n".encode("latin-1"))
    assert main(["validate", str(latin1)]) == 2
    assert f"{latin1}: not UTF-8 text" in capsys.readouterr().err


def test_missing_local_data_file_is_refused_before_running(write_recipe, tmp_path, capsys):
    recipe = base()
    recipe["stages"][0] = {**SFT, "data": {"source": str(tmp_path / "missing.jsonl")}}
    assert main(["run", str(write_recipe(recipe))]) == 2
    assert "sft.data.source: no such file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "model, expected",
    [
        ("package:r1kit_no_such_package/m.gguf", "model: 'package:r1kit_no_such_package/m.gguf': Python package 'r1kit_no_such_package' is not installed"),
        ("package:r1kit_fake_models/other.gguf", "model: 'package:r1kit_fake_models/other.gguf': package 'r1kit_fake_models' has no file 'other.gguf'"),
        (str("missing.gguf"), "model: no such model folder or file 'missing.gguf'"),
    ],
)
def test_missing_model_file_is_refused_before_running(write_recipe, tmp_path, monkeypatch, capsys, model, expected):
    pkg = tmp_path / "site" / "r1kit_fake_models"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tiny.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    from r1kit.models import ModelRef

    assert ModelRef.parse("package:r1kit_fake_models/tiny.gguf").package_path() == pkg / "tiny.gguf"
    assert main(["run", str(write_recipe({**base(), "model": model}))]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cli_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2


# ---- overrides


@pytest.mark.parametrize(
    "text, path, value",
    [
        ("sft.trainer.learning_rate=1e-6", ["sft", "trainer", "learning_rate"], 1e-6),
        ("seed=3", ["seed"], 3),
        ("a.b=true", ["a", "b"], True),
        ("a=null", ["a"], None),
        ("a=1.5e3", ["a"], 1500.0),
        ("model=Qwen/Qwen2.5-Math-7B", ["model"], "Qwen/Qwen2.5-Math-7B"),
        ("a=[1, 2]", ["a"], [1, 2]),
        ("a=x=y", ["a"], "x=y"),
    ],
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["noequals", "=3", "a..b=1", "a.=1"])
def test_bad_override_syntax(text):
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        parse_override(text)


def test_overrides_address_stages_by_name(write_recipe):
    recipe = load_recipe(
        write_recipe(base()),
        ["sft.trainer.learning_rate=1e-6", "seed=9", "sft.data.limit=10", "output_dir=elsewhere"],
    )
    assert recipe.stages[0].trainer["learning_rate"] == 1e-6
    assert recipe.seed == 9 and recipe.stages[0].data.limit == 10 and recipe.output_dir == "elsewhere"


def test_yaml_files_read_exponent_floats_as_floats(write_recipe):
    path = write_recipe(base())
    path.write_text(path.read_text().replace("max_steps: 5", "max_steps: 5\n    learning_rate: 1e-6"))
    assert load_recipe(path).stages[0].trainer["learning_rate"] == 1e-6


@pytest.mark.parametrize(
    "override, expected",
    [
        ("sfft.trainer.max_steps=1", "'sfft' is neither a top-level key nor a stage name (did you mean 'sft'?)"),
        ("stages.0.kind=sft", "address stages by name"),
        ("sft.trainer.max_steps=abc", "sft.trainer.max_steps: expected int, got 'abc'"),
        ("sft.trainer.nope=1", "'nope' is not a field of trl.SFTConfig"),
    ],
)
def test_bad_overrides_exit_2(write_recipe, capsys, override, expected):
    assert main(["validate", str(write_recipe(base())), override]) == 2
    assert expected in capsys.readouterr().err


def test_apply_overrides_creates_nested_keys():
    raw = {"stages": [{"name": "rl", "kind": "grpo"}]}
    apply_overrides(raw, ["rl.trainer.beta=0.001"])
    assert raw["stages"][0]["trainer"] == {"beta": 0.001}


def test_a_key_given_twice_is_refused(tmp_path, capsys):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("model: tiny\nseed: 1\nseed: 2\nstages:\n  - {name: sft, kind: sft, data: {source: task:addition}}\n")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}: not valid YAML at line 3" in err and "the key 'seed' appears twice" in err


def test_a_mistyped_kind_is_named(write_recipe, capsys):
    path = write_recipe({"model": "tiny", "stages": [{"name": "sft", "kynd": "sft", "data": {"source": "task:addition"}}]})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "sft: each stage needs a kind: one of sft, grpo, async_grpo, rejection, eval, distill, reward; is 'kynd' a typo of 'kind'?" in err



@pytest.mark.parametrize("recipe", sorted(p.name for p in (Path(__file__).parents[1] / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_validates(recipe, capsys):
    assert main(["validate", str(Path(__file__).parents[1] / "recipes" / recipe)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("data, where", [({"limit": 0}, "s.data.limit"), ({"also": [{"source": "task:addition", "limit": -5}]}, "s.data.also[0].limit")])
def test_a_data_limit_below_one_is_refused(write_recipe, tiny_model, capsys, data, where):
    stage = {"name": "s", "kind": "sft", "data": {"source": "task:addition", **data}}
    assert main(["validate", str(write_recipe({"model": str(tiny_model), "stages": [stage]}))]) == 2
    assert f"{where}: must be at least 1 (or null for every row), got" in capsys.readouterr().err
