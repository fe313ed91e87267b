"""The reference sections of the docs site, generated from the code when the site is built.

mkdocs runs this file as a hook (``hooks:`` in mkdocs.yml). A page marks where a section goes
with an HTML comment on a line of its own::

    <!-- reference: recipe-keys -->

and the hook puts the section's Markdown there. The sections (`SECTIONS`) read the code's own
declarations, so a new reward, benchmark, stage kind or recipe key appears in the docs by itself:

- ``commands``: the command line, from r1kit.cli's argparse parser;
- ``recipes``: the shipped recipes (recipes/*.yaml), each with its header comment's first sentence;
- ``recipe-keys``: every key of a recipe, from the config dataclasses (r1kit.config, each stage
  kind's config in r1kit.stages) and each field's docstring (`r1kit.config.field_docs`, the text
  behind the command line's help);
- ``stage-kinds``: the stage registry (r1kit.stages) and each kind's trainer defaults;
- ``rewards``: the reward registry (r1kit.reward_registry), as ``r1kit rewards list`` reads it;
- ``benchmarks``: every table of built-in benchmarks in r1kit.evaluation.benchmarks (a module-level name
  ending in ``BENCHMARKS``), and the offline tasks of r1kit.offline.tasks;
- ``tools``: the tool registry and the bounds of a tool (r1kit.execution.tools);
- ``cpu-defaults``: the trainer fields r1kit sets on a machine without a GPU (r1kit.trainers.training).

tests/test_docs.py builds the site with ``--strict`` and checks that each section lists
everything the code declares. Not here: any hand-written text (docs/*.md).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import types
import typing
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

MARK = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.M)
ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put each marked section in its place; an unknown section name stops the build."""
    from mkdocs.exceptions import PluginError

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in SECTIONS:
            raise PluginError(f"{page.file.src_uri}: unknown reference section {name!r}; known: {', '.join(SECTIONS)}")
        return SECTIONS[name]()

    return MARK.sub(fill, markdown)


# ---------------------------------------------------------------------------------------------
# Markdown helpers


def text(value: str) -> str:
    """Docstring text as Markdown on one line: code spans kept, ``<``, ``>``, ``*`` and ``|``
    outside them escaped (a docstring's ``<think>`` is text, not an HTML tag)."""
    parts = re.split(r"(``[^`]+``|`[^`]+`)", " ".join(value.split()))
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(part.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*").replace("|", "\\|"))
    return "".join(out)


def code(value: Any) -> str:
    """A value as YAML writes it, in a code span."""
    if value is None:
        shown = "null"
    elif isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, (dict, list, tuple)) and not value:
        shown = "{}" if isinstance(value, dict) else "[]"
    else:
        shown = str(value)
    return f"`{shown}`"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n")[0]


def attribute_docs(module) -> dict[str, str]:
    """The docstrings of a module's assignments (the string right after ``NAME = ...``)."""
    body = ast.parse(inspect.getsource(module)).body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.Assign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    docs[target.id] = str(after.value.value)
    return docs


# ---------------------------------------------------------------------------------------------
# The command line


def commands() -> str:
    """Each command's usage and description, from the parser `r1kit` runs."""
    import argparse

    from r1kit.cli import _parser

    out = []

    def walk(parser: argparse.ArgumentParser, words: list[str], help_line: str) -> None:
        line = parser.description or help_line
        out.append(f"### `{' '.join(words)}`\n\n{text(line[:1].upper() + line[1:])}\n\n```text\n{parser.format_usage().strip()}\n```\n")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help or "" for a in action._choices_actions}
                for name, sub in action.choices.items():
                    walk(sub, [*words, name], helps.get(name, ""))

    walk(_parser(), ["r1kit"], "")
    return "Every command's `--help` lists its flags and their defaults.\n\n" + "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Shipped recipes


def recipe_files() -> list[Path]:
    return sorted((ROOT / "recipes").glob("*.yaml"))


def recipes() -> str:
    """Each shipped recipe with the first sentence of its header comment."""
    rows = []
    for path in recipe_files():
        words = []
        for line in path.read_text().splitlines():
            if not line.startswith("# ") or line.startswith("#  "):
                break  # the header's first paragraph ends at code or at an indented command
            words.append(line[2:])
        header = " ".join(words)
        end = re.search(r"(?<!\b[A-Z][a-z])\.(\s|$)", header)  # a sentence's end, not "Dr. GRPO"'s
        rows.append([f"`recipes/{path.name}`", text(header[: end.start() + 1] if end else header.rstrip(":"))])
    return table(["recipe", "what it is"], rows)


# ---------------------------------------------------------------------------------------------
# Recipe keys


