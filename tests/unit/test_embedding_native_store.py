"""The compiled embedding stage's load beside its Python definition's, on the same files.

The C++ stage (``backends/embedding/store.cc``, ``hot_set.cc``, ``npz.cc``) opens the row store
and reads the hot set; its test driver (``embedding_store_driver``) prints what it found, or the
load error, as one JSON line. ``store.json`` is checked field by field, in the same order and in
the same words, by :func:`~export.stage.hot_cold_lookup.read_store_meta` (the one reader in
Python), so each store case goes to both and the answers must be equal: the same tables, width,
dtype, columns, fingerprint, verified flag, check and bytes, or the same error line (a text that
is not JSON is named so by both, each with its own parser's detail).

The hot set is read as ``numpy.savez`` writes it, and nothing else: each valid file reads as
:func:`~export.stage.hot_cold_lookup.read_hot_ids` (numpy) reads it, ids for ids; each file the
stage refuses gets one line naming the file and, for a member, the member and what is wrong in it.
Stores come from :mod:`export.tables.row_store`'s writer, hot sets from
:meth:`export.tables.hot_rows.HotSet.save` and from hand-made archives; seeded fuzzes damage both
and check that the driver answers every file with one line, never a signal, and reads nothing
numpy would read otherwise.

The driver is looked up in the compiled stages' build (``BUNDLE_STAGES_BUILD``, default
``build/stages``; ``make stages-sanitize`` points it at the ASan + UBSan build), brought up to date
there when that build is configured; without one the tests skip.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bundle.schema import NUM_CATEGORICAL
from export.stage import hot_cold_lookup as stage
from export.stage.hot_cold_lookup import StageError, open_store, read_hot_ids
from export.tables.hot_rows import HotSet
from export.tables.row_store import META_FILE, ROWS_FILE, RowStoreSpec, write_arrays
from server.installation import COMPILED_STAGES

DRIVER_TARGET = "embedding_store_driver"
SIZES = tuple(5 + t for t in range(NUM_CATEGORICAL))
WIDTH = 4
#: The check's rate, after its leading words (it differs from run to run).
RATE = r"\d+\.\d\d GB in \d+\.\d\d s(, \d+\.\d GB/s)?"


@pytest.fixture(scope="session")
def driver() -> Path:
    """The store driver of the configured build, brought up to date (its target only)."""
    build = COMPILED_STAGES
    if not (build / "CMakeCache.txt").is_file():
        pytest.skip(f"the compiled stages are not configured ({build}): run `make stages`")
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: the compiled stages cannot be brought up to date")
    command = ["cmake", "--build", str(build), "--target", DRIVER_TARGET, "--parallel", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return build / "embedding" / DRIVER_TARGET


def _native(driver: Path, *args: str) -> dict[str, Any]:
    """The driver's answer: one JSON line, exit code 0 with what it found, 1 with an error."""
    done = subprocess.run([str(driver), *args], capture_output=True, timeout=300)
    assert done.returncode in (0, 1), (args, done.returncode, done.stderr.decode(errors="replace")[-4000:])
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, (args, done.stdout)
    answer: dict[str, Any] = json.loads(lines[0])
    assert ("error" in answer) == (done.returncode == 1), answer
    return answer


def _python_store(path: Path, verify: bool = True) -> dict[str, Any]:
    """open_store's answer in the driver's words (an exception of Python's own is marked)."""
    try:
        store = open_store(path, verify=verify)
    except StageError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # the Python definition's load fails with this exception as it is
        return {"error": str(exc), "uncaught": type(exc).__name__}
    rows = (path / ROWS_FILE).read_bytes()
    return {
        "store": {
            "table_sizes": list(store.table_sizes),
            "rows": sum(store.table_sizes),
            "width": store.width,
            "dtype": store.dtype,
            "columns": [list(column) for column in store.columns],
            "row_bytes": store.data.shape[1] * store.data.itemsize,
            "size": len(rows),
            "fingerprint": store.fingerprint,
            "verified": store.verified,
            "check": store.check,
            "data_crc32": zlib.crc32(rows),
        }
    }


def _leading_words(check: str) -> str:
    """A check without its rate: "CRC-32 of 29 chunk(s) verified", "SHA-256 verified, ..."."""
    match = re.fullmatch(rf"(.*) \((?:older store; )?{RATE}\)", check)
    return match.group(1) if match else check


#: A text that is not JSON: each reader adds its own parser's detail in the brackets.
NOT_JSON = re.compile(r"(: not JSON) \(.*\)$")


def _same_store(driver: Path, path: Path | str, *options: str, verify: bool = True) -> dict[str, Any]:
    """The driver's and open_store's answers for the store at `path`, asserted equal (an error one
    line, the parsers' details of a text that is not JSON left out)."""
    ours = _native(driver, "--store", str(path), *options, *([] if verify else ["--no-verify"]))
    theirs = _python_store(Path(path), verify=verify)
    if "store" in ours and "store" in theirs:
        for answer in (ours, theirs):
            answer["store"]["check"] = _leading_words(answer["store"]["check"])
    for answer in (ours, theirs):
        if "error" in answer:
            assert "\n" not in answer["error"], answer
            answer["error"] = NOT_JSON.sub(r"\1", answer["error"])
    assert ours == theirs
    return ours


