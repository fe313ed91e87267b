"""The code's layering, read from the source: no import cycle anywhere in r1kit or the built-in
rewards (imports inside functions count), and r1kit's core never imports a built-in reward
module: it asks the reward registry by name, as it would for a plug-in."""

from __future__ import annotations

import ast
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
