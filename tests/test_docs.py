"""The documentation cannot rot: README.md stays short, the site builds with ``mkdocs build
--strict``, the generated reference lists everything the code declares, and every code block of
README.md and docs/*.md runs or is validated.

Each page's blocks run in order in a fresh folder of their own (with links to the repository's
recipes/ and bench/), so a block can use the files an earlier block of its page wrote:

- ``yaml``: a whole recipe goes through ``r1kit validate``; one marked ``<!-- stage: KIND -->``
  is part of a stage of that kind, validated inside a small recipe on the tiny model;
- ``python``: executed in the page's folder;
- ``bash`` / ``console``: every command is checked by its program. ``r1kit``: parsed by the
  CLI's own parser; ``validate``, ``rewards``, ``tiny-model`` and ``eval --completions`` run,
  ``run`` is validated (and runs under ``<!-- test: run OVERRIDES -->``, with the overrides added),
  ``eval`` with a model is parsed and its benchmark looked up. ``make``: the target exists.
  ``python bench/X.py``: the script exists and takes each flag given. ``pip``: the extras exist
  and a pinned version is constraints.txt's. Any repository path named exists, and any recipe
  named is validated. A ``console`` block's ``$`` commands always run, and each line shown after
  one must be in its output (a line ending in ``...`` must start one); an ``r1kit: error:`` in it
  expects exit status 2;
- ``toml``, ``jsonl``: parsed; ``text``: not checked (machine-dependent output, diagrams).

Markers (an HTML comment on the line before a block): ``file: NAME`` writes the block to NAME
instead; ``no-test: REASON`` only parses and validates (GPU or hub commands); ``test: run
OVERRIDES`` runs the block's ``r1kit run`` commands, ``{tiny}`` standing for the tiny model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"yaml", "python", "bash", "console", "toml", "jsonl", "text"}
REPO_DIRS = ("recipes/", "bench/", "docs/", "tests/", "r1kit/", "rewards/")


def hooks():
    """docs/hooks.py, the generator of the reference sections, as a module."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# Reading the Markdown


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    marker: str = ""

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!-- (.*) -->$")


def read_page(page: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The page's fenced blocks, and its prose lines (number, text) outside them."""
    lines = page.read_text().splitlines()
    blocks, prose, i = [], [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, start = opening.group(2), i
        i += 1
        while i < len(lines) and not re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[i]):
            i += 1
        assert i < len(lines), f"{page.relative_to(ROOT)}:{start + 1}: a code block is never closed"
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        blocks.append(Block(page, start + 1, opening.group(3), "\n".join(lines[start + 1 : i]) + "\n", marker.group(1) if marker else ""))
        i += 1
    return blocks, prose


def inline_code(prose: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(n, span) for n, line in prose for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line)]


# ---------------------------------------------------------------------------------------------
# Running what a page shows


