"""Recipes: strict, typed experiment configs loaded from YAML.

A recipe is the whole experiment::

    model: tiny                      # hub id, local folder, .gguf file, or `tiny` (built offline)
    output_dir: runs/demo
    seed: 42
    stages:
      - name: cold_start             # also the stage's folder and its override prefix
        kind: sft                    # a key of the stage registry (r1kit.stages)
        data: {source: data/cot.jsonl}
        trainer: {max_steps: 200}    # fields of the trainer library's config (trl.SFTConfig), as they are

Each stage kind declares its own dataclass (sections match the YAML). Loading is strict: an
unknown key, a wrong type, a missing required field or an unknown stage kind raises `RecipeError`
with one line naming the file, the key path (stages are addressed by name, as in overrides) and
what is allowed. `trainer:` blocks are checked against the trainer library's own dataclass.

Overrides are ``KEY=VALUE`` with dotted paths whose first part is a top-level key or a stage name
(``rl.trainer.learning_rate=1e-6``); values are YAML scalars. Both YAML files and overrides read
``1e-6`` as a float (plain YAML 1.1 reads it as a string).

This module holds the building blocks (typed sections, strict conversion, overrides); stage kinds
build their configs from them, and `r1kit.recipe` reads a whole recipe file with them. It only
parses and checks; it runs nothing and writes nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from r1kit.errors import RecipeError, suggest
from r1kit.templates import Prompting


# ---------------------------------------------------------------------------------------------
# YAML with floats the way people write them


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        # Plain YAML keeps the last of two equal keys without a word: a silent typo.
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` brings defaults that the mapping's own keys override
            key = self.construct_object(key_node, deep=True)
            if not _hashable(key):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a plain value, not {type(key).__name__} {key!r}", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


# ---------------------------------------------------------------------------------------------
# Config sections shared by stage kinds


@dataclass
class DataConfig:
    """Where a stage's rows come from and which columns it reads."""

    source: str
    """Hub dataset id, local .jsonl/.json/.parquet file, `task:NAME` (r1kit.offline.tasks), `reasoning_gym:NAME` (r1kit.environments.reasoning_gym), or an earlier stage's name."""
    split: str = "train"
    """Split to load from a hub dataset (local files have one split)."""
    subset: str | None = None
    """Hub dataset configuration name, if it has several."""
    limit: int | None = None
    """Use only the first `limit` rows."""
    prompt: str = "prompt"
    """Column holding the prompt (a string, or a list of chat messages)."""
    completion: str = "completion"
    """Column holding the target completion (SFT on prompt/completion rows)."""
    messages: str = "messages"
    """Column holding whole conversations (SFT on chat rows)."""
    task: dict[str, Any] = field(default_factory=dict)
    """Arguments of a synthetic task (`source: task:NAME`, see r1kit.offline.tasks)."""
    columns: dict[str, str] = field(default_factory=dict)
    """Columns to rename for the stage and its rewards, new name: column in the data
    (``{test_cases: official_tests}``)."""
    where: dict[str, Any] = field(default_factory=dict)
    """Keep only rows whose column holds one of the listed values (``{language: python,
    interaction_format: [null, ""]}``); applied before `limit`."""
    assign: dict[str, Any] = field(default_factory=dict)
    """Columns set to one value on every row of this source (``{task: code}``, what `when:` routes on)."""
    also: list[DataConfig] = field(default_factory=list)
    """More sources whose rows join these, each a data section of its own (source, prompt,
    columns, where, assign, limit, ...); their prompt, completion and messages columns take this
    section's names, and a column one source lacks is null on its rows."""


@dataclass(kw_only=True)
class StageConfig:
    """Fields every stage has. Stage kinds subclass this with their own sections."""

    REFUSED: ClassVar[dict[str, str]] = {}
    """Fields a stage kind does not take though a neighbouring kind does, each with why (`from_dict`)."""

    name: str
    """Unique stage name: its folder under output_dir and its prefix in overrides."""
    kind: str
    """Stage kind, a key of the stage registry."""
    model: str | None = None
    """Model to start from: an earlier stage's name, a path, a hub id. Default: the previous model."""


