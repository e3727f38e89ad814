"""The stages import each other in one direction only (ARCHITECTURE.md), and nothing imports benchmarks/.

Every ``import`` of every module is read with :mod:`ast`, those inside
functions and ``TYPE_CHECKING`` blocks included, so a lazy import breaks a
layer as surely as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Which stages each stage may import. bundle is the base and imports no stage; criteo is the data
#: contract; clients know nothing of the server; the server knows nothing of models and clients;
#: export runs the served ensemble stages (server.stages) to check an export; loadtest is the top
#: stage: it measures the clients against a server it may start, and drives the whole demo.
ALLOWED: dict[str, frozenset[str]] = {
    "bundle": frozenset(),
    "criteo": frozenset({"bundle"}),
    "models": frozenset({"bundle", "criteo"}),
    "export": frozenset({"bundle", "criteo", "models", "server"}),
    "server": frozenset({"bundle", "criteo"}),
    "clients": frozenset({"bundle", "criteo"}),
    "loadtest": frozenset({"bundle", "criteo", "models", "export", "server", "clients"}),
    # The console script runs each stage by name (runpy), importing none.
    "triton_recsys": frozenset(),
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