class Page:
    """One page's blocks, run in order in `folder`."""

    def __init__(self, page: Path, folder: Path, tiny):
        self.page, self.folder, self.tiny = page, folder, tiny
        self.validated: set[str] = set()

    # -- r1kit --------------------------------------------------------------------------------

    def r1kit(self, argv: list[str], where: str, mode: str = "", console: bool = False) -> tuple[int, str]:
        """Parse `argv` with r1kit's parser; run it or validate what it names (see the module
        docstring). Returns the exit status and output of what ran (0, "" when nothing ran)."""
        from r1kit.cli import _parser

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                args = _parser().parse_args(argv)
            except SystemExit as exc:
                assert exc.code == 0, f"{where}: `r1kit {shlex.join(argv)}` does not parse"
                return 0, ""
        if mode == "parse":
            return 0, ""
        command = args.command
        cheap = command in ("validate", "rewards", "tiny-model") or (command == "eval" and bool(getattr(args, "completions", None)))
        if mode == "run":
            assert command == "run", f"{where}: `test: run` marks a block of `r1kit run` commands"
            return self.main([*argv, *self.overrides], where)
        if mode != "no-test" and (console or cheap):
            return self.main(argv, where)
        if command in ("run", "validate"):
            check = ["validate", args.recipe, *args.overrides]
            if args.accelerate_config:
                check += ["--accelerate-config", args.accelerate_config]
            rc, out = self.main(check, where)
            assert rc == 0, f"{where}: `r1kit {shlex.join(argv)}` does not validate:\n{out}"
            if getattr(args, "restart_from", None):
                from r1kit import pipeline
                from r1kit.recipe import load_recipe

                pipeline.plan(load_recipe(args.recipe, args.overrides), args.restart_from)
        elif command == "eval" and args.benchmark:
            from r1kit.evaluation.benchmarks import benchmark_name

            benchmark_name(args.benchmark)
        return 0, ""

    def main(self, argv: list[str], where: str) -> tuple[int, str]:
        from r1kit.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
        return rc, out.getvalue()

    # -- commands -----------------------------------------------------------------------------

    def command(self, words: list[str], where: str, mode: str, expected: list[str] | None) -> None:
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            words = words[1:]  # environment assignments
        program, rest = words[0], words[1:]
        for word in rest:
            path = word.split("=", 1)[-1]
            if path.startswith(REPO_DIRS):
                assert (ROOT / path).exists(), f"{where}: {path} does not exist"
                if path.startswith("recipes/") and path.endswith(".yaml") and program != "r1kit":
                    self.validate_recipe(path, where)
        if program == "r1kit":
            rc, out = self.r1kit(rest, where, mode, console=expected is not None)
            if expected is not None:
                self.check_output(rest, rc, out, expected, where)
            assert expected is not None or rc == 0, f"{where}: `r1kit {shlex.join(rest)}` exited {rc}:\n{out}"
            return
        assert expected is None, f"{where}: only r1kit commands may show their output"
        if program == "make":
            targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
            for target in rest:
                assert target in targets, f"{where}: the Makefile has no target {target!r}"
        elif program in ("python", "python3"):
            if rest[0] == "-m":
                return
            script = (ROOT / rest[0]).read_text()
            for flag in (w.split("=")[0] for w in rest[1:] if w.startswith("--")):
                assert f'"{flag}"' in script, f"{where}: {rest[0]} takes no flag {flag}"
        elif program == "pip":
            self.pip(rest, where)
        else:
            assert program in ("source", "bash", "sbatch", "trl", "accelerate", "mkdocs"), f"{where}: unknown program {program!r}"

    def pip(self, words: list[str], where: str) -> None:
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        pins = dict(re.findall(r"^([\w.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
        for word in words:
            for group in re.findall(r"\[([\w,-]+)\]", word):
                for extra in group.split(","):
                    assert extra in extras, f"{where}: pyproject.toml has no extra {extra!r}"
            if "==" in word:
                name, version = word.split("==")
                assert pins.get(name) == version, f"{where}: {word}, but constraints.txt pins {name}=={pins.get(name)}"
            if word.endswith(".txt"):
                assert (ROOT / word).is_file(), f"{where}: {word} does not exist"

    def validate_recipe(self, path: str, where: str) -> None:
        if path not in self.validated:
            rc, out = self.main(["validate", path], where)
            assert rc == 0, f"{where}: {path} does not validate:\n{out}"
            self.validated.add(path)

    def check_output(self, argv: list[str], rc: int, out: str, expected: list[str], where: str) -> None:
        got = [" ".join(line.split()) for line in out.splitlines()]
        for line in filter(None, (" ".join(e.split()) for e in expected)):
            if line.endswith("..."):
                found = any(g.startswith(line[:-3].rstrip()) for g in got)
            else:
                found = line in got
            assert found, f"{where}: `r1kit {shlex.join(argv)}` printed no line {line!r}; it printed:\n{out}"
        want = 2 if any("r1kit: error:" in e for e in expected) else 0
        assert rc == want, f"{where}: `r1kit {shlex.join(argv)}` exited {rc}, not {want}:\n{out}"

    # -- blocks -------------------------------------------------------------------------------

    def run(self, block: Block) -> None:
        where, marker = block.where(), block.marker
        assert block.lang in LANGUAGES, f"{where}: a ```{block.lang} block is not checked; use one of {sorted(LANGUAGES)}"
        mode = "no-test" if marker.startswith("no-test:") else "run" if marker.startswith("test: run") else ""
        self.overrides = [w.replace("{tiny}", str(self.tiny())) for w in marker.split()[2:]] if mode == "run" else []
        if marker.startswith("file: "):
            name = marker[len("file: ") :]
            (self.folder / name).write_text(block.body)
            if block.lang == "jsonl":
                [json.loads(line) for line in block.body.splitlines() if line.strip()]
            if block.lang == "python":
                compile(block.body, where, "exec")
            return
        getattr(self, "run_" + block.lang)(block, mode)

    def run_text(self, block: Block, mode: str) -> None:
        pass

    def run_toml(self, block: Block, mode: str) -> None:
        tomllib.loads(block.body)

    def run_jsonl(self, block: Block, mode: str) -> None:
        [json.loads(line) for line in block.body.splitlines() if line.strip()]

    def run_python(self, block: Block, mode: str) -> None:
        code = compile(block.body, block.where(), "exec")
        if mode != "no-test":
            with contextlib.redirect_stdout(io.StringIO()):
                exec(code, {"__name__": "__docs__"})

    STAGES = {
        "sft": {"name": "sft", "kind": "sft", "data": {"source": "task:addition"}},
        "grpo": {"name": "rl", "kind": "grpo", "template": "plain", "data": {"source": "task:addition"}, "rewards": [{"name": "format"}]},
        "async_grpo": {"name": "rl", "kind": "async_grpo", "template": "plain", "data": {"source": "task:addition"},
                       "rewards": [{"name": "format"}]},
        "rejection": {"name": "rejection", "kind": "rejection", "data": {"source": "task:addition"}, "rewards": [{"name": "math_accuracy"}]},
        "eval": {"name": "eval", "kind": "eval", "benchmarks": ["task:addition"]},
        "reward": {"name": "rm", "kind": "reward", "data": {"source": "task:chain_sum", "task": {"pairs": True}}},
    }

    def run_yaml(self, block: Block, mode: str) -> None:
        from r1kit.config import parse_yaml

        data, where = parse_yaml(block.body), block.where()
        if block.marker.startswith("stage: "):
            kind = block.marker.split()[1]
            data = {"model": "tiny", "output_dir": "runs/snippet", "stages": [{**self.STAGES[kind], **data}]}
        assert isinstance(data, dict) and "stages" in data, f"{where}: a yaml block is a recipe, or marked <!-- stage: KIND -->"
        if mode == "no-test":
            return
        (self.folder / "snippet.yaml").write_text(json.dumps(data))
        rc, out = self.main(["validate", "snippet.yaml"], where)
        assert rc == 0, f"{where}: the recipe does not validate:\n{out}"

    def run_bash(self, block: Block, mode: str) -> None:
        for line in block.body.replace("\\\n", " ").splitlines():
            for words in split_commands(line):
                self.command(words, block.where(), mode, None)

    def run_console(self, block: Block, mode: str) -> None:
        commands: list[tuple[list[str], list[str]]] = []
        for line in block.body.splitlines():
            if line.startswith("$ "):
                commands.append((shlex.split(line[2:]), []))
            else:
                assert commands, f"{block.where()}: a console block starts with a `$ ` command"
                commands[-1][1].append(line)
        for words, expected in commands:
            self.command(words, block.where(), mode, expected)

    def inline(self, number: int, span: str) -> None:
        """`r1kit ...` and `python bench/...` in the prose: parsed, and the script's flags exist."""
        where = f"{self.page.relative_to(ROOT)}:{number}"
        words = shlex.split(span)
        if words[0] == "r1kit" and not names_a_command(words[1:]):
            self.r1kit(words[1:], where, mode="parse")
        elif words[0] == "python" and len(words) > 1 and words[1].startswith("bench/"):
            self.command(words, where, "no-test", None)


def names_a_command(words: list[str]) -> bool:
    """True when `words` name a command and perhaps some of its flags, as prose does
    (`r1kit rewards score`, `r1kit validate --here`): subcommand names, then flags it takes."""
    import argparse

    from r1kit.cli import _parser

    parser = _parser()
    for i, word in enumerate(words):
        if word.startswith("--"):
            return all(w in parser._option_string_actions for w in words[i:])
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            return False
        parser = subs[0].choices[word]
    return True


def split_commands(line: str) -> list[list[str]]:
    """The commands of one shell line: comments dropped, split at ``&&``."""
    words = shlex.split(line, comments=True)
    out, current = [], []
    for word in words:
        if word == "&&":
            out.append(current)
            current = []
        else:
            current.append(word)
    return [c for c in out + [current] if c]


@pytest.fixture
def page_folder(tmp_path, monkeypatch):
    """A fresh folder with links to the repository's recipes and bench scripts, as the current
    directory; modules imported from it are forgotten afterwards."""
    for name in ("recipes", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    yield tmp_path
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_snippets_run(page, page_folder, request):
    """Every block and every inline `r1kit` command of the page, in order (the rewards page
    trains the tiny model for one GRPO step with the custom reward it documents)."""
    runner = Page(page, page_folder, lambda: request.getfixturevalue("tiny_model"))
    blocks, prose = read_page(page)
    for block in blocks:
        runner.run(block)
    for number, span in inline_code(prose):
        if span.startswith(("r1kit ", "python bench/")):
            runner.inline(number, span)


# ---------------------------------------------------------------------------------------------
# The README and the build


def test_readme_is_short_and_links_into_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links, "the README links into the docs"
    for link in links:
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"


def test_docs_build_without_warnings(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    rewards = (tmp_path / "site" / "rewards" / "index.html").read_text()
    assert "reference:" not in rewards and "math_accuracy" in rewards  # the generated section is in place


def test_docs_tell_no_history():
    """Docs describe what is, with current figures; how the project got there is the git log's."""
    phrases = ("session", "the code before", "earlier code", "earlier run", "previous run", "used to take", "an hour earlier")
    for page in PAGES:
        text = page.read_text().lower()
        found = [p for p in phrases if p in text]
        assert not found, f"{page.relative_to(ROOT)}: {found}"


# ---------------------------------------------------------------------------------------------
# The generated reference lists everything the code declares


def test_every_reference_section_is_placed_once():
    sections = hooks().SECTIONS
    placed = [m for page in PAGES for m in re.findall(r"^<!-- reference: ([a-z-]+) -->$", page.read_text(), re.M)]
    assert sorted(placed) == sorted(sections)


def sections_by_heading(markdown: str) -> dict[str, str]:
    parts = re.split(r"^### (.+)$", markdown, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def declared_keys(cls: type, prefix: str = "", seen: tuple = ()) -> list[str]:
    """Every key `r1kit.config.from_dict` accepts in dataclass `cls`, nested sections as dotted paths."""
    from r1kit.config import StageConfig

    keys = []
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("internal"):
            continue
        keys.append(prefix + f.name)
        tp = typing.get_type_hints(cls)[f.name]
        for option in (tp, *typing.get_args(tp)):
            item = typing.get_origin(option) is list and typing.get_args(option)
            inner = typing.get_args(option)[0] if item else option
            if dataclasses.is_dataclass(inner) and inner not in (*seen, cls) and not issubclass(inner, StageConfig):
                keys += declared_keys(inner, f"{prefix}{f.name}{'[].' if item else '.'}", (*seen, cls))
                break
    return keys


def test_reference_lists_every_recipe_key():
    from r1kit import stages
    from r1kit.config import Recipe

    parts = sections_by_heading(hooks().recipe_keys())
    expected = {"Top level": declared_keys(Recipe), **{f"`{k}` stages": declared_keys(stages.get(k).config) for k in stages.kinds()}}
    assert set(parts) == set(expected)
    for heading, keys in expected.items():
        listed = re.findall(r"^\| `([^`]+)` \|", parts[heading], re.M)
        assert sorted(listed) == sorted(keys), heading


def test_reference_lists_every_reward_and_its_parameters():
    from r1kit import reward_registry

    parts = sections_by_heading(hooks().rewards())
    assert set(parts) == {f"`{name}`" for name in reward_registry.available()}
    for name in reward_registry.available():
        params = reward_registry.parameters(reward_registry.load(name))
        assert sorted(re.findall(r"^\| `([^`]+)` \|", parts[f"`{name}`"], re.M)) == sorted(params), name


def test_reference_lists_every_shipped_recipe():
    listed = re.findall(r"^\| `([^`]+)` \|", hooks().recipes(), re.M)
    assert listed == [f"recipes/{p.name}" for p in sorted((ROOT / "recipes").glob("*.yaml"))]


def test_reference_lists_every_stage_kind():
    from r1kit import stages

    assert re.findall(r"^\| `([^`]+)` \|", hooks().stage_kinds(), re.M) == stages.kinds()


def test_reference_lists_every_benchmark_task_and_tool():
    from importlib.metadata import entry_points

    from r1kit.offline import tasks
    from r1kit.cli import _parser
    from r1kit.execution.tools import ToolConfig

    module = hooks()
    listed = re.findall(r"^\| `([^`]+)` \|", module.benchmarks(), re.M)
    eval_parser = next(a for a in _parser()._actions if a.choices and "eval" in a.choices).choices["eval"]
    help_text = next(a.help for a in eval_parser._actions if "--benchmark" in a.option_strings)
    builtin = help_text.split(", task:NAME")[0].split(", ")  # the names `r1kit eval --help` offers
    tables = [name for table in module.benchmark_tables().values() for name in table]
    assert sorted(listed) == sorted({*builtin, *tables, *(f"task:{t}" for t in tasks.TASKS)})
    registered, bounds = module.tools().split("A tool's bounds")
    assert sorted(re.findall(r"^\| `([^`]+)` \|", registered, re.M)) == sorted(ep.name for ep in entry_points(group="r1kit.tools"))
    assert sorted(re.findall(r"^\| `([^`]+)` \|", bounds, re.M)) == sorted(declared_keys(ToolConfig))