@dataclass(kw_only=True)
class PromptStageConfig(StageConfig, Prompting):
    """Fields of the stages that prompt the model with a dataset's questions and score the answers
    with rewards (grpo, rejection): data, rewards, and `template` / `think_prefill`."""

    data: DataConfig
    """Prompts; every other column reaches the rewards as a keyword argument."""
    rewards: list[dict[str, Any]] = field(default_factory=list)
    """Rewards: {name, weight, when, <parameters>} each; names from `r1kit rewards list` or module:function
    (may be left out where the stage's environment owns the reward)."""


@dataclass
class Recipe:
    """A whole experiment: a model, an output folder and an ordered list of stages."""

    model: str
    """Starting model: hub id, local folder, .gguf file (or package:NAME/FILE inside an installed
    Python package), `tiny` (a small model built offline) or `tiny:NAME` (one of `tiny_models`)."""
    output_dir: str
    """Run folder; each stage writes into output_dir/<stage name>/."""
    stages: list[StageConfig]
    """Stages, run in order."""
    seed: int = 42
    """Seed for every stage (trainer seeds, sampling, data shuffles)."""
    tiny_model: dict[str, Any] = field(default_factory=dict)
    """Arguments of r1kit.offline.tiny.build_tiny_model when `model: tiny`."""
    tiny_models: dict[str, dict[str, Any]] = field(default_factory=dict)
    """More tiny models, by name, for stages that start from (or are taught by) `tiny:NAME`: a
    distillation student narrower than its teacher. Same tokenizer as `tiny`."""
    source: str = field(default="<recipe>", metadata={"internal": True})

    def stage(self, name: str) -> StageConfig:
        return next(s for s in self.stages if s.name == name)


# ---------------------------------------------------------------------------------------------
# Strict conversion of plain data into dataclasses


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def convert(value: Any, tp: Any, where: str) -> Any:
    """`value` checked against (and converted to) type `tp`; `where` names it in errors."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if _is_union(tp):
        errors = []
        for option in typing.get_args(tp):
            try:
                return convert(value, option, where)
            except RecipeError as exc:
                errors.append(exc)
        raise RecipeError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise RecipeError(f"{where}: expected null, got {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        raise RecipeError(f"{where}: {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{where}: expected a mapping, got {value!r}")
        args = typing.get_args(tp)
        vt = args[1] if args else Any
        return {k: convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(tp, type) and issubclass(tp, __import__("enum").Enum):
        try:
            return tp(value).value
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise RecipeError(f"{where}: {value!r} is not allowed; choose one of {allowed}") from None
    elif isinstance(tp, type):
        if isinstance(value, tp):
            return value
    else:  # exotic typing constructs in third-party dataclasses: accept
        return value
    raise RecipeError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def from_dict(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, strictly."""
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping of {cls.__name__} fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}
    kwargs = {}
    refused = getattr(cls, "REFUSED", {})  # a stage kind's: fields of its neighbours it does not take, and why
    for key, value in data.items():
        if key in refused:
            raise RecipeError(f"{where}.{key}: not in a {data.get('kind', cls.__name__)} stage: {refused[key]}")
        if key not in fields:
            raise RecipeError(
                f"{where}: unknown key {key!r}{suggest(str(key), list(fields))}; "
                f"allowed: {', '.join(fields)}"
            )
        kwargs[key] = convert(value, hints[key], f"{where}.{key}" if where else key)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            raise RecipeError(f"{where}: missing required key {name!r}" if where else f"missing required key {name!r}")
    return cls(**kwargs)


