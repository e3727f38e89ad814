"""Every command line the documentation shows names subcommands and options that exist.

The test reads README.md, every ``docs/**/*.md`` and every committed result page
(``benchmarks/**/*.md``: the pages include parts of them, and each shows the command that made
it), takes each ``python -m <stage> ...`` and ``triton-recsys ...`` command (in fenced code
blocks, with ``\\`` continuation lines joined, and in inline code spans, which may wrap across
the lines of a paragraph) and walks it through the real click command tree of the stage it
names (``typer.main.get_command`` of the stage's ``__main__`` app; ``triton-recsys <stage>``
runs the same app, ``triton-recsys demo`` is :mod:`triton_recsys.demo`'s). Each subcommand must
exist and each option (``--foo``, ``-x``) must be one of the command it is given to; an option's
value is skipped as click would skip it, so placeholders such as ``REPO`` or ``...`` are fine as
values. ``a|b|c`` in a subcommand's place names three subcommands; ``[--foo ...]`` is an
optional option, checked like any other; a placeholder in a subcommand's place (``<name>``,
``STAGE``, ``...``) ends the check there. ``bash <script>.sh`` must name a script that exists.

A result keeps the command that made it even when the CLI has changed since, but only as a
record, marked where it is shown: an inline span right after "recorded with an earlier
version:" (words may come between "version" and the colon, e.g. the commit it ran at) is not
checked as a command to run, provided it no longer runs as written (else the marker misleads)
and the span right after "; today:" gives what to run now, which is checked like any other.
"""

from __future__ import annotations

import importlib
import re
import shlex
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import typer.main

