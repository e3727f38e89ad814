"""The documentation's examples run, and the documentation keeps its shape.

Runnable blocks: a fenced ```` ```bash ```` block whose previous non-blank line is the HTML
comment ``<!-- run: tiny -->`` (invisible on GitHub and on the site). The test takes the marked
blocks of ``docs/getting-started.md``, in page order, joins them into one ``bash -euo pipefail``
script (so the venv activated by one block stays active in the next, as in a terminal) and runs
it in an empty temporary folder; then it runs README.md's marked blocks in the same folder.

Tiny sizes: before running, the test rewrites each block with :data:`TINY`, a table of exact
text substitutions (``--preset small`` -> ``--preset tiny``, 300,000 rows -> 3,000, 10 s
load-test steps -> 1 s, ...). A substitution that no longer matches any block fails the test,
so the table cannot silently fall out of step with the page. README.md's blocks start where
``make demo`` ends (``artifacts/demo/...``); the table points those paths at the files the
getting-started blocks made (``data/``, ``artifacts/dlrm``), which are made the same way.

After each script every load-test report it wrote (``reports/**/steps.csv``) must show
requests and no errors: a sweep against a model the repository lacks exits 0 with every
request failed, and that must not pass as a working example.

The whole run takes about a minute on 2 cores (training and export at the tiny preset, two
sweeps of 1 s steps, each starting its own tritonserver on free ports), hence ``integration``.
The other tests here check that README.md stays short, that no page names an issue number, and
that pages include parts of result files by named section, not by line numbers.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
README = ROOT / "README.md"
MARKER = "<!-- run: tiny -->"

#: Exact text substitutions applied to the runnable blocks, page by page, before they run.
TINY: dict[Path, list[tuple[str, str]]] = {
    GETTING_STARTED: [
        ("source .venv/bin/activate", f"source {ROOT / '.venv' / 'bin' / 'activate'}"),
        ("--rows 300000", "--rows 3000"),
        ("--rows 20000", "--rows 5000"),  # the export's checks need 4,096 rows
        ("--preset small", "--preset tiny"),
        ("--concurrency 1,2,4 --duration 10", "--concurrency 1,2 --duration 1"),
    ],
    README: [
        ("source .venv/bin/activate", f"source {ROOT / '.venv' / 'bin' / 'activate'}"),
        ("artifacts/demo/data/", "data/"),
        ("artifacts/demo/dlrm", "artifacts/dlrm"),
        ("--concurrency 1,2,4 --duration 5", "--concurrency 1,2 --duration 1"),
    ],
}

#: "issue 14", "issues 3", "#21": issue numbers say nothing to a reader; say what and why.
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+|(?<![\w&/])#\d+\b", re.IGNORECASE)
#: A pymdownx.snippets include by line numbers (``--8<-- "file.md:14:29"``, ``"file.md:2:"``).
LINE_NUMBER_INCLUDE = re.compile(r'--8<--\s+"[^"]*?:-?\d*(?::-?\d*)?(?:,-?\d*(?::-?\d*)?)*"')


def runnable_blocks(page: Path) -> list[str]:
    """The bodies of the page's ```bash blocks marked with :data:`MARKER`, in page order."""
    blocks: list[str] = []
    lines = page.read_text().splitlines()
    previous = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.strip() == "```bash" and previous == MARKER:
            end = lines.index("```", index + 1)
            blocks.append("\n".join(lines[index + 1 : end]))
            index = end
        elif line.strip():
            previous = line.strip()
        index += 1
    return blocks


def tiny_script(page: Path) -> str:
    """The page's runnable blocks as one script, with :data:`TINY`'s substitutions applied."""
    script = "\n".join(runnable_blocks(page))
    for old, new in TINY[page]:
        assert old in script, f"{page.name}: the substitution for {old!r} matches no runnable block"
        script = script.replace(old, new)
    return script


def run_script(script: str, cwd: Path, timeout_s: float) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    completed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert completed.returncode == 0, (
        f"exit {completed.returncode}\n--- script\n{script}\n--- output (tail)\n"
        f"{(completed.stdout + completed.stderr)[-4000:]}"
    )


def assert_load_tests_answered(folder: Path) -> None:
    steps_files = sorted(folder.glob("reports/**/steps.csv"))
    assert steps_files, f"no load-test report under {folder / 'reports'}"
    for steps_file in steps_files:
        with steps_file.open() as f:
            rows = list(csv.DictReader(f))
        assert rows, f"{steps_file}: no steps"
        for row in rows:
            assert int(row["requests"]) > 0, f"{steps_file}: no requests answered in {row}"
            assert int(row["errors"]) == 0, f"{steps_file}: errors in {row}"


def test_pages_have_runnable_blocks() -> None:
    assert len(runnable_blocks(GETTING_STARTED)) >= 4
    assert runnable_blocks(README)


@pytest.mark.integration
def test_getting_started_and_readme_commands_run_at_tiny_sizes(tmp_path: Path) -> None:
    run_script(tiny_script(GETTING_STARTED), tmp_path, timeout_s=240)
    assert_load_tests_answered(tmp_path)
    for report in tmp_path.glob("reports/**/steps.csv"):
        report.unlink()
    run_script(tiny_script(README), tmp_path, timeout_s=120)
    assert_load_tests_answered(tmp_path)
    assert (tmp_path / "reports" / "my_sweep" / "latency_vs_throughput.png").is_file()


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_no_issue_numbers_in_docs() -> None:
    pages = [README, ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in ISSUE_NUMBER.finditer(line)
    ]
    assert not found, "issue numbers in the documentation:\n" + "\n".join(found)


def test_includes_name_their_section() -> None:
    """A page includes part of a result file by a named section (the file carries
    ``<!-- --8<-- [start:name] -->`` ... ``[end:name]``, see :mod:`bundle.snippets`), never by line
    numbers, which show the wrong lines without a word once the file is written again."""
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)}"
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in LINE_NUMBER_INCLUDE.finditer(line)
    ]
    assert not found, "includes by line numbers (name a section instead):\n" + "\n".join(found)


def test_line_number_includes_are_recognised() -> None:
    for include in ('"a.md:14:29"', '"a.md:2:"', '"a.md:2:27,29:30"', '"a/b.md:5"'):
        assert LINE_NUMBER_INCLUDE.search(f"--8<-- {include}"), include
    for include in ('"a.md:steps"', '"a.md"', '"a/b_2.md:served-vs-in-process"', '"a.md:scaling-x_2"'):
        assert not LINE_NUMBER_INCLUDE.search(f"--8<-- {include}"), include
