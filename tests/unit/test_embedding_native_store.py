"""The compiled embedding stage's load against its Python definition's, on the same files.

The C++ stage (``backends/embedding/store.cc``, ``hot_set.cc``) opens the row store and reads
the hot set as :func:`~export.stage.hot_cold_lookup.open_store` and
:func:`~export.stage.hot_cold_lookup.read_hot_ids` do. Its test driver
(``embedding_store_driver``) prints what it found, or the load error, as one JSON line; each case
here goes to both, and the answers must agree: the same tables, width, dtype, columns, fingerprint,
verified flag, check and bytes, or the same error text, word for word.

Stores come from :mod:`export.tables.row_store`'s writer (float32, float16, int8 with columns,
column names beyond ASCII), then are damaged or edited as a user or a disk would; hot sets from
:meth:`export.tables.hot_rows.HotSet.save` and from hand-made archives (ZIP64 records, a comment,
bytes before the archive, other dtypes, broken headers). Where the Python definition fails with an
exception of Python's own instead of its StageError (a broken ZIP archive), the compiled stage
says that exception's text in the StageError's frame. A seeded fuzz of hot-set files checks that
the driver never dies of a signal, whatever the bytes.

The driver is looked up in the compiled stages' build (``BUNDLE_STAGES_BUILD``, default
``build/stages``; ``make stages-sanitize`` points it at the ASan + UBSan build), brought up to date
there when that build is configured; without one the tests skip.
"""

from __future__ import annotations

import ast
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


def _same_store(driver: Path, path: Path | str, *options: str, verify: bool = True) -> dict[str, Any]:
    """The driver's and open_store's answers for the store at `path`, asserted equal."""
    ours = _native(driver, "--store", str(path), *options, *([] if verify else ["--no-verify"]))
    theirs = _python_store(Path(path), verify=verify)
    if "store" in ours and "store" in theirs:
        for answer in (ours, theirs):
            answer["store"]["check"] = _leading_words(answer["store"]["check"])
    assert ours == theirs
    return ours


def _python_hot_set(path: Path, tables: int) -> dict[str, Any]:
    """read_hot_ids' answer in the driver's words.

    Where it fails with an exception of Python's own (zipfile's BadZipFile, an EOFError, ...)
    rather than the stage's StageError, the compiled stage says that exception's text in the
    StageError's frame; ids of more than one dimension are refused by the Python definition when it
    builds its lookup, with the text given here.
    """
    try:
        sizes, ids = read_hot_ids(path, tables)
    except StageError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # the Python definition's load fails with this exception as it is
        return {"error": f"{path}: not a hot-set file ({exc})", "uncaught": type(exc).__name__}
    for table, array in enumerate(ids):
        if array.ndim != 1:
            return {"error": f"table {table}: hot ids must be 1-D, got shape {array.shape}"}
    return {"hot_set": {"table_sizes": list(sizes), "ids": [array.tolist() for array in ids]}}


def _same_hot_set(driver: Path, path: Path, tables: int = NUM_CATEGORICAL) -> dict[str, Any]:
    ours = _native(driver, "--hot-set", str(path), "--tables", str(tables))
    theirs = _python_hot_set(path, tables)
    theirs.pop("uncaught", None)
    assert ours == theirs
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


def test_the_path_is_named_as_pathlib_writes_it(driver: Path, chunked: Path) -> None:
    (chunked / META_FILE).unlink()
    for given in (f"{chunked}/", f"{chunked}//.", f"{chunked}/./"):
        answer = _native(driver, "--store", given)
        assert (
            answer
            == _python_store(Path(given))
            == {"error": f"no row store at {chunked}: store.json is missing"}
        )


# -- stores that do not load: the same text ----------------------------------------------------


def test_a_missing_or_foreign_description(driver: Path, tmp_path: Path, chunked: Path) -> None:
    assert _same_store(driver, tmp_path / "nowhere")["error"].endswith("store.json is missing")
    meta_path = chunked / META_FILE
    original = meta_path.read_text()
    for text in ("[1, 2]", '{"format": "other"}', '{"version": 1}', '"criteo-row-store"'):
        meta_path.write_text(text)
        assert _same_store(driver, chunked)["error"] == f"{meta_path} is not a row store description"
    for version in (2, "1", None, 0.5, [1]):
        meta_path.write_text(original)
        _edit_meta(chunked, _setting("version", version))
        assert "this stage reads version 1" in _same_store(driver, chunked)["error"]
    # Python's == takes 1.0 and true for 1: they load.
    for version in (1.0, True):
        meta_path.write_text(original)
        _edit_meta(chunked, _setting("version", version))
        assert _same_store(driver, chunked)["store"]["verified"]
    meta_path.write_text(original)
    _edit_meta(chunked, lambda meta: meta.pop("version"))
    assert _same_store(driver, chunked)["error"].endswith(
        "has row store format version None; this stage reads version 1"
    )


