"""The stages import each other in one direction only (ARCHITECTURE.md), no module imports another in a
circle, and nothing imports benchmarks/.

Every ``import`` of every module is read with :mod:`ast`, those inside
functions and ``TYPE_CHECKING`` blocks included, so a lazy import breaks a
layer as surely as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Which stages each stage may import. bundle is the base and imports no stage (it holds the tensor
#: schema and the model-repository contract); criteo is the data contract; clients know nothing of
#: the server; the server knows nothing of the stages above bundle; export runs the served ensemble
#: stages (server.stages) to check an export; loadtest measures the clients against a server it may
#: start and drives the demo, and reads a repository through bundle's contract, never export.
ALLOWED: dict[str, frozenset[str]] = {
    "bundle": frozenset(),
    "criteo": frozenset({"bundle"}),
    "models": frozenset({"bundle", "criteo"}),
    "export": frozenset({"bundle", "criteo", "models", "server"}),
    "server": frozenset({"bundle"}),
    "clients": frozenset({"bundle", "criteo"}),
    "loadtest": frozenset({"bundle", "criteo", "server", "clients"}),
    "lab": frozenset({"bundle", "criteo", "models", "export", "server", "clients", "loadtest"}),
    # The console script runs each stage by name (runpy); its demo drives them as processes and
    # checks the served answers with the clients.
    "triton_recsys": frozenset({"bundle", "server", "clients"}),
}
STAGES = frozenset(ALLOWED) | {"benchmarks"}


def imported_stages(path: Path) -> dict[str, int]:
    """The stages ``path`` imports (absolute imports), each with the line of its first import."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in STAGES:
                found.setdefault(top, node.lineno)
    return found


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_a_stage_imports_only_the_stages_below_it(stage: str) -> None:
    files = sorted((ROOT / stage).rglob("*.py"))
    assert files, f"no modules in {stage}/"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {other}"
        for path in files
        for other, line in imported_stages(path).items()
        if other != stage and other not in ALLOWED[stage]
    ]
    assert not wrong, f"{stage} may import only {sorted(ALLOWED[stage])}:\n" + "\n".join(wrong)


def _imported_modules(path: Path) -> list[tuple[str, int]]:
    """Every absolute module ``path`` imports, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return found


def test_export_takes_only_the_served_stages_from_the_server() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "export").rglob("*.py"))
        for module, line in _imported_modules(path)
        if module.split(".")[0] == "server" and not module.startswith("server.stages")
    ]
    assert not wrong, "export may import server.stages only:\n" + "\n".join(wrong)


def test_backends_and_stages_import_nothing_of_the_bundle() -> None:
    """They run inside the NGC image too, where the bundle is not installed."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {other}"
        for folder in ("server/backends", "server/stages")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for other, line in imported_stages(path).items()
        if other != "server"
    ]
    assert not wrong, "\n".join(wrong)


def test_benchmarks_holds_results_and_scripts_but_no_code() -> None:
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py"))
    assert not modules, f"code belongs in a package with tests, not in benchmarks/: {modules}"


def test_no_test_imports_benchmarks() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for other, line in imported_stages(path).items()
        if other == "benchmarks"
    ]
    assert not wrong, f"tests import the package they test, never benchmarks/: {wrong}"


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import bundle.errors\n"
        "if TYPE_CHECKING:\n    from clients import triton\n"
        "def f():\n    from server.launcher import LocalServer\n    from . import sibling\n"
    )
    assert imported_stages(module) == {"bundle": 2, "clients": 4, "server": 6}


#: The packages whose modules may not import each other in a circle.
PACKAGES = tuple(sorted(ALLOWED))


def module_name(path: Path, root: Path = ROOT) -> str:
    """``export/tables/placement.py`` -> ``export.tables.placement``; an ``__init__`` names its package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: frozenset[str], root: Path = ROOT) -> set[str]:
    """The bundle's modules ``path`` imports, relative imports resolved, lazy ones included.

    ``from a.b import c`` counts ``a.b.c`` where that is a module, else ``a.b``.
    """
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            submodules = (f"{module}.{alias.name}" for alias in node.names)
            targets = [sub if sub in modules else module for sub in submodules]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` and ``from a.b import c`` name the deepest module that exists.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Every module of :data:`PACKAGES` and the bundle's modules it imports."""
    paths = {module_name(p, root): p for stage in PACKAGES for p in sorted((root / stage).rglob("*.py"))}
    modules = frozenset(paths)
    return {name: imported_modules(path, modules, root) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module, and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative: no recursion limit to meet
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(tuple(sorted(component)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_module_imports_another_in_a_circle() -> None:
    found = cycles(import_graph())
    assert not found, "modules that import each other in a circle (lazy imports count):\n" + "\n".join(
        " -> ".join(cycle) for cycle in found
    )


def test_the_cycle_finder_sees_a_lazy_circle_and_a_self_import() -> None:
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "b.s": {"b.s"}, "b.t": {"a.x"}}
    assert cycles(graph) == [("a.x", "a.y", "a.z"), ("b.s",)]


def test_the_import_graph_resolves_relative_and_lazy_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (package / name).touch()
    (package / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .. import a\nif TYPE_CHECKING:\n    from ..b import thing\n"
        "def f():\n    import pkg.sub\n"
    )
    modules = frozenset({"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"})
    assert imported_modules(package / "sub" / "c.py", modules, tmp_path) == {"pkg.a", "pkg.b", "pkg.sub"}
