"""The compiled raw-row parse against the python rules, on one random corpus.

The C++ stage (``backends/raw_rows``) applies the rules of :mod:`criteo.rows` in a second
language. Its test driver (built by ``make stages``) parses the same texts as
:func:`criteo.rows.parse_rows`: random fields, stray bytes, overflowing counts, missing fields,
extreme ids, wrong field and row counts, labels, line ends. Every answer must be identical: the
counts, the missing flags, the ids and the labels bit for bit, and an error's row, field and
text. The dense features too, bit for bit, where numpy's float32 ``log1p`` is the C library's
``log1pf`` (the compiled stage calls that one); where numpy takes a SIMD version of its own
(some builds do on AVX-512 machines), within 4 ULP. The stage's own step, rows of a request joined into one
text, is checked against :func:`criteo.rows.join_rows` the same way.

``RAW_ROWS_DRIVER`` names another driver (``make stages-sanitize`` runs this test against the
ASan + UBSan build).
"""

from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from criteo import rows as rules
from tests.native_stages import LOG1P_IS_LIBMS

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(os.environ.get("RAW_ROWS_DRIVER", ROOT / "build" / "stages" / "raw_rows" / "raw_rows_driver"))

pytestmark = pytest.mark.skipif(
    not DRIVER.is_file(), reason=f"the compiled stages are not built ({DRIVER} is missing): run `make stages`"
)

HEX = "0123456789abcdefABCDEF"


@dataclass(frozen=True)
class Case:
    """One text for the driver: ``parse_rows(text, labeled, rows)``, or the stage's ``rows``."""

    text: bytes = b""
    labeled: bool | None = False
    rows: int | None = None
    stage_rows: tuple[bytes, ...] | None = None

    def encode(self) -> bytes:
        if self.stage_rows is not None:
            body = b"".join(struct.pack("<Q", len(row)) + row for row in self.stage_rows)
            return b"S" + struct.pack("<Q", len(self.stage_rows)) + body
        flag = {False: b"0", True: b"1", None: b"?"}[self.labeled]
        expected = -1 if self.rows is None else self.rows
        return b"P" + flag + struct.pack("<qQ", expected, len(self.text)) + self.text


def _count(rng: np.random.Generator) -> str:
    kind = rng.integers(0, 14)
    digits = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 22))))
    return [
        str(int(rng.integers(0, 1000))),
        str(int(rng.integers(0, 1000))),
        "",
        "-" + str(int(rng.integers(0, 10**6))),
        "9" * 18,
        "-" + "9" * 18,
        "1" + "0" * 18,  # 19 digits
        digits,
        "-" + digits,
        "-",
        "0" * int(rng.integers(1, 20)),
        "+5",
        " 7",
        str(int(rng.integers(0, 10**17))),
    ][kind]


def _id(rng: np.random.Generator) -> str:
    kind = rng.integers(0, 12)
    width = int(rng.integers(1, 18))
    digits = "".join(rng.choice(list(HEX), width))
    return [
        format(int(rng.integers(0, 2**32)), "x"),
        format(int(rng.integers(0, 2**32)), "X"),
        "",
        digits,
        "ffffffffffffffff",
        "8000000000000000",
        "7FFFFFFFFFFFFFFF",
        "0" * 16,
        "f" * 17,
        "0x1f",
        "g",
        format(int(rng.integers(0, 2**63)), "016x"),
    ][kind]


def _stray(rng: np.random.Generator, text: bytes) -> bytes:
    """``text`` with one random byte put in, replaced or taken out."""
    where = int(rng.integers(0, len(text) + 1))
    byte = bytes([int(rng.choice([9, 10, 13, 39, 34, 92, 0, 127, 160, 173, 255, int(rng.integers(0, 256))]))])
    action = rng.integers(0, 3)
    if action == 0:
        return text[:where] + byte + text[where:]
    if action == 1:
        return text[:where] + byte + text[where + 1 :]
    return text[:where] + text[where + 1 :]


def _row(rng: np.random.Generator, labeled: bool, faults: float) -> bytes:
    def good_count() -> str:
        return str(int(rng.integers(0, 100)))

    def good_id() -> str:
        return format(int(rng.integers(0, 2**31)), "x")

    fields = [_count(rng) if rng.random() < faults else good_count() for _ in range(13)]
    fields += [_id(rng) if rng.random() < faults else good_id() for _ in range(26)]
    if labeled:
        label = str(int(rng.integers(0, 2)))
        fields.insert(0, label if rng.random() > faults else ["", "2", "01", "x"][rng.integers(0, 4)])
    if rng.random() < faults:
        del fields[int(rng.integers(0, len(fields)))]
    if rng.random() < faults:
        fields.insert(int(rng.integers(0, len(fields))), "0")
    text = "\t".join(fields).encode()
    while rng.random() < faults:
        text = _stray(rng, text)
    return text


