"""The row store's chunk checksums and fingerprint: written with the store, verified by the stage."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ExportError
from bundle.schema import NUM_CATEGORICAL
from export.stage import hot_cold_lookup as stage
from export.stage.hot_cold_lookup import (
    ChunkChecksums,
    HotColdLookup,
    StageError,
    open_store,
    store_fingerprint,
)
from export.tables.row_store import (
    META_FILE,
    ROWS_FILE,
    RowStoreSpec,
    RowStoreWriter,
    verify_checksums,
    write_arrays,
)

SIZES = tuple(5 + t for t in range(NUM_CATEGORICAL))
WIDTH = 4


def _tables(spec: RowStoreSpec, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((size, spec.width)).astype(np.float32) for size in spec.table_sizes]


def _hot_set(path: Path) -> Path:
    arrays = {"table_sizes": np.asarray(SIZES, dtype=np.int64)}
    arrays |= {f"ids_C{t + 1}": np.asarray([0, 2], dtype=np.int64) for t in range(NUM_CATEGORICAL)}
    np.savez(path, **arrays)
    return path


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    spec = RowStoreSpec.for_dlrm(SIZES, WIDTH)
    write_arrays(tmp_path / "store", spec, _tables(spec))
    return tmp_path / "store"


def test_chunk_checksums_match_zlib_over_any_piece_sizes() -> None:
    data = np.random.default_rng(1).bytes(1000)
    whole = ChunkChecksums(chunk_bytes=300)
    whole.update(data)
    pieces = ChunkChecksums(chunk_bytes=300)
    for start in range(0, 1000, 7):
        pieces.update(data[start : start + 7])
    expected = [zlib.crc32(data[start : start + 300]) for start in range(0, 1000, 300)]
    assert whole.values() == pieces.values() == expected
    assert whole.to_json() == {"kind": "crc32", "chunk_bytes": 300, "values": expected}


def test_store_json_records_checksums_and_fingerprint(store_dir: Path) -> None:
    meta = json.loads((store_dir / META_FILE).read_text())
    rows = (store_dir / ROWS_FILE).read_bytes()
    checksums = meta["checksums"]
    assert checksums == {
        "kind": "crc32",
        "chunk_bytes": stage.CHECKSUM_CHUNK_BYTES,
        "values": [zlib.crc32(rows)],
    }
    assert meta["fingerprint"] == store_fingerprint(meta["spec"], checksums)
    assert verify_checksums(store_dir) >= 0.0
    opened = open_store(store_dir)
    assert opened.verified and opened.fingerprint == meta["fingerprint"] and "CRC-32" in opened.check


def test_out_of_order_writes_get_the_same_checksums(tmp_path: Path, store_dir: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, WIDTH)
    tables = _tables(spec)
    with RowStoreWriter(tmp_path / "reversed", spec, digest=False) as writer:
        for table in reversed(range(NUM_CATEGORICAL)):
            writer.write(table, 0, tables[table])
    ours = json.loads((tmp_path / "reversed" / META_FILE).read_text())
    theirs = json.loads((store_dir / META_FILE).read_text())
    assert ours["sha256"] is None
    assert ours["checksums"] == theirs["checksums"] and ours["fingerprint"] == theirs["fingerprint"]


def test_many_chunks_in_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage, "CHECKSUM_CHUNK_BYTES", 256)
    spec = RowStoreSpec.for_dlrm(SIZES, WIDTH)
    write_arrays(tmp_path / "store", spec, _tables(spec))
    meta = json.loads((tmp_path / "store" / META_FILE).read_text())
    assert len(meta["checksums"]["values"]) == -(-spec.total_bytes // 256)
    for threads in (1, 3):
        verify_checksums(tmp_path / "store", threads=threads)
    rows_path = tmp_path / "store" / ROWS_FILE
    damaged = bytearray(rows_path.read_bytes())
    damaged[256 * 5 + 17] ^= 0x04
    rows_path.write_bytes(bytes(damaged))
    for threads in (1, 3):
        with pytest.raises(StageError, match=r"rows.bin is damaged: bytes 1280\.\.1535 \(chunk 6 of 29\)"):
            stage.verify_checksums(rows_path, meta["checksums"], spec.total_bytes, threads=threads)


def test_a_flipped_bit_fails_the_stage_naming_the_file(store_dir: Path) -> None:
    rows_path = store_dir / ROWS_FILE
    damaged = bytearray(rows_path.read_bytes())
    damaged[len(damaged) // 3] ^= 0x01
    rows_path.write_bytes(bytes(damaged))
    with pytest.raises(StageError, match=f"{rows_path} is damaged: bytes 0\\.\\.") as caught:
        open_store(store_dir)
    assert "\n" not in str(caught.value)
    # The export's check says so too (here already its sampled rows, in a store this small).
    with pytest.raises(ExportError, match=f"{rows_path} (is damaged|does not match)"):
        verify_checksums(store_dir)
    # Description and size only: loads (what a caller that skips the check gets).
    assert not open_store(store_dir, verify=False).verified


def test_a_truncated_store_fails_the_stage_naming_the_file(store_dir: Path) -> None:
    rows_path = store_dir / ROWS_FILE
    rows_path.write_bytes(rows_path.read_bytes()[:-100])
    with pytest.raises(StageError, match=f"{rows_path} has .* bytes.*truncated"):
        open_store(store_dir)


def test_the_checksums_themselves_are_checked(store_dir: Path) -> None:
    meta_path = store_dir / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["checksums"]["values"][0] ^= 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(StageError, match="fingerprint does not match its own spec and checksums"):
        open_store(store_dir)
    meta["fingerprint"] = store_fingerprint(meta["spec"], meta["checksums"])
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(StageError, match="is damaged"):
        open_store(store_dir)
    meta["checksums"] = {"kind": "md5", "chunk_bytes": 10, "values": []}
    meta.pop("fingerprint")
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(StageError, match=r"checksums\.kind must be \"crc32\", got \"md5\""):
        open_store(store_dir)


def test_the_stage_refuses_a_store_of_another_content(tmp_path: Path, store_dir: Path) -> None:
    hot = _hot_set(tmp_path / "hot.npz")
    fingerprint = json.loads((store_dir / META_FILE).read_text())["fingerprint"]
    lookup = HotColdLookup.open(store_dir, hot, SIZES, fingerprint=fingerprint)
    assert lookup.store is not None and lookup.store.fingerprint == fingerprint
    spec = RowStoreSpec.for_dlrm(SIZES, WIDTH)
    other = tmp_path / "other"
    write_arrays(other, spec, _tables(spec, seed=1))
    with pytest.raises(StageError, match="does not match this stage's hot set") as caught:
        HotColdLookup.open(other, hot, SIZES, fingerprint=fingerprint)
    assert str(other / ROWS_FILE) in str(caught.value)
    # Without a recorded fingerprint there is nothing to compare: it loads.
    HotColdLookup.open(other, hot, SIZES)


def test_older_stores_load_checked_by_sha256_or_unverified(store_dir: Path) -> None:
    meta_path = store_dir / META_FILE
    meta = json.loads(meta_path.read_text())
    for key in ("checksums", "fingerprint"):
        meta.pop(key)
    meta_path.write_text(json.dumps(meta))
    opened = open_store(store_dir)
    assert opened.verified and opened.fingerprint == "" and "SHA-256 verified" in opened.check
    with pytest.raises(ExportError, match="without chunk checksums"):
        verify_checksums(store_dir)
    rows_path = store_dir / ROWS_FILE
    damaged = bytearray(rows_path.read_bytes())
    damaged[7] ^= 0x80
    rows_path.write_bytes(bytes(damaged))
    with pytest.raises(StageError, match="does not match the SHA-256"):
        open_store(store_dir)
    meta["sha256"] = None
    meta_path.write_text(json.dumps(meta))
    opened = open_store(store_dir)
    assert not opened.verified and opened.check.startswith("UNVERIFIED")
