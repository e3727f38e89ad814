"""Docstrings quote no measured figures: those live in the result files under benchmarks/.

A measured figure (a latency, a rate, a speed-up, a memory peak, an accuracy delta) rots as the
machine and the libraries change, and the committed results come from several machines. A
docstring keeps the reason and points at the result file that holds the figure ("measured in
benchmarks/cold_tier/cold_reads.md"); the numbers the code sets (a 64 MiB chunk, a 1 s grace,
opset 17, a p99 budget of 10 ms) stay.

Every docstring (module, class, function) of every module of the bundle's packages is read
with :mod:`ast`, and so is every attribute docstring that the API reference renders: the run of
``#:`` comment lines directly above a module- or class-level assignment, joined into one text,
and a string literal right after such an assignment. Double-backtick literals,
``:role:`target``` references and paths of files (``benchmarks/...``, ``report.md``) are
blanked, and the text is cut into sentences (at ``.``, ``;``, ``!`` or ``?`` before white
space, and at blank lines). The rule: a sentence quotes a measured figure when it holds

1. a ratio: a number written against an ``x`` (``2.6x``, ``14x slower``), or
2. a rate: a number and a per-second unit at most two words apart (``6.7 GB/s``,
   ``43k random reads/s``, ``900 samples/s``), or the unit right before its number
   (``samples/s 4.2M``), or
3. a cost: a duration right before "per request" (call, batch, row) or "round trip"
   (``0.85 ms per request``), or
4. a word that reports a measurement (:data:`MEASUREMENT_WORDS`: measured, took, costs, spent,
   faster, slower, hit rate, this machine, ...) and a duration (``0.85 ms``, ``20-40 s``) or a
   percentage (``5-10 %``); after "measured" also any decimal or scientific number
   (``22.7 GB``, ``3.9e-4``); beside "peak" also a size (``8.8 GB``).

A setting reads without those words ("every 50 ms", "15 s by default", "64 MiB chunks"), so it
passes; a pointer to a result file carries no figure of its own.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The bundle's packages: every top-level folder with an ``__init__.py`` but the tests.
PACKAGES = tuple(sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests"))

_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUMBER}(?:\s?(?:-|to)\s?\d[\d,]*(?:\.\d+)?)?"

#: Spans blanked before the rule is applied: literals, roles and file paths.
_BLANKED = re.compile(
    r"``.*?``"  # a double-backtick literal
    r"|:[\w:.]+:`[^`]*`"  # a cross-reference role
    r"|\bbenchmarks/[^\s,;:)]+"  # a result file or folder
    r"|[\w./-]+\.(?:md|json|txt|csv|png|log|py|sh)\b",  # any other file
    re.S,
)
_SENTENCE_END = re.compile(r"(?<=[.;!?])\s+|\n\s*\n")

RATIO = re.compile(rf"{_NUMBER}x\b")
_STOPWORDS = r"(?:for|of|per|in|at|to|and|or|the|a|an|as|by|with)\b"
RATE = re.compile(
    rf"{_NUMBER}\s?[kKMG]?(?:\s+(?!{_STOPWORDS})[A-Za-z-]+){{0,2}}\s*[A-Za-z]+/s\b"
    rf"|\b[A-Za-z]+/s\s+{_NUMBER}"  # the unit first: "samples/s 4.2M"
)
DURATION = re.compile(rf"{_RANGE}\s?(?:ns|us|µs|μs|ms|s|secs?|seconds?|minutes?)\b")
COST = re.compile(rf"{DURATION.pattern}\s+(?:per (?:request|call|batch|row)|round[- ]trips?)\b")
PERCENT = re.compile(rf"{_RANGE}\s?%")
DECIMAL = re.compile(r"(?<![\w.])\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)\b")
SIZE = re.compile(rf"{_NUMBER}\s?[KMGT]i?B\b")

#: Words that report a measurement rather than set a value.
MEASUREMENT_WORDS = re.compile(
    r"\b(?:measured|measuring|took|costs?|spent|spends|faster|slower|speed-?ups?|hit rates?"
    r"|this machine(?:'s)?)\b",
    re.I,
)
MEASURED = re.compile(r"\bmeasured\b", re.I)
PEAK = re.compile(r"\bpeak(?:s|ed)?\b", re.I)


def measured_figure(sentence: str) -> bool:
    """Whether ``sentence`` (literals and paths already blanked) quotes a measured figure."""
    if RATIO.search(sentence) or RATE.search(sentence) or COST.search(sentence):
        return True
    if MEASUREMENT_WORDS.search(sentence) and (DURATION.search(sentence) or PERCENT.search(sentence)):
        return True
    measured = MEASURED.search(sentence)
    if measured and DECIMAL.search(sentence, measured.end()):
        return True
    return bool(PEAK.search(sentence) and SIZE.search(sentence))


def offending_sentences(docstring: str) -> Iterator[tuple[int, str]]:
    """``(line offset, sentence)`` of each sentence of ``docstring`` that quotes a measured figure."""
    blanked = _BLANKED.sub(lambda m: re.sub(r"[^\n]", "_", m.group()), docstring)
    start = 0
    for end in [m.start() for m in _SENTENCE_END.finditer(blanked)] + [len(blanked)]:
        if measured_figure(blanked[start:end]):
            lead = len(blanked[start:end]) - len(blanked[start:end].lstrip())
            yield docstring.count("\n", 0, start + lead), " ".join(docstring[start:end].split())
        start = end


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """``(first line, text)`` of every module, class and function docstring of ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            yield first.value.lineno, first.value.value


