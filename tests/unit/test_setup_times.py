"""README's times for ``make demo`` and ``make test`` are the committed record's, word for word.

``benchmarks/setup_times/result.md`` (``bash benchmarks/setup_times/run.sh``) times both commands
on a fresh clone and names its machine, date and commit. The docs include it as a snippet;
README, which GitHub shows without snippets, carries a copy of its lines between two markers,
and this test keeps the copy equal to the record.
"""

from __future__ import annotations

import re
from pathlib import Path

from bundle.snippets import section_end, section_start

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "setup_times" / "result.md"
README = ROOT / "README.md"


def section(text: str, start: str, end: str) -> list[str]:
    """The non-empty lines strictly between the markers ``start`` and ``end``."""
    body = text.split(start, 1)[1].split(end, 1)[0]
    return [line for line in body.splitlines() if line.strip()]


def recorded() -> list[str]:
    return section(RESULT.read_text(), section_start("results"), section_end("results"))


def test_the_record_names_its_command_machine_and_both_times() -> None:
    lines = recorded()
    text = "\n".join(lines)
    command = r"\*\*Command\*\*: `bash benchmarks/setup_times/run.sh` \(a fresh clone of commit `[0-9a-f]{7,}"
    assert re.search(command, text), text
    assert re.search(r"\*\*Machine\*\*: \S.*\d+ cores", text), text
    for command in ("make demo", "make test"):
        row = next((line for line in lines if line.startswith(f"| `{command}` |")), None)
        assert row is not None, f"no row for {command}"
        assert re.search(r"\| \d+ min \d\d s \|$", row), row
    assert re.search(r"\d+ passed", text), "make test's row names no pytest summary"


def test_readme_quotes_the_record_as_it_is() -> None:
    quoted = section(README.read_text(), "<!-- setup-times: start -->", "<!-- setup-times: end -->")
    assert quoted == recorded()