def test_an_unreadable_description(driver: Path, chunked: Path) -> None:
    meta_path = chunked / META_FILE
    # Not UTF-8: Path.read_text's UnicodeDecodeError, word for word.
    for raw in (b'{"a": "\xff"}', b'{"a": "\xe2\x82"}', b"\xef\xbb\xbf{}"):
        meta_path.write_bytes(raw)
        _same_store(driver, chunked)
    meta_path.unlink()
    meta_path.mkdir()
    assert "[Errno 21] Is a directory" in _same_store(driver, chunked)["error"]
    meta_path.rmdir()
    # Not JSON: json.loads' words, its positions in characters after newlines are translated.
    for text in (
        '{"format": ',
        '{"a": 1,}',
        "[1 2]",
        '\r\n\r\n{"é😀": "\\x"}',
        '{"a": "\\ud800\\u12"}',
        "",
        "nul",
    ):
        meta_path.write_text(text)
        assert _same_store(driver, chunked)["error"].startswith(f"cannot read {meta_path}: ")


def test_a_damaged_description_reads_as_json_loads_words_it(driver: Path, chunked: Path) -> None:
    """store.json damaged at random, character by character: the same error (or store), word for word."""
    meta_path = chunked / META_FILE
    originals = [meta_path.read_text(), json.dumps(json.loads(meta_path.read_text()))]
    # No NaN or Infinity: json.loads reads them, the compiled reader refuses them (a store.json
    # never holds them: its metadata are names and paths).
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
    assert (
        "7180 bytes, store.json says 7280 and its spec needs 7280 (truncated"
        in _same_store(driver, chunked)["error"]
    )
    rows_path.unlink()
    assert _same_store(driver, chunked)["error"] == f"cannot open {rows_path}: No such file or directory"


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
    assert "expected crc32" in edit(lambda meta: meta["checksums"].update(kind="md5"), False)
    assert "per 0 bytes; expected crc32" in edit(lambda meta: meta["checksums"].update(chunk_bytes=0), False)
    assert "29 checksums recorded, 7280 bytes need 8" in edit(
        lambda meta: meta["checksums"].update(chunk_bytes=1024), False
    )
    assert "(KeyError: 'kind')" in edit(lambda meta: meta["checksums"].pop("kind"), False)
    assert "(TypeError: 'int' object is not iterable)" in edit(
        lambda meta: meta["checksums"].update(values=3), False
    )
    assert edit(lambda meta: meta.update(checksums=[1])).endswith("'checksums' is not an object")


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
    for empty in (None, "", 0):
        _edit_meta(chunked, _setting("sha256", empty))
        answer = _same_store(driver, chunked)["store"]
        assert not answer["verified"] and answer["check"].startswith(
            "UNVERIFIED: store.json has no checksums"
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
    _same_store(driver, store)


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
    # Fewer tables asked for than the set has: the ids of those, then the count refused.
    assert _same_hot_set(driver, hot, 3)["error"] == f"{hot}: a hot set of 26 tables, the stage has 3"


def test_a_store_and_its_hot_set_in_one_call(driver: Path, tmp_path: Path) -> None:
    store = _write(tmp_path / "store", RowStoreSpec.for_dlrm(SIZES, WIDTH))
    hot = _hot_set(1).save(tmp_path / "hot.npz")
    answer = _native(driver, "--store", str(store), "--hot-set", str(hot), "--tables", "26")
    assert (
        answer["store"]["verified"] and answer["hot_set"] == _python_hot_set(hot, NUM_CATEGORICAL)["hot_set"]
    )


def test_archives_as_zipfile_reads_them(driver: Path, tmp_path: Path) -> None:
    members = _members()
    assert "hot_set" in _same_hot_set(driver, _zip64_archive(tmp_path / "zip64.npz", members))
    assert "hot_set" in _same_hot_set(
        driver, _archive(tmp_path / "comment.npz", members, comment=b"a comment " * 50)
    )
    assert "hot_set" in _same_hot_set(
        driver, _archive(tmp_path / "prefixed.npz", members, prefix=b"PK\x03\x04" + b"#!" * 300)
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


@pytest.mark.parametrize(
    "dtype", ["<i8", "<i4", "<u4", "<u8", ">i8", "|u1", "<i2", "|b1", "<f8", "<f4", "<f2"]
)
def test_ids_of_other_dtypes_read_as_int64(driver: Path, tmp_path: Path, dtype: str) -> None:
    members = _members()
    members["ids_C2.npy"] = _array([0, 1, 3] if dtype != "|b1" else [True, False], dtype)
    members["table_sizes.npy"] = _array(SIZES, dtype if dtype[1] in "iuf" and dtype != "|u1" else "<i8")
    _same_hot_set(driver, _archive(tmp_path / "hot.npz", members))


def test_hot_sets_that_do_not_load(driver: Path, tmp_path: Path) -> None:
    assert (
        _same_hot_set(driver, tmp_path / "missing.npz")["error"] == f"no hot-set file: {tmp_path}/missing.npz"
    )
    assert _same_hot_set(driver, tmp_path)["error"] == f"no hot-set file: {tmp_path}"
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(0).bytes(1000))
    assert _same_hot_set(driver, noise)["error"].endswith(
        "(Cannot load file containing pickled data when allow_pickle=False)"
    )
    members = _members()
    members.pop("ids_C2.npy")
    lacking = _archive(tmp_path / "lacking.npz", members)
    assert (
        _same_hot_set(driver, lacking)["error"]
        == f"{lacking}: not a hot-set file ('ids_C2 is not a file in the archive')"
    )
    assert _same_hot_set(driver, _archive(tmp_path / "three.npz", _members(3)), 3)["hot_set"]
    four = _archive(tmp_path / "four.npz", _members(3) | {"table_sizes.npy": _array(SIZES[:4])})
    assert _same_hot_set(driver, four, 3)["error"] == f"{four}: a hot set of 4 tables, the stage has 3"
    saved = _hot_set().save(tmp_path / "hot.npz").read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(saved[: len(saved) // 2])
    assert (
        _same_hot_set(driver, truncated)["error"]
        == f"{truncated}: not a hot-set file (File is not a zip file)"
    )
    (tmp_path / "empty.npz").write_bytes(b"")
    assert _same_hot_set(driver, tmp_path / "empty.npz")["error"].endswith("(No data left in file)")
    single = tmp_path / "single.npy"
    single.write_bytes(_array(SIZES))
    assert "does not support the context manager protocol" in _same_hot_set(driver, single)["error"]
    single.write_bytes(_array(SIZES)[:-20])  # numpy.fromfile reads what there is, then the shape fails
    assert _same_hot_set(driver, single)["error"].endswith(
        "(cannot reshape array of size 23 into shape (26,))"
    )
    # A member changed after the archive was written: zipfile's CRC check.
    damaged = bytearray(saved)
    damaged[saved.index(b"ids_C1.npy") + 60] ^= 1
    (tmp_path / "damaged.npz").write_bytes(bytes(damaged))
    assert _same_hot_set(driver, tmp_path / "damaged.npz")["error"].endswith(
        "(Bad CRC-32 for file 'ids_C1.npy')"
    )
    two_d = _archive(tmp_path / "two_d.npz", _members() | {"ids_C1.npy": _array([[0, 1], [2, 3]])})
    assert _same_hot_set(driver, two_d)["error"] == "table 0: hot ids must be 1-D, got shape (2, 2)"


@pytest.mark.parametrize(
    ("member", "version"),
    [
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", b"\0" * 16), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", b"\0" * 16), 1),  # data short
        (_npy("{'descr': '<i8', 'fortran_order': False}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), 'x': 1}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': 0, 'shape': (2,)}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': [2]}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2.0,)}"), 1),
        (_npy("{'descr': 'xyz', 'fortran_order': False, 'shape': (2,)}"), 1),
        (_npy("{'descr': '<i3', 'fortran_order': False, 'shape': (2,)}"), 1),
        (_npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,)}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (-2,)}"), 1),
        (_npy("['descr', 'fortran_order', 'shape']"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", b"\0" * 16, version=2), 2),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), } # é\n", b"\0" * 8, version=3), 3),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1,) x}", version=3), 3),
        (_npy("{'descr': \"<i8\", 'fortran_order': True, 'shape': (0x2,) ,}\n\n", b"\1" * 16), 1),
        (_npy("{'descr': u'<i8', 'fortran_order': False, 'shape': (+2, ),}", b"\1" * 16), 1),
        (_npy("{b'descr': '<i8', 'fortran_order': False, 'shape': (2,)}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': None, 'shape': (1, 1)}"), 1),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': ()}", b"\0" * 8), 1),
        (b"\x93NUMPY\x04\x00" + b"\0" * 10, 4),
        (b"\x93NUMPY\x01\x00\xff", 1),
        (b"\x93NUMPY\x01\x00\xff\x00{}", 1),
        (
            _npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", b"\0" * 16, version=3)[:-20]
            + b"\xff" * 4,
            3,
        ),
        (_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,)}" + " " * 10001), 1),
        (b"no npy magic", 0),
    ],
)
def test_member_headers_as_numpy_reads_them(
    driver: Path, tmp_path: Path, member: bytes, version: int
) -> None:
    """Each member's header and data refused (or read) with numpy's words."""
    members = _members() | {"ids_C4.npy": member}
    _same_hot_set(driver, _archive(tmp_path / "hot.npz", members))