def corpus(seed: int, size: int) -> Iterator[Case]:
    rng = np.random.default_rng(seed)
    for _ in range(size):
        faults = float(rng.choice([0.0, 0.005, 0.02, 0.1, 0.4]))
        rows = int(rng.integers(1, 9))
        kind = rng.integers(0, 4)
        if kind == 3:
            stage = []
            for _ in range(rows):
                row = _row(rng, False, faults)
                if rng.random() < 0.3:
                    row += [b"\n", b"\r\n", b"\n\n", b"\r", b"\n\r\n"][rng.integers(0, 5)]
                stage.append(row)
            yield Case(stage_rows=tuple(stage))
            continue
        labeled = [False, True, None][kind]
        with_label = bool(labeled) if labeled is not None else rng.random() < 0.5
        ends = [b"\n", b"\r\n"][rng.integers(0, 2)]
        text = ends.join(_row(rng, with_label, faults) for _ in range(rows))
        if rng.random() < 0.5:
            text += ends
        expected = None if rng.random() < 0.5 else rows + int(rng.choice([0, 0, 0, 1, -1]))
        yield Case(text, labeled, expected)
    yield Case(b"", False, None)
    yield Case(b"", None, 0)
    yield Case(b"\n", False, None)
    yield Case(b"\r\n", None, 1)
    yield Case(stage_rows=(b"",))
    yield Case(stage_rows=(b"\t" * 38,))
    yield Case(stage_rows=(b"\t" * 38 + b"\r\n", b"\t" * 38))
    yield Case(stage_rows=(b"\t" * 38 + b"\n", b"\t" * 38 + b"\n"))


def _expected(case: Case) -> str:
    """The driver's answer line, computed by the python rules."""
    if case.stage_rows is not None:
        text, labeled, rows = rules.join_rows(case.stage_rows), False, len(case.stage_rows)
    else:
        text, labeled, rows = case.text, case.labeled, case.rows
    try:
        parsed = rules.parse_rows(text, labeled=labeled, rows=rows)
    except rules.RowError as exc:
        return f"E {exc.row} {exc.column or '-'} {str(exc).encode().hex()}"
    dense, ids = rules.model_inputs(parsed)

    def hexed(array: np.ndarray | None) -> str:
        return array.tobytes().hex() if array is not None and array.size else "-"

    with_label = parsed.labels is not None
    return " ".join(
        [
            "K",
            str(len(parsed)),
            str(int(with_label)),
            hexed(dense),
            hexed(parsed.counts.astype("<i8")),
            hexed(parsed.missing.astype(np.uint8)),
            hexed(ids.astype("<i8")),
            hexed(parsed.labels),
        ]
    )


def _run_driver(cases: list[Case]) -> list[str]:
    done = subprocess.run(
        [str(DRIVER)], input=b"".join(case.encode() for case in cases), capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode().splitlines()


def _same(got: str, want: str) -> bool:
    """Whether two answer lines agree (the dense features within 4 ULP where log1p differs)."""
    if got == want:
        return True
    mine, theirs = got.split(" "), want.split(" ")
    if (
        LOG1P_IS_LIBMS
        or mine[0] != "K"
        or len(mine) != len(theirs)
        or mine[:3] + mine[4:] != theirs[:3] + theirs[4:]
    ):
        return False
    dense = [np.frombuffer(bytes.fromhex(line[3]), dtype=np.float32) for line in (mine, theirs)]
    np.testing.assert_array_max_ulp(dense[0], dense[1], maxulp=4)
    return True


def _describe(line: str) -> str:
    if line.startswith("E "):
        _, row, column, message = line.split(" ")
        return f"error row {row} {column}: {bytes.fromhex(message).decode(errors='replace')}"
    return line[:200]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_compiled_parse_answers_as_the_python_rules(seed: int) -> None:
    cases = list(corpus(seed, 1000))
    answered = _run_driver(cases)
    assert len(answered) == len(cases)
    kinds = {"E": 0, "K": 0}
    for case, got in zip(cases, answered, strict=True):
        want = _expected(case)
        kinds[want[0]] += 1
        assert _same(got, want), f"{case!r}\n  C++:    {_describe(got)}\n  python: {_describe(want)}"
    # The corpus exercises both outcomes in earnest.
    assert kinds["E"] > len(cases) // 5 and kinds["K"] > len(cases) // 5, kinds


def test_every_single_byte_in_a_field_is_judged_alike() -> None:
    """Each of the 256 byte values alone in a count, an id and a label (quoting included)."""
    base = ["1"] * 13 + ["a"] * 26
    cases = []
    for value in range(256):
        byte = bytes([value])
        for index in (0, 12, 13, 38):
            fields = [field.encode() for field in base]
            fields[index] = b"7" + byte + b"'"
            cases.append(Case(b"\t".join(fields), False, 1))
        cases.append(Case(byte + b"\t" + b"\t".join(field.encode() for field in base), True, None))
    for case, got in zip(cases, _run_driver(cases), strict=True):
        want = _expected(case)
        assert _same(got, want), f"{case!r}\n  C++:    {_describe(got)}\n  python: {_describe(want)}"


def test_a_long_bad_field_is_quoted_by_its_head_and_length_alike() -> None:
    """A bad field longer than QUOTED_BYTES is quoted by its first bytes and its length, in a count,
    an id and a label, so an error never carries a whole row back (gRPC refuses long messages)."""
    base = [b"1"] * 13 + [b"a"] * 26
    cases = []
    for length in (rules.QUOTED_BYTES - 1, rules.QUOTED_BYTES, rules.QUOTED_BYTES + 1, 70_000):
        field = b"z'" + b"\xe9" * (length - 2)
        for index in (0, 20):
            fields = list(base)
            fields[index] = field
            cases.append(Case(b"\t".join(fields), False, 1))
        cases.append(Case(field + b"\t" + b"\t".join(base), True, None))
    for case, got in zip(cases, _run_driver(cases), strict=True):
        want = _expected(case)
        assert _same(got, want), f"{case!r}\n  C++:    {_describe(got)}\n  python: {_describe(want)}"
    with pytest.raises(rules.RowError, match=r"""C8: categorical id "z'é+"\.\.\. \(70000 bytes\) is not"""):
        rules.parse_rows(b"\t".join([*base[:20], b"z'" + b"\xe9" * 69_998, *base[21:]]), labeled=False)
