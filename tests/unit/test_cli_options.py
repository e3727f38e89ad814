"""An option that two or more commands take is declared once: by module-level aliases
(``Repository = Annotated[_T, typer.Option("--repository", help=...)]``), never by a
``typer.Option(...)`` written into a command's signature.

The test works in two steps:

1. Which flags are shared. Every typer app of the bundle (each module that assigns a module-level
   ``app = new_app(...)``, ``single_command_app(...)`` or ``typer.Typer(...)``: the stages'
   ``__main__`` apps, ``triton_recsys.demo``'s, the benchmark peers' and export's sub-apps) is
   turned into its click command tree (``typer.main.get_command``), sub-apps and app callbacks
   included, and each command's long option flags are collected. Commands are told apart by the
   function behind them, so a command mounted in two apps counts once. A flag that two or more
   commands take is shared.
2. Where each flag is declared. Every module of the bundle's packages is read with :mod:`ast`. A
   ``typer.Option(...)`` call inside a module-level assignment is an alias: one declaration,
   however many commands use it. Any other call (in a parameter's annotation or default) is an
   inline declaration of the flags it names, or, when it names none, of ``--`` and the
   parameter's name, as typer derives the flag.

An inline declaration of a shared flag fails the test, listed as ``flag: file:function``. The cure
is an alias in the lowest module that every command taking the flag may import
(:mod:`bundle.options`, :mod:`criteo.options`, :mod:`loadtest.options`, the stage's own module),
one alias per meaning of the flag: ``--out`` as a report folder and ``--out`` as a TSV file to
write are two aliases, not an exception.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.main

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose modules declare options.
PACKAGES = ("bundle", "criteo", "models", "export", "server", "clients", "loadtest", "lab", "triton_recsys")
#: The calls whose value, assigned to a module-level ``app``, is a typer app.
APP_FACTORIES = frozenset({"new_app", "single_command_app", "Typer"})

#: ``(flag, "file:function")`` declarations allowed inline although other commands take the flag:
#: only where the two flags mean different things and cannot share an alias. Prefer a second alias
#: (as ``--out``, ``--threads`` and ``--repository`` have); none is needed today.
EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, order=True)
class Declaration:
    """One inline ``typer.Option(...)`` of one flag.

    Args:
        flag: the long flag it declares (``--repository``).
        where: ``file:function`` of the declaration, the file relative to the repository.
    """

    flag: str
    where: str


def modules(root: Path = ROOT) -> list[Path]:
    """Every module of :data:`PACKAGES`."""
    return sorted(path for package in PACKAGES for path in (root / package).rglob("*.py"))


def module_name(path: Path, root: Path = ROOT) -> str:
    """``export/__main__.py`` -> ``export.__main__``."""
    return ".".join(path.relative_to(root).with_suffix("").parts)


def _called(node: ast.AST) -> str | None:
    """The name a call calls: ``typer.Option(...)`` -> ``Option``, ``new_app(...)`` -> ``new_app``."""
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    if isinstance(node.func, ast.Name):
        return node.func.id
    return None


def app_modules(root: Path = ROOT) -> list[str]:
    """The modules that assign a typer app to a module-level ``app``."""
    found = []
    for path in modules(root):
        for statement in ast.parse(path.read_text(), str(path)).body:
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == "app" for target in statement.targets)
                and _called(statement.value) in APP_FACTORIES
            ):
                found.append(module_name(path, root))
    return found


def _commands(command: Any) -> Iterator[Any]:
    """``command`` and, for a group, every command below it."""
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def command_flags() -> dict[str, set[Callable[..., Any]]]:
    """Each long option flag of every command of every app, and the commands that take it (each
    command as the function behind it)."""
    takers: dict[str, set[Callable[..., Any]]] = defaultdict(set)
    for name in app_modules():
        for command in _commands(typer.main.get_command(importlib.import_module(name).app)):
            if command.callback is None:
                continue
            function = inspect.unwrap(command.callback)
            for param in command.params:
                if param.param_type_name == "option":
                    for flag in param.opts:
                        if flag.startswith("--"):
                            takers[flag].add(function)
    return takers


def _named_flags(call: ast.Call) -> list[str]:
    """The long flags a ``typer.Option(...)`` names: ``"--stream/--cycle"`` names two."""
    return [
        part.strip()
        for arg in call.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        for part in arg.value.split("/")
        if part.strip().startswith("--")
    ]


def inline_declarations(path: Path, root: Path = ROOT) -> list[Declaration]:
    """The inline ``typer.Option(...)`` declarations of ``path``, one per flag."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {
        id(node)
        for statement in tree.body
        if isinstance(statement, ast.Assign | ast.AnnAssign)
        for node in ast.walk(statement)
    }
    parameter: dict[int, str] = {}  # an option call in a signature -> its parameter's name
    function: dict[int, str] = {}  # any node inside a function -> the innermost function's name
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            function[id(inner)] = node.name  # ast.walk goes outside in: an inner def overwrites
        arguments = node.args
        positional = arguments.posonlyargs + arguments.args
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
        pairs = [
            *zip(positional, [*defaults, *arguments.defaults], strict=True),
            *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True),
        ]
        for arg, default in pairs:
            for part in (arg.annotation, default):
                for inner in ast.walk(part) if part is not None else ():
                    parameter[id(inner)] = arg.arg
    relative = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _called(node) != "Option" or id(node) in aliases:
            continue
        flags = _named_flags(node)
        if not flags and id(node) in parameter:
            flags = ["--" + parameter[id(node)].replace("_", "-")]
        where = f"{relative}:{function.get(id(node), '<module>')}"
        found += [Declaration(flag, where) for flag in flags]
    return sorted(found)