def attribute_docs(path: Path) -> Iterator[tuple[int, str]]:
    """``(first line, text)`` of every attribute docstring of ``path``, module- or class-level.

    mkdocstrings renders two forms as an attribute's docstring: a run of consecutive ``#:``
    comment lines directly above an assignment (joined into one text, the ``#:`` stripped), and
    a string literal right after an assignment.
    """
    source = path.read_text()
    lines = source.splitlines()
    assignment = ast.Assign | ast.AnnAssign
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.Module | ast.ClassDef):
            continue
        for statement, following in zip(node.body, [*node.body[1:], None], strict=True):
            if not isinstance(statement, assignment):
                continue
            first = statement.lineno - 1
            while first > 0 and lines[first - 1].lstrip().startswith("#:"):
                first -= 1
            if first < statement.lineno - 1:
                comments = (
                    line.lstrip()[2:].removeprefix(" ") for line in lines[first : statement.lineno - 1]
                )
                yield first + 1, "\n".join(comments)
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                yield following.value.lineno, following.value.value


def test_the_detector_flags_measured_figures() -> None:
    for text in (
        "Measured here: 0.85 ms per request at batch 1.",
        "Each call is a 0.85 ms round trip.",
        "The fused table is 2.6x faster than 26 tables.",
        "The cold reads reach 43k random reads/s on this disk.",
        "The export took 174 s on two cores.",
        "Its peak is 1.05x its table bytes.",
        "The stage verifies 6.7 GB/s on two cores.",
        "With more instances, samples/s 4.2M -> 8.0M.",
        "The fused table was faster by 5-10 % in all runs.",
        "Exporting it peaked at 8.8 GB of anonymous memory.",
        "Measured on 4096 rows: a max abs difference of 3.9e-4.",
    ):
        assert list(offending_sentences(text)), text


def test_the_detector_passes_settings_and_sizes() -> None:
    for text in (
        "The store is checked in 64 MiB chunks; a request holds at most 32,768 rows.",
        "The graph is written at opset 17, with a 1 s grace before the kill.",
        "Readiness is polled every 50 ms; 15 s by default.",
        "A p99 budget of 10 ms; the steps' p99 is measured in benchmarks/tune/dlrm-10ms/report.md.",
        "Whole milliseconds (coarser above 100 ms) are too coarse for a sub-millisecond round trip.",
        "Batch sizes ``1024x4`` and ``2 x M x N x K`` FLOPs, in GFLOP/s (FLOPs / 1e9 for GFLOP/s).",
        "Measured lookups per id of the 26 tables (C1..C26).",
    ):
        assert not list(offending_sentences(text)), text


def test_the_offending_line_is_the_sentence_s_own() -> None:
    text = "Summary.\n\nThe reason holds.\nIt took\n12 s here."
    assert list(offending_sentences(text)) == [(3, "It took 12 s here.")]


def test_attribute_docs_are_the_comment_runs_and_strings_beside_assignments(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        "#: Not above an assignment.\n"
        "\n"
        "#: The chunk size,\n"
        "#:   in bytes.\n"
        "CHUNK = 64\n"
        "LIMIT: int = 3\n"
        '"""The limit."""\n'
        "\n"
        "class Options:\n"
        "    #: The grace, in seconds.\n"
        "    grace: float = 1.0\n"
        "\n"
        "    def run(self) -> None:\n"
        "        #: Inside a function: not rendered.\n"
        "        x = 1\n"
    )
    assert list(attribute_docs(module)) == [
        (3, "The chunk size,\n  in bytes."),
        (7, "The limit."),
        (10, "The grace, in seconds."),
    ]


def test_no_docstring_quotes_a_measured_figure() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for first_line, text in [*docstrings(path), *attribute_docs(path)]:
                for offset, sentence in offending_sentences(text):
                    found.append(f"{path.relative_to(ROOT)}:{first_line + offset}: {sentence}")
    assert not found, (
        "docstrings quote measured figures; point at the result file under benchmarks/ that holds "
        "each one (or keep the reason without the number):\n" + "\n".join(found)
    )