def test_random_hot_set_files_never_crash_the_driver(driver: Path, tmp_path: Path) -> None:
    """Hundreds of files: real archives damaged byte by byte, cut, spliced, and random bytes.

    The driver answers each with one line and exit code 0 or 1, never a signal, and with the
    Python definition's answer: the same ids, or the same error text.
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
        ours = _native(driver, "--hot-set", str(path), "--tables", str(tables))
        theirs = _python_hot_set(path, tables)
        # Python's EOFError (a member cut short) has no text; the compiled stage says what ended.
        if theirs.pop("uncaught", None) != "EOFError":
            assert ours == theirs, case
        outcomes["read" if "hot_set" in ours else "refused"] += 1
        path.unlink()
    assert min(outcomes.values()) > 20, outcomes


#: What Python says of a .npy header that fails to parse, where numpy's own words cannot be had:
#: literal_eval's "malformed node or string" (naming an object's address), the tokenizer's errors
#: from numpy's Python-2 header filter (versions 1 and 2), and that filter's re-tokenized text.
PYTHON_PARSER_TEXTS = re.compile(r"malformed node or string|\('EOF in multi-line|Cannot parse header")


def test_random_member_headers_read_as_numpy_reads_them(driver: Path, tmp_path: Path) -> None:
    """Headers edited at random (the archive rebuilt around them, so their CRC-32s hold): numpy's
    answer, word for word, except where only Python's parser has words (then "Cannot parse header")."""
    pieces = [
        *"{}()[]:,'\"\\ #\n\t.-+_0123456789xobejJLTrueFalsNn<>|iu8fdescrhap",
        *(
            "True",
            "False",
            "None",
            "'<i8'",
            "(2,)",
            "'descr'",
            "'shape'",
            "'fortran_order'",
            "\\x41",
            "é",
            "\x00",
        ),
        *("0x1F", "1e3", "b'", "r'", "'''", "\\u00e9"),
    ]
    bases = [
        "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
        "{'descr': '|u1', 'fortran_order': True, 'shape': (3,)}",
        "{'shape': (4,), 'fortran_order': False, 'descr': '>i4'}",
    ]
    rng = np.random.default_rng(9)
    outcomes = {"read": 0, "same error": 0, "parser's words": 0, "numpy's dtype grammar": 0}
    for case in range(400):
        text = list(bases[case % len(bases)])
        for _ in range(int(rng.integers(0, 4))):  # none at times: a header that reads
            where, piece = int(rng.integers(0, len(text) + 1)), pieces[int(rng.integers(0, len(pieces)))]
            action = int(rng.integers(0, 3))
            if action == 0 and where < len(text):
                text[where] = piece
            elif action == 1:
                text.insert(where, piece)
            elif where < len(text):
                del text[where]
        version = 3 if rng.random() < 0.3 else int(rng.integers(1, 3))
        header = "".join(text) + " " * int(rng.integers(0, 5)) + "\n"
        if version < 3 and max(map(ord, header)) > 255:
            continue
        member = _npy(header, rng.bytes(64 if rng.random() < 0.8 else int(rng.integers(0, 40))), version)
        path = _archive(tmp_path / "hot.npz", _members(2) | {"ids_C2.npy": member})
        ours = _native(driver, "--hot-set", str(path), "--tables", "2")
        theirs = _python_hot_set(path, 2)
        theirs.pop("uncaught", None)
        if ours == theirs:
            outcomes["read" if "hot_set" in ours else "same error"] += 1
        elif _exotic_descr(header):
            assert ours["error"].startswith(
                f"{path}: not a hot-set file (descr is not a valid dtype descriptor: "
            )
            outcomes["numpy's dtype grammar"] += 1
        else:
            assert PYTHON_PARSER_TEXTS.search(theirs.get("error", "")), (header, ours, theirs)
            assert ours["error"] == f"{path}: not a hot-set file (Cannot parse header: {header!r})", (
                header,
                ours,
            )
            outcomes["parser's words"] += 1
    assert min(outcomes[key] for key in ("read", "same error", "parser's words")) > 10, outcomes
    assert outcomes["numpy's dtype grammar"] < 40, outcomes


def _exotic_descr(header: str) -> bool:
    """A header whose descr numpy's dtype() reads by its grammar of record and subarray types
    ("i8,", "(2,)i4", "2 i4", "1e3|u1"), which the compiled stage reads only as far as a count
    before a plain type ("5<i4"); it refuses the rest as invalid."""
    try:
        descr = ast.literal_eval(header.strip())["descr"]
    except Exception:  # not a dict with a descr: not this case
        return False
    return isinstance(descr, str) and bool(re.search(r"[,()\[\] ]", descr) or re.match(r"[<>|=]?\d", descr))
