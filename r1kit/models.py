"""A recipe's model reference: what ``model:`` (or ``teacher:``) names, checked, and made a model.

    from r1kit.models import ModelRef
    ref = ModelRef.parse("tiny:student", stages={"rl"})    # ModelRef(text='tiny:student', form='tiny', name='student')
    ref.check(recipe, "distill.teacher")                  # RecipeError: one line naming the field
    folder = ref.resolve(recipe)                          # runs/x/_models/tiny-student, built once

The forms, in the order they are recognised:

- an earlier stage's name (``form="stage"``): the model that stage wrote;
- ``tiny`` or ``tiny:NAME`` (``"tiny"``): the offline tiny model, built with the recipe's
  ``tiny_model`` (or ``tiny_models[NAME]``) arguments into ``output_dir/_models/`` once per run
  folder, and again when those arguments change;
- ``package:NAME/FILE`` (``"package"``): a file shipped inside the installed Python package NAME,
  converted as below when it is a ``.gguf`` file;
- a path ending ``.gguf`` (``"gguf"``): converted once into a plain Hugging Face folder in
  ``output_dir/_models/`` (`convert_gguf`);
- a path (``"folder"``: absolute, relative with dots, or deeper than ``org/name``, `looks_local`);
- anything else is a hub id (``"hub"``).

transformers reads a GGUF file (with the `gguf` package) and dequantizes it, but a model loaded
that way refuses `save_pretrained`, and trainers save checkpoints. `convert_gguf` therefore
rebuilds the model from its plain config (without the quantization entry), copies the
dequantized weights in, and saves model and tokenizer as an ordinary Hugging Face folder. Weights
stay at the GGUF file's precision after dequantization (e.g. Q4_1 → float32).

Not here: loading models (TRL and the samplers do), quantized training (the converted folder is
a full-precision model), looking hub ids up.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from r1kit.errors import RecipeError

PACKAGE = "package:"


def looks_local(model: str) -> bool:
    """A path rather than a hub id (``org/name``): absolute, relative with dots, or deeper."""
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1


@dataclass(frozen=True)
class ModelRef:
    text: str
    """The reference as the recipe wrote it."""
    form: Literal["stage", "tiny", "package", "gguf", "folder", "hub"]
    """What it names (see the module docstring)."""
    name: str = ""
    """The stage's name; the ``tiny_models`` entry (empty for ``tiny``); the package's name."""
    file: str = ""
    """For ``package:NAME/FILE``: the file's path inside the package."""

    @classmethod
    def parse(cls, text: str, stages: Collection[str] = ()) -> "ModelRef":
        """The form of `text`; `stages` are the names that mean an earlier stage's model."""
        if text in stages:
            return cls(text, "stage", name=text)
        if text == "tiny" or text.startswith("tiny:"):
            return cls(text, "tiny", name=text[5:])
        if text.startswith(PACKAGE):
            name, _, rel = text[len(PACKAGE) :].partition("/")
            return cls(text, "package", name=name, file=rel)
        if text.endswith(".gguf"):
            return cls(text, "gguf")
        return cls(text, "folder" if looks_local(text) else "hub")

    def check(self, recipe, where: str) -> None:
        """What can be checked without loading anything or asking the machine: a ``tiny:NAME``
        has its ``tiny_models`` entry, a local folder or GGUF file exists. Raises RecipeError
        ``WHERE: what is wrong``. (A package's file is looked for when a run starts:
        `package_path`.)"""
        if self.form == "tiny" and self.name and self.name not in recipe.tiny_models:
            known = ", ".join(recipe.tiny_models) or "none"
            raise RecipeError(f"{where}: {self.text!r} names no entry of tiny_models (defined: {known})")
        if self.form in ("folder", "gguf") and not Path(self.text).expanduser().exists():
            raise RecipeError(f"{where}: no such model folder or file {self.text!r}")

    def package_path(self) -> Path:
        """The file that ``package:NAME/FILE`` names inside the installed Python package NAME.

        Raises FileNotFoundError with a one-line message when the package or the file is missing."""
        import importlib.util

        spec = importlib.util.find_spec(self.name) if self.name.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"{self.text!r}: Python package {self.name!r} is not installed")
        path = Path(next(iter(spec.submodule_search_locations))) / self.file
        if not self.file or not path.is_file():
            raise FileNotFoundError(f"{self.text!r}: package {self.name!r} has no file {self.file!r}")
        return path

    def resolve(self, recipe, stage_models: Mapping[str, str] = {}) -> str:
        """A local folder or hub id for this reference, building the tiny model or converting a
        GGUF file into ``recipe.output_dir/_models/`` when it is not there yet. `stage_models`:
        the models earlier stages wrote, by stage name."""
        models = Path(recipe.output_dir) / "_models"
        if self.form == "stage":
            return stage_models[self.name]
        if self.form == "tiny":
            args = recipe.tiny_models[self.name] if self.name else recipe.tiny_model
            return str(_tiny(models / self.text.replace(":", "-"), {"seed": recipe.seed, **args}))
        source = str(self.package_path()) if self.form == "package" else self.text
        if not source.endswith(".gguf"):
            return source
        out = models / Path(source).stem
        if not (out / "config.json").is_file():
            convert_gguf(source, out)
        return str(out)


def resolve(text: str, recipe, stage_models: Mapping[str, str] = {}) -> str:
    """`ModelRef.resolve` of `text`, where the names of `stage_models` mean those stages' models."""
    return ModelRef.parse(text, stage_models).resolve(recipe, stage_models)


def _tiny(out: Path, args: dict) -> Path:
    """The tiny model built with `args` in `out`: built now when missing or built with other arguments."""
    from r1kit.offline.tiny import build_tiny_model

    built = out / "r1kit_tiny.json"  # the arguments it was built with: changed ones build it anew
    if not (out / "config.json").is_file() or (built.is_file() and json.loads(built.read_text()) != args):
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_model(tmp, **args)
        (tmp / built.name).write_text(json.dumps(args, sort_keys=True))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write a plain Hugging Face model folder for `gguf_file` into `out_dir`; returns it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    plain_config = type(config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, out_dir)
    return out_dir
