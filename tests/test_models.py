"""The model reference (r1kit.models): every form a recipe's ``model:`` or ``teacher:`` may take,
parsed, checked in one line naming the field, and resolved to a folder or hub id, with the tiny
model built and a GGUF file converted once per run folder (builders replaced by fakes here; the
real tiny model is built in test_distill, a real GGUF file in bench/lora_memory.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import r1kit.models
import r1kit.offline.tiny
from r1kit.config import Recipe
from r1kit.errors import RecipeError
from r1kit.models import ModelRef, resolve


@pytest.mark.parametrize(
    "text, form, name, file",
    [
        ("rl", "stage", "rl", ""),
        ("tiny", "tiny", "", ""),
        ("tiny:student", "tiny", "student", ""),
        ("package:my_models/sub/m.gguf", "package", "my_models", "sub/m.gguf"),
        ("models/m.gguf", "gguf", "", ""),
        ("m.gguf", "gguf", "", ""),
        ("/abs/folder", "folder", "", ""),
        ("./rel", "folder", "", ""),
        ("runs/demo/rl/model", "folder", "", ""),
        ("Qwen/Qwen2.5-Math-7B", "hub", "", ""),
        ("gpt2", "hub", "", ""),
    ],
)
def test_every_form_is_parsed(text, form, name, file):
    assert ModelRef.parse(text, stages={"rl", "sft"}) == ModelRef(text, form, name, file)


def test_a_stage_name_means_the_stage_only_where_it_is_one():
    assert ModelRef.parse("rl").form == "hub"
    assert ModelRef.parse("tiny", stages={"tiny"}).form == "stage"  # a stage may be named tiny: it comes first


def recipe(tmp_path: Path, **fields) -> Recipe:
    return Recipe(model="tiny", output_dir=str(tmp_path / "run"), stages=[], **fields)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tiny:big", "s.teacher: 'tiny:big' names no entry of tiny_models (defined: student)"),
        ("missing.gguf", "s.teacher: no such model folder or file 'missing.gguf'"),
        ("./missing", "s.teacher: no such model folder or file './missing'"),
    ],
)
def test_check_errors_are_one_line_naming_the_field(tmp_path, text, expected):
    with pytest.raises(RecipeError) as exc:
        ModelRef.parse(text).check(recipe(tmp_path, tiny_models={"student": {}}), "s.teacher")
    assert str(exc.value) == expected


def test_what_cannot_be_checked_without_the_machine_or_the_hub_passes_the_check(tmp_path):
    rec = recipe(tmp_path, tiny_models={"student": {}})
    for text in ("tiny", "tiny:student", "package:absent_pkg/m.gguf", "org/name", "rl", str(tmp_path)):
        ModelRef.parse(text, stages={"rl"}).check(rec, "model")


@pytest.fixture
def builds(monkeypatch) -> list:
    """Replaces the tiny model's builder with one that writes a config and records its arguments."""
    calls = []

    def build(out_dir, **args):
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text("{}")
        calls.append(args)
        return Path(out_dir)

    monkeypatch.setattr(r1kit.offline.tiny, "build_tiny_model", build)
    return calls


def test_the_tiny_models_are_built_once_per_run_folder_and_again_when_their_arguments_change(tmp_path, builds):
    rec = recipe(tmp_path, tiny_model={"hidden_size": 32}, tiny_models={"student": {"num_layers": 1}})
    run = tmp_path / "run" / "_models"
    assert resolve("tiny", rec) == str(run / "tiny") == resolve("tiny", rec)
    assert resolve("tiny:student", rec) == str(run / "tiny-student")
    assert builds == [{"seed": 42, "hidden_size": 32}, {"seed": 42, "num_layers": 1}]
    assert json.loads((run / "tiny" / "r1kit_tiny.json").read_text()) == {"seed": 42, "hidden_size": 32}
    rec.tiny_model = {"hidden_size": 64}
    resolve("tiny", rec)
    assert builds[-1] == {"seed": 42, "hidden_size": 64} and len(builds) == 3


@pytest.fixture
def converts(monkeypatch) -> list:
    """Replaces the GGUF converter with one that writes a config and records what it converted."""
    calls = []

    def convert(gguf_file, out_dir):
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text("{}")
        calls.append(str(gguf_file))
        return Path(out_dir)

    monkeypatch.setattr(r1kit.models, "convert_gguf", convert)
    return calls


def test_gguf_files_and_package_files_are_converted_once(tmp_path, monkeypatch, converts):
    pkg = tmp_path / "site" / "r1kit_fake_models"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "packed.gguf").write_bytes(b"GGUF")
    (pkg / "notes.txt").write_text("not a model")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "local.gguf").write_bytes(b"GGUF")
    rec, run = recipe(tmp_path), tmp_path / "run" / "_models"

    for _ in range(2):
        assert resolve(str(tmp_path / "local.gguf"), rec) == str(run / "local")
        assert resolve("package:r1kit_fake_models/packed.gguf", rec) == str(run / "packed")
    assert converts == [str(tmp_path / "local.gguf"), str(pkg / "packed.gguf")]
    assert resolve("package:r1kit_fake_models/notes.txt", rec) == str(pkg / "notes.txt")  # not GGUF: the file itself


@pytest.mark.parametrize(
    "text, expected",
    [
        ("package:r1kit_no_such_package/m.gguf", "'package:r1kit_no_such_package/m.gguf': Python package 'r1kit_no_such_package' is not installed"),
        ("package:json/absent.gguf", "'package:json/absent.gguf': package 'json' has no file 'absent.gguf'"),
        ("package:json", "'package:json': package 'json' has no file ''"),
    ],
)
def test_a_missing_package_file_is_one_line(tmp_path, text, expected):
    with pytest.raises(FileNotFoundError) as exc:
        resolve(text, recipe(tmp_path))
    assert str(exc.value) == expected


def test_stages_folders_and_hub_ids_pass_through(tmp_path, builds, converts):
    rec = recipe(tmp_path)
    assert resolve("rl", rec, {"rl": "runs/x/rl/model"}) == "runs/x/rl/model"
    assert resolve("rl", rec) == "rl"  # no stage wrote a model of that name: a hub id
    assert resolve(str(tmp_path), rec) == str(tmp_path)
    assert resolve("Qwen/Qwen2.5-Math-7B", rec) == "Qwen/Qwen2.5-Math-7B"
    assert builds == [] and converts == []