def type_text(tp: Any) -> str:
    """A field's type in words."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return "any"
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return "one of " + ", ".join(code(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        words = " or ".join(type_text(a) for a in options)
        return f"{words}, or `null`" if len(options) < len(args) else words
    if origin is list or tp is list:
        item = args[0] if args else Any
        if dataclasses.is_dataclass(item):
            return "list of mappings"
        return "list" if item is Any else f"list of {type_text(item)}s"
    if origin is dict or tp is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "`true` or `false`"}.get(tp, getattr(tp, "__name__", str(tp)))


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return code(f.default)
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "see below" if dataclasses.is_dataclass(value) else code(value)
    return "**required**"


def key_rows(cls: type, prefix: str = "", path: tuple[type, ...] = ()) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every key a recipe may set in dataclass `cls`, the
    keys of nested sections as dotted paths. The fields are those `r1kit.config.from_dict`
    accepts; their texts are `r1kit.config.field_docs`'."""
    from r1kit.config import StageConfig, field_docs

    hints, docs, rows = typing.get_type_hints(cls), field_docs(cls), []
    for f in sorted(dataclasses.fields(cls), key=lambda f: _rank(cls, f.name)):
        if not f.init or f.metadata.get("internal"):
            continue
        key, tp = prefix + f.name, hints[f.name]
        rows.append((key, type_text(tp), default_text(f), text(docs.get(f.name, ""))))
        inner = _section(tp)
        if inner is None:
            continue
        if issubclass(inner, StageConfig):  # each stage kind's keys have a table of their own
            rows[-1] = rows[-1][:3] + (rows[-1][3] + " Each stage's keys are listed by its kind below.",)
            continue
        item = typing.get_origin(tp) is list
        if inner in path + (cls,):  # a section that nests itself (data.also): its keys are above
            rows[-1] = rows[-1][:3] + (rows[-1][3] + f" Each item takes the keys of `{prefix.rstrip('.') or cls.__name__}`.",)
            continue
        rows += key_rows(inner, f"{key}[]." if item else f"{key}.", path + (cls,))
    return rows


def _rank(cls: type, name: str) -> int:
    """Where a field's row goes: the keys every stage has (name, kind, model), then those of the
    class's first base, then its own, then those of its other bases (mixins such as LoRA's)."""
    from r1kit.config import StageConfig

    base = cls.__bases__[0]
    if name in {f.name for f in dataclasses.fields(StageConfig)}:
        return 0
    if dataclasses.is_dataclass(base) and name in {f.name for f in dataclasses.fields(base)}:
        return 1
    return 2 if name in cls.__dict__.get("__annotations__", {}) else 3


def _section(tp: Any) -> type | None:
    """The dataclass a field holds (directly, in a list, or or-null), else None."""
    for option in [tp, *typing.get_args(tp)]:
        if dataclasses.is_dataclass(option):
            return option
        if typing.get_origin(option) is list and typing.get_args(option) and dataclasses.is_dataclass(typing.get_args(option)[0]):
            return typing.get_args(option)[0]
    return None


def stage_example(cls: type) -> Any:
    """A stage config of dataclass `cls` with placeholder values in its required fields, to ask
    a stage kind for its trainer defaults."""
    from r1kit.config import from_dict

    def minimal(klass: type) -> dict:
        hints, out = typing.get_type_hints(klass), {}
        for f in dataclasses.fields(klass):
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                tp = hints[f.name]
                out[f.name] = minimal(tp) if dataclasses.is_dataclass(tp) else [] if typing.get_origin(tp) is list else {} if typing.get_origin(tp) is dict else "task:addition"
        return out

    return from_dict(cls, minimal(cls), "example")


def recipe_keys() -> str:
    from r1kit import stages
    from r1kit.config import Recipe

    head = ["key", "type", "default", "what it is"]
    out = ["### Top level\n", table(head, [[f"`{k}`", t, d, w] for k, t, d, w in key_rows(Recipe)])]
    for kind in stages.kinds():
        spec = stages.get(kind)
        out.append(f"### `{kind}` stages\n")
        if spec.trainer_config is not None:
            cls = spec.trainer_config(stage_example(spec.config))
            out.append(f"`trainer:` holds fields of `{cls.__module__.split('.')[0]}.{cls.__name__}`, as they are; see [stage kinds](stages.md#stage-kinds) for the ones r1kit sets.\n")
        rows = [[f"`{k}`", t, d, w] for k, t, d, w in key_rows(spec.config)]
        out.append(table(head, rows))
    return "\n".join(out)


def stage_kinds() -> str:
    """The stage registry: each kind's module, trainer library config and r1kit's trainer defaults."""
    import importlib

    from r1kit import stages

    rows = []
    for kind in stages.kinds():
        spec = stages.get(kind)
        module = importlib.import_module(spec.config.__module__)
        summary = first_line(module.__doc__).split(": ", 1)[-1]
        if spec.trainer_config is None:
            engine, defaults = "r1kit.sampling", "-"
        else:
            cls = spec.trainer_config(stage_example(spec.config))
            engine = f"`{cls.__module__.split('.')[0]}.{cls.__name__}`"
            fields = {k: v for k, v in spec.trainer_defaults(stage_example(spec.config)).items() if v not in ([], {})}
            defaults = ", ".join(f"`{k}: {code(v).strip('`')}`" for k, v in fields.items()) or "-"
        rows.append([f"`{kind}`", f"`{module.__name__}`", engine, text(summary), defaults])
    return table(["kind", "module", "trainer config", "what it does", "r1kit's trainer defaults"], rows)


