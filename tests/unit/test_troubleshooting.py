"""docs/troubleshooting.md quotes messages that still occur in the sources it names.

Each message on the page sits in a fenced block ```` ```text title="<sources>" ````: one message
per line, ``<...>`` (a lowercase word or phrase in angle brackets) for what varies, and the title
naming the files it comes from, separated by spaces: repository paths, or ``pip`` for pip's own
messages (read from the installed pip). A message holds when its literal text, between the
placeholders, is made of the string literals of those sources: each literal run of the message
lies within one string, or runs from the end of one string through whole strings into the start
of another (a message assembled from pieces, ``"model '" + name + "': io_uring is unavailable
(" + why + ")"``; a whole string between two others is punctuation or at least three characters
with its letters), and at least ten characters in a row of it lie within one string. So a
changed word in a source fails the test until the page says the same.

What counts as a source's strings: for Python, every string constant and f-string (its
replacement fields and printf-style ``%s`` fields as breaks; a module-level string constant
named in a field is read in place) and every comment (where the bundle records the texts of
other programs, such as tritonserver's); for C++, shell, Makefiles and YAML, every double-quoted
literal (adjacent literals joined, ``$VAR``, ``$(VAR)``, ``${VAR}`` and ``%s`` as breaks); for
any other file, each line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
#: Stands for a value in a source's strings.
BREAK = "\x00"
#: A placeholder on the page: ``<model>``, ``<release's libtorch>``.
PLACEHOLDER = re.compile(r"<[a-z][a-z0-9 _'.-]*>")
_PRINTF = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdifgrxe]")
_BLOCK = re.compile(r'^```text title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
_C_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_SHELL_VARIABLE = re.compile(r"\$(?:\([^)]*\)|\{[^}]*\}|\w+)")
#: The shortest whole piece with letters that may join two others in a message.
MIDDLE = 3
#: How many characters of a message in a row must lie within a single string of its sources.
ANCHOR = 10


def _printf_breaks(text: str) -> str:
    return _PRINTF.sub(BREAK, text).replace("%%", "%")


def _python_strings(path: Path) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    strings: list[str] = []
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                in_fstring.add(id(value))
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append(_printf_breaks(value.value))
                elif (
                    isinstance(value, ast.FormattedValue)
                    and isinstance(value.value, ast.Name)
                    and value.value.id in constants
                    and value.format_spec is None
                    and value.conversion == -1
                ):
                    parts.append(constants[value.value.id])
                else:
                    parts.append(BREAK)
            strings.append("".join(parts))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring:
            strings.append(_printf_breaks(node.value))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            strings.append(token.string.lstrip("#").strip())
    return strings


def _quoted_strings(path: Path) -> list[str]:
    text = path.read_text()
    # Adjacent literals, as C++ and Python join them: "abc" "def" across lines.
    joined = re.sub(r'"\s*\n\s*"', "", text)
    return [
        _SHELL_VARIABLE.sub(BREAK, _printf_breaks(match.group(1))) for match in _C_STRING.finditer(joined)
    ]


@cache
def source_strings(name: str) -> tuple[str, ...]:
    """The strings of the source ``name`` (a repository path, or ``pip``)."""
    if name == "pip":
        import pip

        files = sorted(Path(pip.__file__).parent.rglob("*.py"))
        return tuple(string for file in files for string in _python_strings(file))
    path = ROOT / name
    assert path.is_file(), f"the page names {name}, which is not a file of the repository"
    if path.suffix == ".py":
        return tuple(_python_strings(path))
    if path.suffix in (".cc", ".h", ".sh", ".yml", ".yaml") or path.name == "Makefile":
        return tuple(_quoted_strings(path))
    return tuple(path.read_text().splitlines())


@cache
def _pieces(sources: tuple[str, ...]) -> tuple[str, frozenset[str]]:
    """All the sources' strings joined by breaks, and their whole pieces between breaks."""
    strings = [string for name in sources for string in source_strings(name)]
    joined = BREAK + BREAK.join(strings) + BREAK
    return joined, frozenset(joined.split(BREAK))


def run_holds(run: str, sources: tuple[str, ...]) -> bool:
    """Whether the literal ``run`` lies within one piece of ``sources``' strings (the text between
    two breaks), or is the end of one piece, then whole pieces, then the start of another."""
    joined, whole = _pieces(sources)
    if run in joined:  # a run holds no break, so this is within one piece
        return True
    # ends[i]: run[:i] is the end of a piece followed by whole pieces, up to a break.
    ends = [False] * len(run)
    for i in range(1, len(run)):
        ends[i] = run[:i] + BREAK in joined or any(
            ends[j] and _joins(run[j:i]) and run[j:i] in whole for j in range(1, i)
        )
    return any(ends[j] and BREAK + run[j:] in joined for j in range(1, len(run)))


def _joins(piece: str) -> bool:
    """Whether a whole piece may stand between two others: punctuation (``": "``, ``")"``), or
    words of at least :data:`MIDDLE` characters; a letter or two could spell anything."""
    return not re.search(r"[A-Za-z]", piece) or len(piece.strip()) >= MIDDLE


def messages() -> list[tuple[tuple[str, ...], str]]:
    """``(sources, message)`` of every quoted line of the page."""
    found = []
    for title, body in _BLOCK.findall(PAGE.read_text()):
        sources = tuple(title.split())
        found += [(sources, line) for line in body.splitlines() if line.strip()]
    return found


def test_the_page_quotes_messages_in_titled_blocks_only() -> None:
    text = PAGE.read_text()
    untitled = re.findall(r"^```text\s*$", text, re.MULTILINE)
    assert not untitled, "a message block without the title that names its sources"
    assert len(messages()) >= 20


@pytest.mark.parametrize(("sources", "message"), messages(), ids=lambda value: str(value)[:60])
def test_each_quoted_message_occurs_in_its_sources(sources: tuple[str, ...], message: str) -> None:
    runs = [run for run in PLACEHOLDER.split(message) if run.strip()]
    assert runs, f"{message!r} quotes nothing"
    joined, _ = _pieces(sources)
    windows = {run[start : start + ANCHOR] for run in runs for start in range(len(run) - ANCHOR + 1)}
    assert any(window in joined for window in windows), (
        f"no {ANCHOR} characters of {message!r} in a row lie within one string of {' '.join(sources)}"
    )
    for run in runs:
        assert run_holds(run, sources), f"{run!r} of {message!r} is not in {' '.join(sources)}"


def test_the_matcher_holds_runs_to_their_strings() -> None:
    sources = ("server/launcher.py", "server/dead_models.py")
    assert run_holds("lost its backend process (", sources)
    assert run_holds("; reloading it", sources)
    assert not run_holds("lost its backend processes (", sources)
    # The end of one string, then the start of another: "%s: %s, tritonserver ready" + "restart ".
    assert run_holds(": restart ", ("server/supervisor.py",))
    assert not run_holds(": rest art ", ("server/supervisor.py",))
