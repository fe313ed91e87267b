"""The code's layering, read from the source: no import cycle anywhere in r1kit or the built-in
rewards (imports inside functions count); r1kit's core never imports a built-in reward module: it
asks the reward registry by name, as it would for a plug-in; the layers' arrows point one way
(sampling, evaluation and code execution know nothing of training, stages, the pipeline or the
CLI; the offline world and the hardware paths neither; config never asks the reward registry);
and the tree stays readable: no module over 500 lines, at most 16 modules at r1kit's top, every
package opening with a docstring, every old import path the very module of its new one."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTINS = "r1kit.rewards"  # the repository's rewards/ folder, installed under r1kit's own name


def module_files() -> dict[str, Path]:
    """Module name -> file, for r1kit/ and the built-in rewards (rewards/ as r1kit.rewards)."""
    files = {}
    for folder, package in ((ROOT / "r1kit", "r1kit"), (ROOT / "rewards", BUILTINS)):
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, wherever in the file the import statement stands, and
    those it names in a string for importlib."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in known:
            targets = [node.value]  # a module named to importlib (a registry loading it lazily)
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from a import b` names the module a.b when b is one, else something defined in a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports(name, path, set(files)) for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_core_never_imports_a_built_in_reward():
    offenders = {
        name: sorted(t for t in targets if t.startswith(BUILTINS + "."))
        for name, targets in graph().items()
        if not name.startswith(BUILTINS)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_graph_sees_imports_inside_functions():
    edges = graph()
    assert "r1kit.stages" in edges["r1kit.pipeline"]
    assert any(t.startswith("r1kit.stages.") for t in edges["r1kit.stages"])  # loaded by kind, lazily


def test_every_package_is_installed():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {name for name, path in module_files().items() if path.name == "__init__.py"}
    assert set(config["packages"]) == packages
    assert config["package-dir"] == {BUILTINS: "rewards"}


def test_every_module_lives_in_an_installed_package():
    """A folder of modules without an __init__.py would be a namespace package that
    setuptools leaves out of the wheel."""
    files = module_files()
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    parents = {name.rpartition(".")[0] for name in files if "." in name}
    assert parents - packages == set()


# ---------------------------------------------------------------------------------------------
# The layers' arrows (docs/contributing.md draws them)

TRAINING = ("r1kit.trainers", "r1kit.stages", "r1kit.pipeline", "r1kit.cli")


def within(name: str, packages: tuple[str, ...]) -> bool:
    """Whether module `name` is one of `packages` or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def wrong_arrows(edges: dict[str, set[str]], importers: tuple[str, ...], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """Module -> the modules of `forbidden` it imports, for each module of `importers` that does."""
    found = {name: sorted(t for t in targets if within(t, forbidden)) for name, targets in edges.items() if within(name, importers)}
    return {name: targets for name, targets in found.items() if targets}


def test_the_arrow_check_finds_a_wrong_arrow():
    edges = {"r1kit.sampling.decode": {"r1kit.stages.grpo", "r1kit.errors"}, "r1kit.stages.grpo": {"r1kit.sampling.decode"}}
    assert wrong_arrows(edges, ("r1kit.sampling",), TRAINING) == {"r1kit.sampling.decode": ["r1kit.stages.grpo"]}
    assert wrong_arrows(edges, ("r1kit.stages",), TRAINING) == {}
    assert not within("r1kit.clinic", ("r1kit.cli",))


def test_sampling_evaluation_and_execution_know_nothing_of_training():
    assert wrong_arrows(graph(), ("r1kit.sampling", "r1kit.evaluation", "r1kit.execution"), TRAINING) == {}


def test_the_offline_world_and_the_hardware_paths_know_nothing_of_training():
    assert wrong_arrows(graph(), ("r1kit.offline", "r1kit.hardware"), TRAINING) == {}


def test_config_never_asks_the_reward_registry():
    """The config dataclasses are data: reading a stage's config loads no reward module."""
    assert wrong_arrows(graph(), ("r1kit.config",), ("r1kit.reward_registry",)) == {}


# ---------------------------------------------------------------------------------------------
# The tree stays readable


def test_no_module_is_over_500_lines():
    lengths = {name: len(path.read_text().splitlines()) for name, path in module_files().items()}
    assert {name: n for name, n in lengths.items() if n > 500} == {}


def test_at_most_16_modules_at_the_top_of_r1kit():
    """The top holds the pipeline's spine; the rest goes into a folder named after its concern."""
    top = sorted(path.stem for path in (ROOT / "r1kit").glob("*.py"))
    assert len(top) <= 16, top


def test_every_package_opens_with_a_docstring():
    """A package's docstring says what its folder holds and what it leaves to others."""
    packages = {name: path for name, path in module_files().items() if path.name == "__init__.py"}
    assert [name for name, path in sorted(packages.items()) if not ast.get_docstring(ast.parse(path.read_text()))] == []


def test_old_import_paths_are_the_moved_modules():
    from r1kit import MOVED

    files = module_files()
    for old, new in MOVED.items():
        assert f"r1kit.{new}" in files, f"r1kit.{old} moved to r1kit.{new}, which does not exist"
        assert not (ROOT / "r1kit" / f"{old}.py").exists(), f"r1kit/{old}.py shadows the alias to r1kit.{new}"
        assert importlib.import_module(f"r1kit.{old}") is importlib.import_module(f"r1kit.{new}"), old