def _python_hot_set(path: Path, tables: int) -> dict[str, Any]:
    """read_hot_ids' answer in the driver's words."""
    try:
        sizes, ids = read_hot_ids(path, tables)
    except StageError as exc:
        return {"error": str(exc)}
    return {"hot_set": {"table_sizes": list(sizes), "ids": [array.tolist() for array in ids]}}


def _hot_set_answer(driver: Path, path: Path, tables: int = NUM_CATEGORICAL) -> dict[str, Any]:
    """The driver's answer for a hot set: what it read equals what numpy reads; an error is one
    line that names the file."""
    ours = _native(driver, "--hot-set", str(path), "--tables", str(tables))
    if "hot_set" in ours:
        assert ours == _python_hot_set(path, tables)
    else:
        assert ours["error"].startswith((f"{path}: ", f"no hot-set file: {path}")), ours
        assert "\n" not in ours["error"]
    return ours


def _refused(driver: Path, path: Path, reason: str, tables: int = NUM_CATEGORICAL) -> None:
    """The hot set at `path` refused by the stage for `reason`, and by the Python definition too."""
    assert _hot_set_answer(driver, path, tables) == {"error": f"{path}: not a hot-set file ({reason})"}
    assert "error" in _python_hot_set(path, tables)


def _same_hot_set(driver: Path, path: Path, tables: int = NUM_CATEGORICAL) -> dict[str, Any]:
    """The driver's and read_hot_ids' answers, asserted equal."""
    ours = _native(driver, "--hot-set", str(path), "--tables", str(tables))
    assert ours == _python_hot_set(path, tables)
    return ours


def _tables(spec: RowStoreSpec, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((size, spec.width)).astype(np.float32) for size in spec.table_sizes]


def _write(path: Path, spec: RowStoreSpec, seed: int = 0) -> Path:
    write_arrays(path, spec, _tables(spec, seed))
    return path