# ---------------------------------------------------------------------------------------------
# Rewards


def rewards() -> str:
    """Every registered reward, read as ``r1kit rewards list`` reads it, with its parameters."""
    from r1kit import reward_registry as registry

    out = []
    for name, target in sorted(registry.available().items()):
        fn = registry.load(name)
        needed, choices, positive = registry.required(fn), registry.choices(fn), registry.marked(fn, registry.POSITIVE)
        rows = []
        for param, default in registry.parameters(fn).items():
            notes = []
            if param in needed:
                notes.append("required")
            if param in choices:
                notes.append("one of " + ", ".join(code(c) for c in choices[param]))
            if param in positive:
                notes.append("above 0")
            rows.append([f"`{param}`", "-" if param in needed else code(default), "; ".join(notes) or "-"])
        bounds = getattr(fn, "bounds", None)
        doc = inspect.getdoc(fn) or ""
        out.append(f"### `{name}`\n")
        out.append("\n\n".join(text(p) for p in doc.split("\n\n")) + "\n")
        out.append(f"Function: `{target}`. Scores: " + (f"from {bounds[0]:g} to {bounds[1]:g}." if bounds else "range not declared.") + "\n")
        out.append(table(["parameter", "default", "allowed"], rows) if rows else "No parameters.\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Benchmarks and tasks


DOMAINS = {"": "Math", "CODE": "Code", "CHOICE": "Multiple choice"}


def benchmark_tables() -> dict[str, dict | tuple]:
    """r1kit.evaluation.benchmarks' tables of built-in benchmarks: module-level names ending in BENCHMARKS."""
    from r1kit.evaluation import benchmarks

    return {
        name: value
        for name, value in vars(benchmarks).items()
        if name.endswith("BENCHMARKS") and name.isupper() and isinstance(value, (dict, tuple, list))
    }


def benchmarks() -> str:
    from r1kit.evaluation import benchmarks as module
    from r1kit.offline import tasks

    docs, dated = attribute_docs(module), set(getattr(module, "DATED", ()))
    out = []
    for table_name, entries in benchmark_tables().items():
        prefix = table_name.removesuffix("BENCHMARKS").rstrip("_")
        out.append(f"### {DOMAINS.get(prefix, prefix.replace('_', ' ').capitalize())}\n")
        if table_name in docs:
            out.append(text(docs[table_name]) + "\n")
        rows = []
        for name in entries:
            row = entries[name] if isinstance(entries, dict) else None
            if row is not None and dataclasses.is_dataclass(row):
                where = f"hub `{row.dataset}`" + (f", subset `{row.subset}`" if getattr(row, "subset", None) else "") + f", split `{row.split}`"
            else:
                where = "-"
            rows.append([f"`{name}`", where, "yes" if name in dated else "-"])
        out.append(table(["name", "problems from", "dated (`since` / `until`)"], rows))
    out.append("### Offline tasks\n")
    out.append("`task:NAME` as a benchmark takes the task's test split; `--task-arg KEY=VALUE` (or an eval stage's `task:`) sets its arguments.\n")
    rows = []
    for name, fn in tasks.TASKS.items():
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name != "split"]
        args = ", ".join(f"`{p.name}={p.default}`" for p in params) or "-"
        rows.append([f"`task:{name}`", text(first_line(fn.__doc__)), args])
    out.append(table(["name", "problems", "arguments"], rows))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Tools and CPU defaults


def tools() -> str:
    from r1kit.execution import tools as module

    rows = [[f"`{ep.name}`", f"`{ep.value}`", text(first_line(ep.load().__doc__))] for ep in sorted(entry_points(group=module.ENTRY_POINT_GROUP), key=lambda e: e.name)]
    out = ["Registered tools:\n", table(["name", "function", "what it does"], rows)]
    out.append("\nA tool's bounds, the keys of an item of a stage's `tools:` list (a bare name takes the defaults):\n")
    out.append(table(["key", "type", "default", "what it is"], [[f"`{k}`", t, d, w] for k, t, d, w in key_rows(module.ToolConfig)]))
    return "\n".join(out)


def cpu_defaults() -> str:
    from r1kit.trainers.training import CPU_DEFAULTS

    return table(["trainer field", "value on a machine without a GPU"], [[f"`{k}`", code(v)] for k, v in CPU_DEFAULTS.items()])


SECTIONS: dict[str, Callable[[], str]] = {
    "commands": commands,
    "recipes": recipes,
    "recipe-keys": recipe_keys,
    "stage-kinds": stage_kinds,
    "rewards": rewards,
    "benchmarks": benchmarks,
    "tools": tools,
    "cpu-defaults": cpu_defaults,
}