def test_every_stage_and_the_demo_are_walked() -> None:
    found = set(app_modules())
    stages = {f"{stage}.__main__" for stage in PACKAGES if (ROOT / stage / "__main__.py").is_file()}
    stages -= {"triton_recsys.__main__"}  # the console script: it runs the stages' apps by name
    assert stages | {"triton_recsys.demo"} <= found
    takers = command_flags()
    assert len(takers["--repository"]) > 10  # served, read and written by most stages


def test_the_reader_tells_an_alias_from_an_inline_option(tmp_path: Path) -> None:
    (tmp_path / "cli.py").write_text(
        "import typer\n"
        "from typing import Annotated\n"
        'Shared = Annotated[int, typer.Option("--shared", help="declared once")]\n'
        "def command(\n"
        "    shared: Shared = 1,\n"
        '    own_flag: Annotated[int, typer.Option(help="inline")] = 2,\n'
        '    on: Annotated[bool, typer.Option("--on/--off")] = False,\n'
        ") -> None:\n"
        "    pass\n"
    )
    assert inline_declarations(tmp_path / "cli.py", tmp_path) == [
        Declaration("--off", "cli.py:command"),
        Declaration("--on", "cli.py:command"),
        Declaration("--own-flag", "cli.py:command"),
    ]


def test_a_flag_that_several_commands_take_is_declared_once() -> None:
    shared = {flag for flag, takers in command_flags().items() if len(takers) > 1}
    inline = [declaration for path in modules() for declaration in inline_declarations(path)]
    offending = sorted(
        f"{d.flag}: {d.where}" for d in inline if d.flag in shared and (d.flag, d.where) not in EXCEPTIONS
    )
    assert not offending, (
        "flags that two or more commands take, declared inline; declare each once, as a module-level "
        "alias in the lowest module its commands may import (see bundle/options.py):\n" + "\n".join(offending)
    )
    stale = EXCEPTIONS - {(d.flag, d.where) for d in inline if d.flag in shared}
    assert not stale, f"exceptions no longer needed: {sorted(stale)}"