def _edit_meta(path: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """store.json of the store at `path`, changed by `edit` (in place)."""
    meta_path = path / META_FILE
    meta = json.loads(meta_path.read_text())
    edit(meta)
    meta_path.write_text(json.dumps(meta))


def _setting(key: str, value: Any) -> Callable[[dict[str, Any]], object]:
    """An edit of store.json: `key` set to `value`."""
    return lambda meta: meta.update({key: value})


@pytest.fixture
def chunked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A float32 store of 29 chunks of 256 bytes (7,280 bytes)."""
    monkeypatch.setattr(stage, "CHECKSUM_CHUNK_BYTES", 256)
    return _write(tmp_path / "chunked", RowStoreSpec.for_dlrm(SIZES, WIDTH))


# -- stores that load ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        RowStoreSpec.for_dlrm(SIZES, WIDTH),
        RowStoreSpec.for_dlrm(SIZES, 6, "float16"),
        RowStoreSpec.for_wide_deep(SIZES, 5, "int8"),
        RowStoreSpec.for_dlrm(SIZES, 8, "int8"),
        # Names beyond ASCII, quotes and controls: the fingerprint's canonical JSON escapes them.
        RowStoreSpec(SIZES, 5, "float32", {'é😀 "q"\\\n': (0, 2), "\u2028\x7f": (2, 4), "z": (4, 5)}),
    ],
    ids=["float32", "float16", "int8-wide-deep", "int8", "unicode-columns"],
)
def test_a_written_store_opens_as_the_python_stage_opens_it(
    driver: Path, tmp_path: Path, spec: RowStoreSpec
) -> None:
    store = _write(tmp_path / "store", spec)
    answer = _same_store(driver, store)
    assert answer["store"]["verified"] and answer["store"]["check"] == "CRC-32 of 1 chunk(s) verified"
    assert answer["store"]["fingerprint"] == json.loads((store / META_FILE).read_text())["fingerprint"]
    assert _same_store(driver, store, verify=False)["store"]["check"] == "content not checked"


def test_many_chunks_in_any_number_of_threads(driver: Path, chunked: Path) -> None:
    for threads in ("1", "3", "8", "0"):
        answer = _same_store(driver, chunked, "--threads", threads)
        assert answer["store"]["check"] == "CRC-32 of 29 chunk(s) verified"


def test_a_trailing_slash_is_left_out_of_the_names(driver: Path, chunked: Path) -> None:
    (chunked / META_FILE).unlink()
    answer = _native(driver, "--store", f"{chunked}//")
    assert answer == _python_store(Path(f"{chunked}//"))
    assert answer == {"error": f"no row store at {chunked}: store.json is missing"}


# -- stores that do not load: the same line ----------------------------------------------------


def test_a_missing_or_foreign_description(driver: Path, tmp_path: Path, chunked: Path) -> None:
    assert _same_store(driver, tmp_path / "nowhere")["error"].endswith("store.json is missing")
    meta_path = chunked / META_FILE
    original = meta_path.read_text()
    for text in ("[1, 2]", '{"format": "other"}', '{"version": 1}', '"criteo-row-store"'):
        meta_path.write_text(text)
        assert _same_store(driver, chunked)["error"] == f"{meta_path} is not a row store description"
    # The integer 1, nothing else: the value found shown as JSON.
    for version, shown in ((2, "2"), ("1", '"1"'), (None, "null"), (0.5, "0.5"), ([1], "[1]"),
                           (1.0, "1.0"), (True, "true")):  # fmt: skip
        meta_path.write_text(original)
        _edit_meta(chunked, _setting("version", version))
        assert _same_store(driver, chunked)["error"] == (
            f"{meta_path} has row store format version {shown}; this stage reads version 1"
        )
    meta_path.write_text(original)
    _edit_meta(chunked, lambda meta: meta.pop("version"))
    assert _same_store(driver, chunked)["error"].endswith(
        "has row store format version nothing; this stage reads version 1"
    )


def test_an_unreadable_description(driver: Path, chunked: Path) -> None:
    meta_path = chunked / META_FILE
    for raw in (b'{"a": "\xff"}', b'{"a": "\xe2\x82"}', b'{"a": "\xed\xa0\x80"}', b'"\xc0\xaf"'):
        meta_path.write_bytes(raw)
        assert _same_store(driver, chunked)["error"] == f"cannot read {meta_path}: not UTF-8 text"
    meta_path.unlink()
    meta_path.mkdir()
    assert _same_store(driver, chunked)["error"] == f"cannot read {meta_path}: Is a directory"
    meta_path.rmdir()
    for text in ('{"format": ', '{"a": 1,}', "[1 2]", '{"a": "\\x"}', "", "nul", "\ufeff{}", "[NaN]",
                 '{"a": Infinity}', "[01]"):  # fmt: skip
        meta_path.write_text(text)
        assert _same_store(driver, chunked)["error"] == f"cannot read {meta_path}: not JSON"


def test_a_damaged_description_is_refused_or_read_alike(driver: Path, chunked: Path) -> None:
    """store.json damaged at random, character by character: the same error line (or store)."""
    meta_path = chunked / META_FILE
    originals = [meta_path.read_text(), json.dumps(json.loads(meta_path.read_text()))]
    pieces = [*'{}[]:,"\\ -+.eE0123456789tfnulrasu\t\n\r\x01é😀', "\\u", "\\ud800", "\\udc00", "\ufeff"]
    rng = np.random.default_rng(5)
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(300):
        text = list(originals[case % 2])
        for _ in range(int(rng.integers(1, 4))):
            where, piece = int(rng.integers(0, max(1, len(text)))), pieces[int(rng.integers(0, len(pieces)))]
            action = int(rng.integers(0, 4))
            if action == 0 and text:
                text[where] = piece
            elif action == 1:
                text.insert(where, piece)
            elif action == 2 and text:
                del text[where]
            elif action == 3:
                text = text[:where]
        meta_path.write_text("".join(text), encoding="utf-8", errors="surrogatepass")
        outcomes["loaded" if "store" in _same_store(driver, chunked) else "refused"] += 1
    assert min(outcomes.values()) > 20, outcomes


def test_a_truncated_or_missing_rows_file(driver: Path, chunked: Path) -> None:
    rows_path = chunked / ROWS_FILE
    rows_path.write_bytes(rows_path.read_bytes()[:-100])
    assert _same_store(driver, chunked)["error"] == (
        f"{rows_path} has 7180 bytes, store.json says 7280 (truncated, or from another store)"
    )
    rows_path.unlink()
    assert _same_store(driver, chunked)["error"] == f"cannot open {rows_path}: No such file or directory"
    _edit_meta(chunked, _setting("file_bytes", 7000))
    assert _same_store(driver, chunked)["error"] == (
        f"{chunked / META_FILE}: file_bytes is 7000, its spec needs 7280"
    )


def test_a_flipped_bit_names_its_chunk(driver: Path, chunked: Path) -> None:
    rows_path = chunked / ROWS_FILE
    damaged = bytearray(rows_path.read_bytes())
    damaged[256 * 5 + 17] ^= 0x04
    damaged[256 * 20] ^= 0x01  # a later chunk too: the first is named
    rows_path.write_bytes(bytes(damaged))
    for threads in ("1", "3"):
        error = _same_store(driver, chunked, "--threads", threads)["error"]
        assert error == (
            f"{rows_path} is damaged: bytes 1280..1535 (chunk 6 of 29) do not match store.json "
            "(their CRC-32 differs)"
        )
    # The last chunk, shorter than the others.
    damaged = bytearray(
        _write(chunked.parent / "again", RowStoreSpec.for_dlrm(SIZES, WIDTH)).joinpath(ROWS_FILE).read_bytes()
    )
    damaged[-1] ^= 0x80
    (chunked.parent / "again" / ROWS_FILE).write_bytes(bytes(damaged))
    assert "bytes 7168..7279 (chunk 29 of 29)" in _same_store(driver, chunked.parent / "again")["error"]
    assert _same_store(driver, chunked.parent / "again", verify=False)["store"]["verified"] is False


def test_edited_checksums_and_fingerprint(driver: Path, chunked: Path) -> None:
    meta_path = chunked / META_FILE
    original = json.loads(meta_path.read_text())

    def edit(change: Callable[[dict[str, Any]], object], fingerprint: bool = True) -> str:
        meta = json.loads(json.dumps(original))
        change(meta)
        if not fingerprint:
            meta.pop("fingerprint", None)
        meta_path.write_text(json.dumps(meta))
        return str(_same_store(driver, chunked).get("error", ""))

    assert edit(lambda meta: meta.update(fingerprint="0" * 64)).endswith("(edited by hand?)")
    assert edit(lambda meta: meta.update(fingerprint=5)).endswith("(edited by hand?)")
    assert edit(lambda meta: meta["checksums"]["values"].__setitem__(3, 1)).endswith("(edited by hand?)")

    def refingerprinted(meta: dict[str, Any]) -> None:
        meta["checksums"]["values"][3] ^= 1
        meta["fingerprint"] = stage.store_fingerprint(meta["spec"], meta["checksums"])

    assert "(chunk 4 of 29)" in edit(refingerprinted)
    # Without a recorded fingerprint the recomputed one stands; the checksums are still checked.
    assert edit(lambda meta: None, fingerprint=False) == ""
    where = f"{meta_path}: "
    assert edit(lambda meta: meta["checksums"].update(kind="md5"), False) == (
        where + 'checksums.kind must be "crc32", got "md5"'
    )
    assert edit(lambda meta: meta["checksums"].pop("kind"), False) == (
        where + 'checksums.kind must be "crc32", got nothing'
    )
    assert edit(lambda meta: meta["checksums"].update(chunk_bytes=0), False) == (
        where + "checksums.chunk_bytes must be an integer >= 1, got 0"
    )
    assert "29 checksums recorded, 7280 bytes need 8" in edit(
        lambda meta: meta["checksums"].update(chunk_bytes=1024), False
    )
    assert edit(lambda meta: meta["checksums"].update(values=3), False) == (
        where + "checksums.values must be a list of CRC-32s (integers 0 to 4294967295), got 3"
    )
    # A long value is cut at 60 characters.
    bad = [-1, *original["checksums"]["values"][1:]]
    shown = json.dumps(bad, separators=(",", ":"))[:57] + "..."
    assert edit(lambda meta: meta["checksums"].update(values=bad), False) == (
        where + f"checksums.values must be a list of CRC-32s (integers 0 to 4294967295), got {shown}"
    )
    assert edit(lambda meta: meta.update(checksums=[1])) == where + "checksums must be an object, got [1]"


def test_older_stores_check_their_sha256_or_load_unverified(driver: Path, chunked: Path) -> None:
    _edit_meta(chunked, lambda meta: [meta.pop(key) for key in ("checksums", "fingerprint")])
    answer = _same_store(driver, chunked)["store"]
    assert answer["verified"] and answer["check"] == "SHA-256 verified, no chunk checksums"
    rows_path = chunked / ROWS_FILE
    damaged = bytearray(rows_path.read_bytes())
    damaged[7] ^= 0x80
    rows_path.write_bytes(bytes(damaged))
    assert (
        _same_store(driver, chunked)["error"]
        == f"{rows_path} is damaged: it does not match the SHA-256 in store.json"
    )
    for empty in (None, ""):
        _edit_meta(chunked, _setting("sha256", empty))
        answer = _same_store(driver, chunked)["store"]
        assert not answer["verified"] and answer["check"].startswith(
            "UNVERIFIED: store.json has no checksums"
        )
    _edit_meta(chunked, _setting("sha256", 0))
    assert _same_store(driver, chunked)["error"] == f"{chunked / META_FILE}: sha256 must be a string, got 0"


def test_spec_fields_are_named_with_what_they_must_be(driver: Path, chunked: Path) -> None:
    meta_path = chunked / META_FILE
    original = meta_path.read_text()
    cases = [
        (("spec",), [1], "spec must be an object, got [1]"),
        (("spec", "table_sizes"), [5, 0], "spec.table_sizes must be a list of integers >= 1, got [5,0]"),
        (("spec", "table_sizes"), [], "spec.table_sizes must be a list of integers >= 1, got []"),
        (("spec", "table_sizes"), [5.0], "spec.table_sizes must be a list of integers >= 1, got [5.0]"),
        (("spec", "table_sizes"), [2**63], f"spec.table_sizes must be a list of integers >= 1, got [{2**63}]"),  # noqa: E501
        (("spec", "width"), "4", 'spec.width must be an integer >= 1, got "4"'),
        (("spec", "width"), True, "spec.width must be an integer >= 1, got true"),
        (("spec", "dtype"), "float64", 'spec.dtype must be one of float32, float16, int8, got "float64"'),
        (("spec", "table_sizes"), [2**62] * 2, f"its spec needs {2**67} bytes, more than a file can hold"),
    ]  # fmt: skip
    for path, value, line in cases:
        meta_path.write_text(original)

        def edit(meta: dict[str, Any], path: tuple[str, ...] = path, value: Any = value) -> None:
            parent = meta
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value

        _edit_meta(chunked, edit)
        assert _same_store(driver, chunked)["error"] == f"{meta_path}: {line}"
    meta_path.write_text(original)
    _edit_meta(chunked, lambda meta: meta["spec"].pop("width"))
    assert (
        _same_store(driver, chunked)["error"]
        == f"{meta_path}: spec.width must be an integer >= 1, got nothing"
    )


@pytest.mark.parametrize(
    "columns",
    [
        {"a": [0, 2], "b": [3, 5]},  # a gap
        {"a": [0, 3], "b": [2, 5]},  # an overlap
        {"a": [0, 6]},  # past the row's end
        {"a": [2, 2], "b": [0, 2], "c": [2, 5]},  # an empty column
        {"a": [0, "x"]},
        {"a": 5},
        {"a": [0, 1, 2]},
        {"a": [0]},
        {"a": None},
        {"a": "05"},
        [[0, 5]],
        [["a", [0, 5]], ["b", [0, 5]]],
        [[1, 2, 3]],
        [5],
        "ab",
        7,
        [[[0], 5]],
        {"a": [" 0 ", "٥"]},
        {"a": [True, 5.9]},
    ],
)
def test_invalid_columns(driver: Path, tmp_path: Path, columns: Any) -> None:
    store = _write(tmp_path / "store", RowStoreSpec.for_wide_deep(SIZES, 4, "int8"))

    def edit(meta: dict[str, Any]) -> None:
        meta["spec"]["columns"] = columns
        meta["fingerprint"] = stage.store_fingerprint(meta["spec"], meta["checksums"])

    _edit_meta(store, edit)
    assert f"{store / META_FILE}: spec.columns " in _same_store(driver, store)["error"]


#: Values a hand-edited store.json might hold where a field's belongs.
FIELD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 5, 26, 7280, 7280.0, 1.5, -0.0, 2.5e-7, 1e18, "", "x", "12", " 4 ",
    "1_0", "٣", "float32", "float16", "int8", "é😀\n", [], [1], [0, 4], [[0, 4]], ["ab"], [0, "4"],
    [None], {}, {"a": 1}, {"a": [0, 4]}, {"a": [0, 2], "b": [2, 4]}, {"a": "04"}, {"a": [0, 4, 5]},
    {"a": None}, [[1, 2, 3]], list(SIZES), [7280], {"kind": "crc32"},
]  # fmt: skip
#: The fields they land in.
FIELDS: list[tuple[str, ...]] = [
    ("spec",), ("spec", "table_sizes"), ("spec", "width"), ("spec", "dtype"), ("spec", "columns"),
    ("spec", "columns", "embedding"), ("version",), ("format",), ("file_bytes",), ("checksums",),
    ("checksums", "kind"), ("checksums", "chunk_bytes"), ("checksums", "values"), ("fingerprint",),
    ("sha256",), ("spec", "table_sizes", "3"),
]  # fmt: skip


def test_store_json_fields_edited_at_random(driver: Path, chunked: Path) -> None:
    """Each field of store.json replaced or removed, a few at a time: the same outcome and text."""
    meta_path = chunked / META_FILE
    original = json.loads(meta_path.read_text())
    rng = np.random.default_rng(11)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(300):
        meta = json.loads(json.dumps(original))
        for _ in range(int(rng.integers(1, 4))):
            path = FIELDS[int(rng.integers(0, len(FIELDS)))]
            parent: Any = meta
            for key in path[:-1]:
                parent = (
                    parent[int(key)]
                    if isinstance(parent, list)
                    else parent.get(key)
                    if isinstance(parent, dict)
                    else None
                )
            if isinstance(parent, list) and int(path[-1]) < len(parent):
                parent[int(path[-1])] = FIELD_VALUES[int(rng.integers(0, len(FIELD_VALUES)))]
            elif isinstance(parent, dict):
                if rng.random() < 0.2:
                    parent.pop(path[-1], None)
                else:
                    parent[path[-1]] = FIELD_VALUES[int(rng.integers(0, len(FIELD_VALUES)))]
        if (
            rng.random() < 0.5
            and isinstance(meta.get("checksums"), dict)
            and isinstance(meta.get("spec"), dict)
        ):
            meta["fingerprint"] = stage.store_fingerprint(meta["spec"], meta["checksums"])
        meta_path.write_text(json.dumps(meta))
        answer = _same_store(driver, chunked)
        outcomes["loaded" if "store" in answer else "refused"] += 1
    assert min(outcomes.values()) > 20, outcomes


# -- hot sets -----------------------------------------------------------------------------------


def _hot_set(seed: int = 0) -> HotSet:
    rng = np.random.default_rng(seed)
    ids = [rng.permutation(size)[: int(rng.integers(0, size))] for size in SIZES]
    return HotSet(
        table_sizes=SIZES,
        row_bytes=(16,) * NUM_CATEGORICAL,
        budget_bytes=10**6,
        ids=tuple(ids),
        counts=tuple(np.arange(len(table), 0, -1) for table in ids),
        profiled_lookups=1000,
    )


def _npy(header: str, data: bytes = b"", version: int = 1) -> bytes:
    """A .npy member with the header text given (numpy pads it; no need here)."""
    raw = header.encode("latin1" if version < 3 else "utf8")
    return (
        b"\x93NUMPY"
        + bytes([version, 0])
        + struct.pack("<H" if version == 1 else "<I", len(raw))
        + raw
        + data
    )


def _array(values: Any, dtype: str = "<i8") -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(values, dtype=dtype))
    return buffer.getvalue()


def _members(tables: int = NUM_CATEGORICAL, dtype: str = "<i8") -> dict[str, bytes]:
    members = {"table_sizes.npy": _array(SIZES[:tables], dtype)}
    members |= {f"ids_C{t + 1}.npy": _array([t % 5, 4], dtype) for t in range(tables)}
    return members


def _archive(path: Path, members: dict[str, bytes], comment: bytes = b"", prefix: bytes = b"") -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.comment = comment
    path.write_bytes(prefix + buffer.getvalue())
    return path


def _zip64_archive(path: Path, members: dict[str, bytes]) -> Path:
    """An archive whose central directory keeps every size and offset in ZIP64 extra fields, with
    a ZIP64 end record (as an archive of members over 4 GiB has them)."""
    out, central = bytearray(), bytearray()
    for name, data in members.items():
        raw, crc, offset = name.encode(), zlib.crc32(data), len(out)
        local_extra = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        out += struct.pack(
            "<4s2B4HL2L2H",
            b"PK\x03\x04",
            45,
            0,
            0,
            0,
            0,
            0,
            crc,
            0xFFFFFFFF,
            0xFFFFFFFF,
            len(raw),
            len(local_extra),
        )
        out += raw + local_extra + data
        extra = struct.pack("<HHQQQ", 1, 24, len(data), len(data), offset)
        central += struct.pack(
            "<4s4B4HL2L5H2L", b"PK\x01\x02", 45, 3, 45, 0, 0, 0, 0, 0, crc,
            0xFFFFFFFF, 0xFFFFFFFF, len(raw), len(extra), 0, 0, 0, 0, 0xFFFFFFFF,
        )  # fmt: skip
        central += raw + extra
    start, count = len(out), len(members)
    out += central
    end64 = len(out)
    out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(central), start)
    out += struct.pack("<4sLQL", b"PK\x06\x07", 0, end64, 1)
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    path.write_bytes(bytes(out))
    return path


def test_a_saved_hot_set_reads_as_the_python_stage_reads_it(driver: Path, tmp_path: Path) -> None:
    hot = _hot_set().save(tmp_path / "hot.npz")
    answer = _same_hot_set(driver, hot)
    assert answer["hot_set"]["ids"][0] == _hot_set().ids[0].tolist()
    assert _same_hot_set(driver, hot, 3)["error"] == f"{hot}: a hot set of 26 tables, the stage has 3"


def test_a_store_and_its_hot_set_in_one_call(driver: Path, tmp_path: Path) -> None:
    store = _write(tmp_path / "store", RowStoreSpec.for_dlrm(SIZES, WIDTH))
    hot = _hot_set(1).save(tmp_path / "hot.npz")
    answer = _native(driver, "--store", str(store), "--hot-set", str(hot), "--tables", "26")
    assert (
        answer["store"]["verified"] and answer["hot_set"] == _python_hot_set(hot, NUM_CATEGORICAL)["hot_set"]
    )


def test_archives_as_numpy_writes_them(driver: Path, tmp_path: Path) -> None:
    members = _members()
    assert "hot_set" in _same_hot_set(driver, _zip64_archive(tmp_path / "zip64.npz", members))
    assert "hot_set" in _same_hot_set(
        driver, _archive(tmp_path / "comment.npz", members, comment=b"a comment " * 50)
    )
    # Members named without .npy, and repeated names (the last one counts).
    renamed = {name.removesuffix(".npy"): data for name, data in members.items()}
    assert "hot_set" in _same_hot_set(driver, _archive(tmp_path / "bare.npz", renamed))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, pytest.warns(UserWarning, match="Duplicate name"):
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("ids_C3.npy", _array([9, 8, 7]))
    (tmp_path / "repeated.npz").write_bytes(buffer.getvalue())
    assert _same_hot_set(driver, tmp_path / "repeated.npz")["hot_set"]["ids"][2] == [9, 8, 7]
    # Bytes before the archive (which numpy never writes): its offsets no longer hold.
    prefixed = _archive(tmp_path / "prefixed.npz", members, prefix=b"#!" * 300)
    error = _hot_set_answer(driver, prefixed)["error"]
    assert error.startswith(f"{prefixed}: not a hot-set file (the central directory (")
    assert error.endswith("): bytes added to the archive, or a damaged end record)")


@pytest.mark.parametrize("dtype", ["<i8", "<i4", "<u4", "<u8", ">i8", "|u1", "|i1", "<i2", ">u2"])
def test_ids_of_any_integer_dtype_read_as_int64(driver: Path, tmp_path: Path, dtype: str) -> None:
    members = _members()
    members["ids_C2.npy"] = _array([0, 1, 3], dtype)
    members["table_sizes.npy"] = _array(SIZES, dtype if dtype[1:] not in ("u1", "i1") else "<i8")
    assert _same_hot_set(driver, _archive(tmp_path / "hot.npz", members))["hot_set"]["ids"][1] == [0, 1, 3]


@pytest.mark.parametrize("dtype", ["|b1", "<f8", "<f4", "<f2", "<c8", "<U3"])
def test_ids_of_other_dtypes_are_refused_naming_the_dtype(driver: Path, tmp_path: Path, dtype: str) -> None:
    members = _members()
    members["ids_C2.npy"] = _array([0, 1] if dtype != "<U3" else ["a", "b"], dtype)
    path = _archive(tmp_path / "hot.npz", members)
    reason = f"member ids_C2.npy: dtype '{dtype}', expected integers (a numpy int or uint dtype)"
    assert _same_hot_set(driver, path) == {"error": f"{path}: not a hot-set file ({reason})"}


def test_hot_sets_that_do_not_load(driver: Path, tmp_path: Path) -> None:
    assert (
        _same_hot_set(driver, tmp_path / "missing.npz")["error"] == f"no hot-set file: {tmp_path}/missing.npz"
    )
    assert _same_hot_set(driver, tmp_path)["error"] == f"no hot-set file: {tmp_path} is not a file"
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(0).bytes(1000))
    _refused(driver, noise, "no ZIP end record: not a .npz archive")
    members = _members()
    members.pop("ids_C2.npy")
    lacking = _archive(tmp_path / "lacking.npz", members)
    assert _same_hot_set(driver, lacking)["error"] == f"{lacking}: not a hot-set file (no member ids_C2.npy)"
    assert _same_hot_set(driver, _archive(tmp_path / "three.npz", _members(3)), 3)["hot_set"]
    four = _archive(tmp_path / "four.npz", _members(3) | {"table_sizes.npy": _array(SIZES[:4])})
    assert _same_hot_set(driver, four, 3)["error"] == f"{four}: a hot set of 4 tables, the stage has 3"
    saved = _hot_set().save(tmp_path / "hot.npz").read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(saved[: len(saved) // 2])
    _refused(driver, truncated, "no ZIP end record: not a .npz archive")
    (tmp_path / "empty.npz").write_bytes(b"")
    _refused(driver, tmp_path / "empty.npz", "the file is empty")
    single = tmp_path / "single.npy"
    single.write_bytes(_array(SIZES))
    _refused(driver, single, "a single .npy array, not the .npz archive numpy.savez writes")
    # A member changed after the archive was written: its CRC-32.
    damaged = bytearray(saved)
    damaged[saved.index(b"ids_C1.npy") + 60] ^= 1
    (tmp_path / "damaged.npz").write_bytes(bytes(damaged))
    _refused(
        driver,
        tmp_path / "damaged.npz",
        "member ids_C1.npy is damaged (its CRC-32 differs from the archive's)",
    )
    two_d = _archive(tmp_path / "two_d.npz", _members() | {"ids_C1.npy": _array([[0, 1], [2, 3]])})
    assert _same_hot_set(driver, two_d)["error"] == (
        f"{two_d}: not a hot-set file (member ids_C1.npy: shape (2, 2), expected one dimension)"
    )
    big = _archive(tmp_path / "big.npz", _members() | {"ids_C1.npy": _array([1, 2**63], "<u8")})
    assert _same_hot_set(driver, big)["error"] == (
        f"{big}: not a hot-set file (member ids_C1.npy: value {2**63} at position 1 does not fit an int64)"
    )
    compressed = tmp_path / "compressed.npz"
    np.savez_compressed(
        compressed, table_sizes=np.asarray(SIZES), **{f"ids_C{t + 1}": [0] for t in range(26)}
    )
    assert _same_hot_set(driver, compressed)["error"] == (
        f"{compressed}: not a hot-set file (member table_sizes.npy is compressed: save the hot set with "
        "numpy.savez, not savez_compressed)"
    )


#: numpy's header of ids_C4 (two int64 values), as it writes it: "{'descr': '<i8', ...}" padded.
GOOD_HEADER = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }"


#: How a refused .npy header starts its line.
NOT_NUMPYS = "its .npy header is not one numpy writes: "


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (_npy(GOOD_HEADER + " " * 5 + "\n", b"\0" * 16), None),
        (_npy(GOOD_HEADER + "\n", b"\0" * 16, version=2), None),
        (_npy(GOOD_HEADER + "\n", b"\0" * 16, version=3), None),
        (_npy("{'descr': '<i8', 'fortran_order': True, 'shape': (2,), }\n", b"\1" * 16), None),
        (_npy(GOOD_HEADER + "\n", b"\0" * 8), "its header says 2 values of 8 bytes, its data hold 8 bytes"),
        (_npy(GOOD_HEADER + "\n", b"\0" * 24), "its header says 2 values of 8 bytes, its data hold 24 bytes"),
        (
            _npy("{'descr': '<i8', 'fortran_order': False}\n"),
            NOT_NUMPYS + "\"{'descr': '<i8', 'fortran_order': False}\\x0a\"",
        ),
        (
            _npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,)}\n"),
            NOT_NUMPYS + "\"{'descr': '<i8', 'fortran_order': False, 'shape': (2,)}\\x0a\"",
        ),
        (
            _npy("{'shape': (2,), 'fortran_order': False, 'descr': '<i8', }\n"),
            NOT_NUMPYS + "\"{'shape': (2,), 'fortran_order': False, 'descr': '<i8', }\\x0a\"",
        ),
        (
            _npy(GOOD_HEADER, b"\0" * 16),
            NOT_NUMPYS + "\"{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }\"",
        ),
        (
            _npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2), }\n"),
            NOT_NUMPYS + "\"{'descr': '<i8', 'fortran_order': False, 'shape': (2), }\\x0a\"",
        ),
        (
            _npy("{'descr': '<i3', 'fortran_order': False, 'shape': (2,), }\n"),
            "dtype '<i3', expected integers (a numpy int or uint dtype)",
        ),
        (
            _npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }\n"),
            "dtype '|O', expected integers (a numpy int or uint dtype)",
        ),
        (
            _npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2), }\n", b"\0" * 16),
            "shape (1, 2), expected one dimension",
        ),
        (
            _npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }\n", b"\0" * 8),
            "shape (), expected one dimension",
        ),
        (b"\x93NUMPY\x04\x00" + b"\0" * 10, ".npy format version 4.0 (numpy writes 1.0, 2.0 and 3.0)"),
        (b"\x93NUMPY\x01\x00\xff", "the .npy array ends inside its preamble"),
        (b"\x93NUMPY\x01\x00\xff\x00{}", "its .npy header of 255 bytes runs past the member's 12 bytes"),
        (b"no npy magic", "not a .npy array (it does not start with numpy's magic \\x93NUMPY)"),
    ],
)
def test_member_headers_numpy_writes_and_no_others(
    driver: Path, tmp_path: Path, member: bytes, reason: str | None
) -> None:
    """A member in numpy's layout reads as numpy reads it; any other is refused, saying what is wrong."""
    path = _archive(tmp_path / "hot.npz", _members() | {"ids_C4.npy": member})
    if reason is None:
        assert "hot_set" in _same_hot_set(driver, path)
    else:
        assert _hot_set_answer(driver, path) == {
            "error": f"{path}: not a hot-set file (member ids_C4.npy: {reason})"
        }


def test_random_hot_set_files_never_crash_the_driver(driver: Path, tmp_path: Path) -> None:
    """Hundreds of files: real archives damaged byte by byte, cut, spliced, and random bytes.

    The driver answers each with one line and exit code 0 or 1, never a signal; what it reads,
    numpy reads the same; what numpy refuses, it refuses.
    """
    rng = np.random.default_rng(2024)
    saved = _hot_set().save(tmp_path / "hot.npz").read_bytes()
    small = _archive(tmp_path / "small.npz", _members(2)).read_bytes()
    zip64 = _zip64_archive(tmp_path / "zip64.npz", _members(2)).read_bytes()
    seeds = [saved, small, zip64]
    outcomes = {"read": 0, "refused": 0}
    for case in range(400):
        data = bytearray(seeds[case % len(seeds)])
        action = int(rng.integers(0, 6))
        if action == 0:  # bytes flipped anywhere
            for _ in range(int(rng.integers(1, 8))):
                data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        elif action == 1:  # bytes flipped in the directories and headers (the file's structure)
            for _ in range(int(rng.integers(1, 4))):
                marks = [
                    m.start() for m in re.finditer(rb"PK(\x01\x02|\x03\x04|\x05\x06|\x06\x06|\x06\x07)", data)
                ]
                where = marks[int(rng.integers(0, len(marks)))] + int(rng.integers(0, 60))
                if where < len(data):
                    data[where] = int(rng.integers(0, 256))
        elif action == 2:  # cut
            data = data[: int(rng.integers(0, len(data)))]
        elif action == 3:  # a slice removed or repeated
            start = int(rng.integers(0, len(data)))
            stop = start + int(rng.integers(1, 200))
            data = data[:start] + (data[start:stop] * 2 if rng.random() < 0.5 else b"") + data[stop:]
        elif action == 4:  # random bytes, sometimes behind a ZIP signature
            data = bytearray(rng.bytes(int(rng.integers(0, 3000))))
            if rng.random() < 0.5:
                data[:4] = b"PK\x03\x04"
                data[-22:-18] = b"PK\x05\x06" if len(data) >= 26 else data[-22:-18]
        else:  # fields of the end records set to extremes
            for offset in (
                len(data) - 22 + int(rng.integers(4, 22)),
                len(data) - 98 + int(rng.integers(0, 76)),
            ):
                if 0 <= offset < len(data):
                    data[offset] = 0xFF if rng.random() < 0.5 else 0x00
        path = tmp_path / f"case{case}.npz"
        path.write_bytes(bytes(data))
        tables = 2 if case % len(seeds) else NUM_CATEGORICAL
        ours = _hot_set_answer(driver, path, tables)
        if "error" in _python_hot_set(path, tables):
            assert "error" in ours, case
        outcomes["read" if "hot_set" in ours else "refused"] += 1
        path.unlink()
    assert min(outcomes.values()) > 20, outcomes


def test_random_member_headers_never_read_otherwise_than_numpy(driver: Path, tmp_path: Path) -> None:
    """numpy's own headers of random integer arrays, edited at random (the archive rebuilt around
    them, so their CRC-32s hold): an unedited one reads as numpy reads it, an edited one reads the
    same or is refused naming the member."""
    pieces = [
        *"{}()[]:,'\" #\n\t.-+_0123456789xobejJLTrueFalsNn<>|iu8fdescrhap",
        "True",
        "'<i8'",
        "(2,)",
        "é",
    ]
    rng = np.random.default_rng(9)
    outcomes = {"read": 0, "edited, read": 0, "refused": 0}
    for case in range(300):
        dtype = ["<i8", "<i4", ">u2", "|u1", "<u8"][case % 5]
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, rng.integers(0, 100, int(rng.integers(0, 6))).astype(dtype))
        raw = buffer.getvalue()
        length = struct.unpack("<H", raw[8:10])[0]
        header, data = raw[10 : 10 + length].decode("latin1"), raw[10 + length :]
        edits = int(rng.integers(0, 3))
        text = list(header)
        for _ in range(edits):
            where, piece = int(rng.integers(0, len(text))), pieces[int(rng.integers(0, len(pieces)))]
            if rng.random() < 0.5:
                text[where] = piece
            else:
                text.insert(where, piece)
        edited = "".join(text)
        version = 3 if max(map(ord, edited)) > 255 else 1
        member = _npy(edited, data, version)
        path = _archive(tmp_path / "hot.npz", _members(2) | {"ids_C2.npy": member})
        ours = _hot_set_answer(driver, path, 2)
        if not edits:
            assert "hot_set" in ours, header
            outcomes["read"] += 1
        elif "hot_set" in ours:
            outcomes["edited, read"] += 1
        else:
            assert ours["error"].startswith(f"{path}: not a hot-set file (member ids_C2.npy: "), ours
            outcomes["refused"] += 1
    assert outcomes["read"] > 50 and outcomes["refused"] > 50, outcomes