ROOT = Path(__file__).resolve().parents[2]
#: The committed result pages: the documentation includes them, and each shows its command.
RESULT_PAGES = sorted((ROOT / "benchmarks").rglob("*.md"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *RESULT_PAGES]

#: The stages ``python -m <stage>`` and ``triton-recsys <stage>`` run, by the module of their app.
STAGE_APPS = {
    stage: f"{stage}.__main__"
    for stage in ("criteo", "models", "export", "server", "clients", "loadtest", "lab")
}
#: The console script's own commands, by the module of their app.
SCRIPT_APPS = {**STAGE_APPS, "demo": "triton_recsys.demo"}

#: Shell words that end a command: a pipe, a list, a redirection.
SEPARATORS = {"|", "||", "&", "&&", ";", ")", "2>&1"}
OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
INLINE_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
#: The text right before a span that records a command of an earlier version, and the text
#: between that span and the one with today's command.
RECORDED = re.compile(r"recorded with an earlier version\b[^`.;]*:\s*$", re.IGNORECASE)
TODAY = re.compile(r"^\s*[;,]?\s*today:\s*$", re.IGNORECASE)
#: A script the documentation runs with ``bash``: a path relative to the repository root.
SCRIPT = re.compile(r"[\w.-]+(/[\w.-]+)*\.sh")


@dataclass(frozen=True)
class Command:
    """One documented command line: where it is and its words."""

    where: str
    words: tuple[str, ...]
    #: Shown as the record of a result made with an earlier version (see the module docstring).
    recorded: bool = False
    #: For a recorded command: the span that says what to run today, if the page gives one.
    today: str | None = None

    def __str__(self) -> str:
        return " ".join(self.words)


#: A click command as typer builds it. typer carries its own copy of click (``typer._click``), so
#: its commands and options are not ``click``'s classes: the test reads them by their attributes
#: (``commands`` of a group, ``opts``, ``is_flag``, ``count``, ``nargs`` of an option).
CliCommand = Any


@cache
def click_command(module: str) -> CliCommand:
    """The click command of the typer ``app`` in ``module``."""
    return typer.main.get_command(importlib.import_module(module).app)


def split_words(text: str) -> list[str]:
    """Shell words of ``text``, comments dropped; plain whitespace split where quotes don't pair."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split("#", 1)[0].split()


def commands_in(text: str, where: str) -> list[Command]:
    """The bundle's commands in one logical shell line."""
    words = split_words(text)
    found: list[Command] = []
    for index, word in enumerate(words):
        name = Path(word).name
        if re.fullmatch(r"python(3(\.\d+)?)?", name) and words[index + 1 : index + 2] == ["-m"]:
            start = index + 2
            if start < len(words) and words[start] in (*STAGE_APPS, "triton_recsys"):
                found.append(Command(where, tuple(take_command(words, start))))
        elif name == "triton-recsys":
            found.append(Command(where, ("triton-recsys", *take_command(words, index + 1))))
        elif name == "bash" and index + 1 < len(words) and SCRIPT.fullmatch(words[index + 1]):
            found.append(Command(where, ("bash", words[index + 1])))
    return found


def take_command(words: list[str], start: int) -> list[str]:
    """``words`` from ``start`` up to the first word that ends the command."""
    taken: list[str] = []
    for word in words[start:]:
        if word in SEPARATORS or is_redirection(word):
            break
        if word.endswith(";"):
            taken.append(word[:-1])
            break
        taken.append(word)
    return taken


def is_redirection(word: str) -> bool:
    """``> file``, ``2>/dev/null``, ``<in``; not a ``<placeholder>``."""
    placeholder = word.startswith("<") and word.endswith(">")
    return word.startswith((">", "<", "1>", "2>")) and not placeholder


def documented_commands(page: Path) -> list[Command]:
    """Every bundle command in ``page``: fenced blocks line by line, prose by inline code span."""
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    lines = page.read_text().splitlines()
    found: list[Command] = []
    in_fence = False
    paragraph: list[tuple[int, str]] = []

    def prose() -> None:
        text = "\n".join(line for _, line in paragraph)
        spans = list(INLINE_CODE.finditer(text))
        for index, match in enumerate(spans):
            number = paragraph[0][0] + text.count("\n", 0, match.start())
            commands = commands_in(match.group(1).replace("\n", " "), f"{name}:{number}")
            if RECORDED.search(text, 0, match.start()):
                following = spans[index + 1] if index + 1 < len(spans) else None
                today = None
                if following and TODAY.match(text[match.end() : following.start()]):
                    today = following.group(1).replace("\n", " ")
                commands = [replace(command, recorded=True, today=today) for command in commands]
            found.extend(commands)
        paragraph.clear()

    logical, first = "", 0
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith(("```", "~~~")):
            prose()
            in_fence = not in_fence
            continue
        if in_fence:
            if not logical:
                first = number
            if line.rstrip().endswith("\\"):
                logical += line.rstrip()[:-1] + " "
                continue
            found.extend(commands_in(logical + line, f"{name}:{first}"))
            logical = ""
        elif line.strip():
            paragraph.append((number, line))
        else:
            prose()
    prose()
    return found


def is_placeholder(word: str) -> bool:
    return "..." in word or "<" in word or word.isupper() or word in ("COMMAND", "STAGE")


def option_names(command: CliCommand) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for param in command.params:
        if param.param_type_name == "option":
            names.update(dict.fromkeys([*param.opts, *param.secondary_opts], param))
    return names


def check(command: Command) -> list[str]:
    """What in ``command`` its click command does not know, one line each."""
    words = list(command.words)
    if words[0] == "bash":
        exists = (ROOT / words[1]).is_file()
        return [] if exists else [f"{command.where}: {command}: no script {words[1]} in the repository"]
    if words[0] in ("triton-recsys", "triton_recsys"):
        words = words[1:]
        if not words or words[0] in ("-h", "--help") or is_placeholder(words[0]):
            return []
        if words[0] not in SCRIPT_APPS:
            return [f"{command.where}: {command}: unknown stage {words[0]}"]
    module = SCRIPT_APPS[words[0]]
    problems: list[str] = []
    walk(click_command(module), words[1:], command, problems)
    return problems


def walk(current: CliCommand, words: list[str], command: Command, problems: list[str]) -> None:
    """Check ``words`` against ``current``, descending into subcommands as click would."""
    index = 0
    while index < len(words):
        word = words[index].strip("[]")
        index += 1
        if not word:
            continue
        if word == "...":
            if hasattr(current, "commands"):
                return  # ``...`` in a subcommand's place: any subcommand, with its own options
            continue
        if OPTION.match(word):
            flag = word.split("=", 1)[0]
            known = option_names(current)
            if flag in ("--help", "-h"):
                continue
            if flag not in known:
                problems.append(f"{command.where}: {command}: unknown option {flag}")
                continue
            param = known[flag]
            takes_value = not (param.is_flag or param.count)
            if takes_value and "=" not in word:
                index += param.nargs
            continue
        if hasattr(current, "commands"):
            if is_placeholder(word):
                return
            names = word.split("|")
            for name in names:
                if name not in current.commands:
                    problems.append(f"{command.where}: {command}: unknown subcommand {name}")
            if len(names) == 1 and names[0] in current.commands:
                walk(current.commands[names[0]], words[index:], command, problems)
            else:
                for name in names:
                    if name in current.commands:
                        walk(current.commands[name], words[index:], command, problems)
            return
        # A positional argument of a leaf command: nothing to check.


def test_pages_show_commands() -> None:
    commands = [command for page in PAGES for command in documented_commands(page)]
    assert len(commands) > 50
    assert any("row-store" in command.words for command in commands)


def test_documented_options_exist() -> None:
    problems = [
        problem
        for page in PAGES
        for command in documented_commands(page)
        if not command.recorded
        for problem in check(command)
    ]
    assert not problems, "documented commands the CLI does not have:\n" + "\n".join(problems)


def recorded_problems(command: Command) -> list[str]:
    """What is wrong with a command marked as recorded with an earlier version, one line each."""
    problems: list[str] = []
    if not check(command):
        problems.append(f"{command.where}: {command}: runs as written today: drop the marker")
    today = command.today and commands_in(command.today, command.where)
    if not today:
        problems.append(f"{command.where}: {command}: recorded, but no '; today: `...`' command beside it")
    return problems


def test_result_pages_show_their_commands() -> None:
    shown = [command for page in RESULT_PAGES for command in documented_commands(page)]
    assert len(RESULT_PAGES) > 30 and len(shown) > 40
    assert any(command.words[:2] == ("lab", "client-cost") and not command.recorded for command in shown)


def test_recorded_commands_are_marked_and_say_what_runs_today() -> None:
    recorded = [command for page in PAGES for command in documented_commands(page) if command.recorded]
    assert recorded, "no result records a command of an earlier version: drop the marker's handling"
    problems = [problem for command in recorded for problem in recorded_problems(command)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_wrong_option() -> None:
    [command] = commands_in("python -m export row-store random --store-dtype fp16 --out x", "page:1")
    assert check(command) == [f"page:1: {command}: unknown option --store-dtype"]
    [command] = commands_in("triton-recsys export row-stor info", "page:2")
    assert check(command) == [f"page:2: {command}: unknown subcommand row-stor"]
    [command] = commands_in("python -m export ... --profile gpu", "page:3")
    assert check(command) == []
    [command] = commands_in("python -m export dlrm ... --profile-gpu", "page:4")
    assert check(command) == [f"page:4: {command}: unknown option --profile-gpu"]


def test_a_recorded_command_is_kept_only_with_its_marker_and_todays_command(tmp_path: Path) -> None:
    page = tmp_path / "result.md"
    page.write_text(
        "- command: recorded with an earlier version: `python -m loadtest soak --out x`; "
        "today: `python -m lab soak --out x`\n\n"
        "- command: recorded with an earlier version (commit abc): `python -m lab stage-times`; "
        "today: `bash benchmarks/no_such/run.sh`\n\n"
        "- command: recorded with an earlier version: `python -m lab soak --out x`; "
        "today: `python -m lab soak`\n\n"
        "- command: recorded with an earlier version: `python -m loadtest gpu`\n\n"
        "- command: `python -m loadtest gpu --out x`\n"
    )
    commands = documented_commands(page)
    assert [(str(c), c.recorded, c.today) for c in commands] == [
        ("loadtest soak --out x", True, "python -m lab soak --out x"),
        ("lab soak --out x", False, None),
        ("lab stage-times", True, "bash benchmarks/no_such/run.sh"),
        ("bash benchmarks/no_such/run.sh", False, None),
        ("lab soak --out x", True, "python -m lab soak"),
        ("lab soak", False, None),
        ("loadtest gpu", True, None),
        ("loadtest gpu --out x", False, None),
    ]
    checked = [problem for command in commands if not command.recorded for problem in check(command)]
    assert checked == [
        "result.md:3: bash benchmarks/no_such/run.sh: no script benchmarks/no_such/run.sh in the repository",
        "result.md:9: loadtest gpu --out x: unknown subcommand gpu",
    ]
    recorded = [problem for command in commands if command.recorded for problem in recorded_problems(command)]
    assert recorded == [
        "result.md:5: lab soak --out x: runs as written today: drop the marker",
        "result.md:7: loadtest gpu: recorded, but no '; today: `...`' command beside it",
    ]


def test_the_check_reads_continuations_and_wrapped_spans(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `python -m loadtest\nsweep --no-such-flag`.\n\n"
        "```bash\n"
        "python -m criteo synth --rows 10 \\\n"
        "    --nope 3 --out x.tsv && triton-recsys demo --rows 5 2>&1 | tee log\n"
        "```\n"
    )
    problems = [problem for command in documented_commands(page) for problem in check(command)]
    assert problems == [
        "page.md:1: loadtest sweep --no-such-flag: unknown option --no-such-flag",
        "page.md:5: criteo synth --rows 10 --nope 3 --out x.tsv: unknown option --nope",
    ]
