"""The packages import each other in one direction only, as the architecture page states it
(docs/architecture.md, the table this test reads); inside a package, its modules and subpackages
import each other in one direction only; no module imports another in a circle; nothing imports
benchmarks/.

Every ``import`` of every module is read with :mod:`ast`, those inside
functions and ``TYPE_CHECKING`` blocks included, so a lazy import breaks a
layer as surely as a top-level one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The page that states the layering rule; the test reads its table, so the two cannot disagree.
ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.md"


def layers(page: Path = ARCHITECTURE_PAGE) -> dict[str, frozenset[str]]:
    """The table between ``<!-- layers: start -->`` and ``<!-- layers: end -->`` of ``page``: each
    package and the packages it may import."""
    text = page.read_text()
    match = re.search(r"<!-- layers: start -->(.*?)<!-- layers: end -->", text, re.S)
    if match is None:
        raise AssertionError(f"{page.relative_to(ROOT)} has no layers table between its markers")
    found: dict[str, frozenset[str]] = {}
    for line in match.group(1).strip().splitlines()[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            raise AssertionError(f"not a row of two cells in the layers table: {line!r}")
        package, may_import = (re.findall(r"`([a-z_]+)`", cell) for cell in cells)
        if len(package) != 1:
            raise AssertionError(f"a row names one package in its first cell: {line!r}")
        found[package[0]] = frozenset(may_import)
    return found


#: Which packages each package may import, as the architecture page states it.
ALLOWED: dict[str, frozenset[str]] = layers()
STAGES = frozenset(ALLOWED) | {"benchmarks"}


def test_the_page_names_every_package_of_the_repository_and_only_those() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert set(ALLOWED) == packages, (
        f"docs/architecture.md's layers table lists {sorted(ALLOWED)}; the repository's packages are "
        f"{sorted(packages)}"
    )
    unknown = {other for allowed in ALLOWED.values() for other in allowed} - set(ALLOWED)
    assert not unknown, f"the layers table names packages that do not exist: {sorted(unknown)}"


def test_nothing_imports_the_lab() -> None:
    assert all("lab" not in allowed for allowed in ALLOWED.values())


def test_the_layers_table_is_read_row_by_row(tmp_path: Path) -> None:
    page = tmp_path / "architecture.md"
    page.write_text(
        "# x\n\n<!-- layers: start -->\n| package | may import |\n|---|---|\n"
        "| `base` | (nothing) |\n| `top` | `base` |\n<!-- layers: end -->\n"
    )
    assert layers(page) == {"base": frozenset(), "top": frozenset({"base"})}


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


def layer_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The layers of ``package`` and which import which: each module at its top and each
    subpackage is one layer (``__init__`` is the package's own); an import between two modules of
    ``package`` is an arrow between the layers that hold them."""

    def layer(module: str) -> str | None:
        if module == package:
            return "__init__"
        if module.startswith(package + "."):
            return module[len(package) + 1 :].split(".")[0]
        return None

    arrows: dict[str, set[str]] = {}
    for module, imported in graph.items():
        source = layer(module)
        if source is None:
            continue
        arrows.setdefault(source, set())
        for target in imported:
            into = layer(target)
            if into is not None and into != source:
                arrows[source].add(into)
                arrows.setdefault(into, set())
    return arrows


def packages_of(graph: dict[str, set[str]]) -> list[str]:
    """Every package and subpackage among ``graph``'s modules (each holds an ``__init__``)."""
    return sorted(
        module
        for module in graph
        if any(other.startswith(module + ".") for other in graph) or module in ALLOWED
    )


def test_inside_a_package_no_layer_imports_back_up() -> None:
    graph = import_graph()
    found = [
        f"{package}: " + " <-> ".join(cycle)
        for package in packages_of(graph)
        for cycle in cycles(layer_graph(graph, package))
    ]
    assert not found, (
        "inside a package, modules and subpackages that import each other (an import running back up a "
        "layer; move the shared name below both):\n" + "\n".join(found)
    )


def test_the_layer_graph_sees_a_module_reaching_back_into_a_subpackage() -> None:
    graph = {
        "pkg": set(),
        "pkg.options": {"pkg.tables.store"},
        "pkg.tables": set(),
        "pkg.tables.store": set(),
        "pkg.tables.placement": {"pkg.options"},
        "pkg.cli": {"pkg.options", "pkg.tables.placement"},
    }
    assert cycles(layer_graph(graph, "pkg")) == [("options", "tables")]
    assert cycles(layer_graph(graph, "pkg.tables")) == []
    graph["pkg.options"] = set()
    assert cycles(layer_graph(graph, "pkg")) == []


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