def check_trainer_block(config_cls: type, block: Any, where: str) -> dict[str, Any]:
    """Check a `trainer:` mapping against the trainer library's config dataclass (names and types)."""
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise RecipeError(f"{where}: expected a mapping of {config_cls.__name__} fields, got {block!r}")
    hints = typing.get_type_hints(config_cls)
    names = [f.name for f in dataclasses.fields(config_cls) if f.init]
    out = {}
    for key, value in block.items():
        if key not in names:
            raise RecipeError(
                f"{where}: {key!r} is not a field of {config_cls.__module__.split('.')[0]}."
                f"{config_cls.__name__}{suggest(str(key), names)}"
            )
        if key == "output_dir":
            raise RecipeError(f"{where}.output_dir: set by r1kit (output_dir/<stage name>); remove it")
        out[key] = convert(value, hints[key], f"{where}.{key}")
        allowed = help_choices(config_cls, key)
        if allowed and out[key] not in allowed:
            raise RecipeError(f"{where}.{key}: {value!r} is not one of {config_cls.__name__}'s: {', '.join(allowed)}{suggest(str(value), allowed)}")
    return out


CHOICE_FIELDS = ("loss_type",)
"""Trainer fields whose values the trainer library lists in their help and checks only at the
first step (TRL's GRPOConfig and SFTConfig take any string for ``loss_type``)."""


def help_choices(config_cls: type, key: str) -> list[str]:
    """The values field `key` of `config_cls` allows, as its help lists them ("Supported values
    are 'a', 'b' and 'c'."), for the fields of `CHOICE_FIELDS`; empty where none are listed."""
    if key not in CHOICE_FIELDS:
        return []
    found = next((f for f in dataclasses.fields(config_cls) if f.name == key), None)
    match = re.search(r"(?:Supported|Possible) values are:?\s*(.*?)(?:\.\s|\.$)", (found.metadata.get("help") or "") if found else "", re.S)
    return re.findall(r"[`']([A-Za-z0-9_\-]+)[`']", match.group(1)) if match else []


# ---------------------------------------------------------------------------------------------
# Overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` → (["a", "b", "c"], VALUE parsed as a YAML scalar)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise RecipeError(f"override {text!r}: expected KEY=VALUE with a dotted KEY, e.g. rl.trainer.learning_rate=1e-6")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise RecipeError(f"override {text!r}: value is not valid YAML ({exc.problem})") from None
    return key.split("."), value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``KEY=VALUE`` overrides to the raw recipe mapping; stages are addressed by name."""
    for text in overrides:
        path, value = parse_override(text)
        stages = raw.get("stages") if isinstance(raw.get("stages"), list) else []
        by_name = {s.get("name"): s for s in stages if isinstance(s, dict)}
        if path[0] in by_name:
            target, rest = by_name[path[0]], path[1:]
            if not rest:
                raise RecipeError(f"override {text!r}: name a key inside stage {path[0]!r}")
        elif path[0] == "stages":
            raise RecipeError(f"override {text!r}: address stages by name, e.g. {next(iter(by_name), 'rl')}.trainer.max_steps=10")
        else:
            target, rest = raw, path
            if len(path) > 1 and path[0] not in raw:
                allowed = sorted(k for k in list(raw) + list(by_name) if k != "stages")
                raise RecipeError(
                    f"override {text!r}: {path[0]!r} is neither a top-level key nor a stage name"
                    f"{suggest(path[0], allowed)}; stages: {', '.join(by_name)}"
                )
        for part in rest[:-1]:
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise RecipeError(f"override {text!r}: {part!r} is not a mapping")
            target = nxt
        target[rest[-1]] = value
    return raw


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string right after the field), through the bases:
    the one text behind a recipe field's documentation and its command-line help."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def to_dict(obj: Any) -> Any:
    """Plain data (for run.json, hashing) of a recipe or stage."""
    if dataclasses.is_dataclass(obj):
        return {
            f.name: to_dict(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.metadata.get("internal")
        }
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
