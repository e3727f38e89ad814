"""The rules that turn a Criteo row into model inputs (:mod:`criteo.rows`), on the edge rows:
missing fields, negative and huge counts, hex in either case, ids at and past 2^63, and the
rows that break a rule (each refused naming its row and field)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

from bundle import schema
from criteo import rows as rules
from criteo.rows import RowError, model_inputs, parse_rows

COUNTS = ["5", "", "-3", "0", "999999999999999999", "-999999999999999999", "1", "2", "3", "4", "", "7", "100"]
IDS = ["68fd1e64", "", "A", "ffffffffffffffff", "8000000000000000", "7FFFFFFFFFFFFFFF", "DeadBeef", "0"]
IDS += [f"{i:x}" for i in range(18)]
ROW = "\t".join([*COUNTS, *IDS])


def _reference(row: str) -> tuple[np.ndarray, np.ndarray]:
    """The rules written out one field at a time, in plain Python."""
    fields = row.split("\t")
    counts = [max(int(f), 0) if f else 0 for f in fields[:13]]
    ids = [int(f, 16) if f else 0 for f in fields[13:]]
    ids = [i - (1 << 64) if i >= 1 << 63 else i for i in ids]
    return np.log1p(np.array(counts, dtype=np.float32)), np.array(ids, dtype=np.int64)


def test_edge_rows_follow_the_rules_field_by_field() -> None:
    parsed = parse_rows(f"{ROW}\n{ROW.upper()}\r\n{ROW.lower()}".encode(), rows=3)
    dense, ids = model_inputs(parsed)
    assert dense.dtype == np.float32 and ids.dtype == np.int64 and parsed.labels is None
    for row in (0, 1, 2):
        expected_dense, expected_ids = _reference(ROW)
        np.testing.assert_array_equal(ids[row], expected_ids)
        np.testing.assert_allclose(dense[row], expected_dense, rtol=1e-7)
    assert ids[0, 3] == -1 and ids[0, 4] == np.iinfo(np.int64).min and ids[0, 5] == np.iinfo(np.int64).max
    assert ids[0, 1] == rules.MISSING_ID and parsed.missing[0].tolist() == [c == "" for c in COUNTS]
    assert parsed.counts[0, 5] == -999999999999999999 and dense[0, 5] == 0.0


def test_labels_are_read_when_the_rows_carry_them() -> None:
    parsed = parse_rows(f"1\t{ROW}\n0\t{ROW}\n".encode(), labeled=None)
    assert parsed.labels is not None and parsed.labels.tolist() == [1.0, 0.0]
    assert len(parse_rows(b"")) == 0


@pytest.mark.parametrize(
    ("bad", "column", "message"),
    [
        ("1\t2\t3", None, "expected 39 tab-separated fields, got 3"),
        (ROW + "\t0", None, "expected 39 tab-separated fields, got 40"),
        (ROW.replace("\t-3\t", "\tfive\t", 1), "I3", "I3: count 'five' is not an integer"),
        (ROW.replace("\t-3\t", "\t1.5\t", 1), "I3", "count '1.5' is not an integer"),
        (ROW.replace("\t-3\t", "\t-\t", 1), "I3", "count '-' is not an integer"),
        (ROW.replace("\t-3\t", "\t1234567890123456789\t", 1), "I3", "of 1 to 18 digits"),
        (ROW.replace("68fd1e64", "zz9", 1), "C1", "C1: categorical id 'zz9' is not 1 to 16 hex digits"),
        (ROW.replace("68fd1e64", "1" * 17, 1), "C1", "is not 1 to 16 hex digits"),
        (ROW.replace("DeadBeef", "Dead Beef", 1), "C7", "C7: categorical id 'Dead Beef'"),
        (ROW.replace("DeadBeef", "Dead\rBeef", 1), "C7", r"C7: categorical id 'Dead\\rBeef'"),
    ],
)
def test_a_row_that_breaks_a_rule_is_refused_naming_its_row_and_field(
    bad: str, column: str | None, message: str
) -> None:
    with pytest.raises(RowError, match=message) as error:
        parse_rows(f"{ROW}\n{ROW}\n{bad}\n{ROW}".encode())
    assert error.value.row == 2 and error.value.column == column
    assert str(error.value).startswith("row 2: ") and "\n" not in str(error.value)


def test_a_line_break_inside_a_row_is_refused() -> None:
    with pytest.raises(RowError, match="expected 2 rows, got 3"):
        parse_rows(f"{ROW}\n{ROW}\n{ROW}".encode(), rows=2)


def test_a_label_other_than_0_or_1_is_refused() -> None:
    with pytest.raises(RowError, match="row 1: label must be 0 or 1, got '2'") as error:
        parse_rows(f"1\t{ROW}\n2\t{ROW}".encode(), labeled=True)
    assert error.value.column == "label"


def test_the_rules_module_agrees_with_the_served_contract_and_imports_numpy_and_the_stdlib_alone() -> None:
    """The one definition of the rules (the compiled stage is held to it) needs numpy and the
    standard library, nothing of the bundle's."""
    assert (rules.NUM_DENSE, rules.NUM_CATEGORICAL) == (schema.NUM_DENSE, schema.NUM_CATEGORICAL)
    tree = ast.parse(Path(rules.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
    assert imported - {"numpy"} <= sys.stdlib_module_names, imported


def _python_rules(row: str) -> tuple[list[int], list[int]] | None:
    """The rules on one row in plain Python: its counts (missing: -1) and ids, or None when a
    field breaks one."""
    fields = row.split("\t")
    counts, ids = [], []
    for field in fields[:13]:
        digits = field[1:] if field.startswith("-") else field
        if field and not (1 <= len(digits) <= 18 and all(c in "0123456789" for c in digits)):
            return None
        counts.append(int(field) if field else -1)
    for field in fields[13:]:
        if len(field) > 16 or not all(c in "0123456789abcdefABCDEF" for c in field):
            return None
        value = int(field, 16) if field else 0
        ids.append(value - (1 << 64) if value >= 1 << 63 else value)
    return counts, ids


def test_random_rows_parse_as_the_rules_say_field_by_field() -> None:
    """Fields of every length around the 8-digit windows the parser reads at once, in either
    case, with a byte that is no digit now and then: each row alone, and all valid ones at once."""
    rng = np.random.default_rng(5)
    stray = list("-xgG@`/: \x10\x80\xc1")
    valid = []
    for _ in range(400):
        fields = []
        for column in range(39):
            longest = 18 if column < 13 else 16
            length = int(rng.choice([0, 1, 2, 7, 8, 9, 15, 16, longest]))
            alphabet = list("0123456789") if column < 13 else list("0123456789abcdefABCDEF")
            text = "".join(rng.choice(alphabet, size=length))
            if column < 13 and text and rng.random() < 0.2:
                text = "-" + text
            fields.append(text)
        if rng.random() < 0.4:  # one fault: a stray byte, or one digit too many
            column = int(rng.integers(39))
            text = fields[column] or "1"
            if rng.random() < 0.5:
                at = int(rng.integers(len(text)))
                fields[column] = text[:at] + str(rng.choice(stray)) + text[at + 1 :]
            else:
                fields[column] = text.lstrip("-") + "1" * (19 if column < 13 else 17)
        row = "\t".join(fields)
        expected = _python_rules(row)
        if expected is None:
            with pytest.raises(RowError):
                parse_rows(row.encode("latin-1"), rows=1)
            continue
        parsed = parse_rows(row.encode("latin-1"), rows=1)
        assert parsed.counts[0].tolist() == expected[0] and parsed.ids[0].tolist() == expected[1], row
        valid.append((row, expected))
    assert len(valid) > 50
    together = parse_rows("\n".join(row for row, _ in valid).encode(), rows=len(valid))
    assert together.counts.tolist() == [counts for _, (counts, _) in valid]
    assert together.ids.tolist() == [ids for _, (_, ids) in valid]
