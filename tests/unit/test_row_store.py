"""The memory-mapped row store: format, streaming writes, checks at open, lookups, random stores."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bundle.errors import BundleError, ConfigError, DataError, ExportError
from bundle.schema import NUM_CATEGORICAL
from criteo.tables import table_offsets, uniform_table_sizes
from export.tables import row_store_cli
from export.tables.row_store import (
    META_FILE,
    RANDOM_BLOCK_ROWS,
    ROWS_FILE,
    WIDE_STD,
    RowStore,
    RowStoreSpec,
    RowStoreWriter,
    from_stacked,
    random_rows,
    random_store,
    write_arrays,
)

#: 26 small tables of different sizes (2,353 rows).
SIZES = tuple(3 + 7 * t for t in range(NUM_CATEGORICAL))


def _tables(spec: RowStoreSpec, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((size, spec.width)).astype(np.float32) for size in spec.table_sizes]


def _one_line(error: pytest.ExceptionInfo[BundleError]) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    return text


def test_spec_sizes_and_validation() -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 8, "float16")
    assert (spec.rows, spec.row_bytes, spec.total_bytes) == (sum(SIZES), 16, sum(SIZES) * 16)
    assert spec.offsets == table_offsets(SIZES) and dict(spec.columns) == {"embedding": (0, 8)}
    assert RowStoreSpec(SIZES, 8) == RowStoreSpec.for_dlrm(SIZES, 8)
    wide = RowStoreSpec.for_wide_deep(SIZES, 8)
    assert wide.width == 9 and dict(wide.columns) == {"embedding": (0, 8), "wide": (8, 9)}
    assert RowStoreSpec.from_json(json.loads(json.dumps(wide.to_json()))) == wide
    for bad in (
        lambda: RowStoreSpec(SIZES[:25], 8),
        lambda: RowStoreSpec(SIZES, 0),
        lambda: RowStoreSpec(SIZES, 8, "float64"),
        lambda: RowStoreSpec(SIZES, 8, columns={"a": (0, 5), "b": (4, 8)}),
        lambda: RowStoreSpec(SIZES, 8, columns={"a": (0, 9)}),
        lambda: RowStoreSpec(SIZES, 8, columns={"a": (3, 3)}),
    ):
        with pytest.raises(ConfigError) as error:
            bad()
        _one_line(error)
    with pytest.raises(ConfigError, match="no column 'wide'"):
        spec.column_slice("wide")


def test_round_trip_float32_exact_and_table_views(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 8)
    tables = _tables(spec)
    store = write_arrays(tmp_path / "store", spec, tables, metadata={"model": "tiny"})
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [ROWS_FILE, META_FILE]
    assert (tmp_path / "store" / ROWS_FILE).stat().st_size == spec.total_bytes
    store = RowStore.open(tmp_path / "store")
    assert store.spec == spec and store.description["metadata"] == {"model": "tiny"}
    assert store.data.dtype == np.dtype("<f4") and not store.data.flags.writeable
    for t in (0, 7, 25):
        np.testing.assert_array_equal(store.table(t), tables[t])
    np.testing.assert_array_equal(store.data, np.concatenate(tables))
    store.verify()
    # The bytes are the stacked tables, row-major, little-endian.
    raw = np.fromfile(tmp_path / "store" / ROWS_FILE, dtype="<f4").reshape(spec.rows, spec.width)
    np.testing.assert_array_equal(raw, np.concatenate(tables))


def test_round_trip_float16_within_rounding(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 8, "float16")
    tables = _tables(spec)
    store = write_arrays(tmp_path / "store", spec, tables)
    assert store.data.dtype == np.dtype("<f2")
    expected = np.concatenate(tables)
    np.testing.assert_array_equal(store.data, expected.astype(np.float16))
    np.testing.assert_allclose(store.data.astype(np.float32), expected, rtol=2**-11, atol=2**-24)


def test_rows_in_the_callers_order_with_repeats_and_broadcasting(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 4)
    tables = _tables(spec)
    store = write_arrays(tmp_path / "store", spec, tables)
    lookups_tables = np.array([25, 0, 3, 3, 25, 0, 12])
    lookups_ids = np.array([SIZES[25] - 1, 2, 5, 5, 0, 2, 1])
    rows = store.rows(lookups_tables, lookups_ids)
    assert rows.shape == (7, 4)
    for i, (t, row) in enumerate(zip(lookups_tables, lookups_ids, strict=True)):
        np.testing.assert_array_equal(rows[i], tables[t][row])
    # All 26 features of a batch at once: table indices broadcast against B x 26 ids.
    rng = np.random.default_rng(1)
    ids = rng.integers(0, np.asarray(SIZES), (5, NUM_CATEGORICAL))
    batch = store.rows(np.arange(NUM_CATEGORICAL), ids)
    assert batch.shape == (5, NUM_CATEGORICAL, 4)
    np.testing.assert_array_equal(batch[3, 10], tables[10][ids[3, 10]])
    np.testing.assert_array_equal(store.rows_at(store.global_rows(np.arange(26), ids)), batch)
    assert store.rows(np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0, 4)


def test_out_of_range_lookups_are_refused(tmp_path: Path) -> None:
    store = write_arrays(tmp_path / "store", RowStoreSpec.for_dlrm(SIZES, 4), _tables(RowStoreSpec(SIZES, 4)))
    for tables, ids, message in (
        ([0, 1], [0, SIZES[1]], "first 10 for C2 \\(0..9\\)"),
        ([2], [-1], "first -1 for C3"),
        ([26], [0], "table index must be 0..25, got 26"),
        ([-1], [0], "got -1"),
        ([0], [0.5], "must be integers"),
        ([0, 1, 2], [0, 1], "do not broadcast"),
    ):
        with pytest.raises(DataError, match=message) as error:
            store.rows(np.asarray(tables), np.asarray(ids))
        _one_line(error)


def test_chunks_in_any_order_and_overwrites(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 3)
    tables = _tables(spec)
    expected = write_arrays(tmp_path / "in-order", spec, tables)
    chunks = [(t, start, 4) for t, size in enumerate(SIZES) for start in range(0, size, 4)]
    order = np.random.default_rng(2).permutation(len(chunks))
    with RowStoreWriter(tmp_path / "shuffled", spec) as writer:
        writer.write(5, 0, np.full((SIZES[5], 3), 7.0))  # overwritten below: the last write wins
        for i in order:
            t, start, count = chunks[i]
            writer.write(t, start, tables[t][start : start + count])
        assert writer.missing() == []
    store = RowStore.open(tmp_path / "shuffled")
    np.testing.assert_array_equal(store.data, expected.data)
    # Written out of order, the digest is read back at close and matches the in-order one.
    assert store.description["sha256"] == expected.description["sha256"]
    # Global writes may span tables.
    with RowStoreWriter(tmp_path / "global", spec) as writer:
        stacked = np.concatenate(tables)
        writer.write_global(10, stacked[10:])
        writer.write_global(0, stacked[:10])
    np.testing.assert_array_equal(RowStore.open(tmp_path / "global").data, expected.data)


def test_bad_writes_are_refused(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 3)
    with RowStoreWriter(tmp_path / "store", spec) as writer:
        for call in (
            lambda: writer.write(0, 1, np.zeros((3, 3))),
            lambda: writer.write(26, 0, np.zeros((1, 3))),
            lambda: writer.write(0, 0, np.zeros((1, 4))),
            lambda: writer.write_global(spec.rows - 1, np.zeros((2, 3))),
        ):
            with pytest.raises(ExportError) as error:
                call()
            _one_line(error)
        writer.abort()
    assert not (tmp_path / "store" / META_FILE).exists()
    assert list((tmp_path / "store").iterdir()) == []
    with pytest.raises(ExportError, match="metadata must be JSON values"):
        RowStoreWriter(tmp_path / "other", spec, metadata={"model": object()})


def test_a_missing_row_is_refused_at_close_and_the_old_store_stays(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 2)
    tables = _tables(spec)
    old = write_arrays(tmp_path / "store", spec, tables)
    missing = r"1 of 2353 rows never written \(first at C4 row 5\)"
    with (
        pytest.raises(ExportError, match=missing) as error,
        RowStoreWriter(tmp_path / "store", spec) as writer,
    ):
        for t, values in enumerate(tables):
            if t == 3:
                writer.write(t, 0, values[:5])
                writer.write(t, 6, values[6:])
            else:
                writer.write(t, 0, values)
    _one_line(error)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [ROWS_FILE, META_FILE]
    np.testing.assert_array_equal(RowStore.open(tmp_path / "store").data, old.data)
    # A failure inside the block also leaves no partial file and the old store.
    with pytest.raises(RuntimeError), RowStoreWriter(tmp_path / "store", spec) as writer:
        writer.write(0, 0, tables[0])
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [ROWS_FILE, META_FILE]
    RowStore.open(tmp_path / "store")


def test_truncated_swapped_or_mismatched_files_are_refused_at_open(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 4)
    path = tmp_path / "store"
    write_arrays(path, spec, _tables(spec))
    rows_path, meta_path = path / ROWS_FILE, path / META_FILE
    good_rows, good_meta = rows_path.read_bytes(), meta_path.read_text()

    def refused(message: str) -> None:
        with pytest.raises(ExportError, match=message) as error:
            RowStore.open(path)
        _one_line(error)
        rows_path.write_bytes(good_rows)
        meta_path.write_text(good_meta)

    rows_path.write_bytes(good_rows[:-16])
    refused("has 37632 bytes, store.json says 37648 \\(truncated")
    # rows.bin of another store of the same spec: the sampled rows differ.
    write_arrays(tmp_path / "other", spec, _tables(spec, seed=5))
    rows_path.write_bytes((tmp_path / "other" / ROWS_FILE).read_bytes())
    refused("sampled rows differ")
    meta = json.loads(good_meta)
    meta["spec"]["table_sizes"][0] += 1
    meta_path.write_text(json.dumps(meta))
    refused("file_bytes is 37648, its spec needs 37664")
    meta["file_bytes"] = 37664
    meta_path.write_text(json.dumps(meta))
    refused("has 37648 bytes, store.json says 37664")
    meta = json.loads(good_meta) | {"version": 99}
    meta_path.write_text(json.dumps(meta))
    refused("format version 99")
    meta_path.write_text("{")
    refused("cannot read")
    meta_path.unlink()
    refused("store.json is missing")
    # A flipped byte outside the sampled rows passes open; verify() reads it all.
    flipped = bytearray(good_rows)
    flipped[spec.row_bytes * 5 + 1] ^= 0xFF
    rows_path.write_bytes(bytes(flipped))
    with pytest.raises(ExportError, match="does not match the SHA-256"):
        RowStore.open(path).verify()


def test_wide_deep_columns_from_stacked_parts(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_wide_deep(SIZES, 6)
    rng = np.random.default_rng(3)
    deep = rng.standard_normal((spec.rows, 6)).astype(np.float32)
    wide = rng.standard_normal(spec.rows).astype(np.float32)
    store = from_stacked(tmp_path / "parts", spec, {"embedding": deep, "wide": wide}, chunk_rows=100)
    np.testing.assert_array_equal(store.column("embedding"), deep)
    np.testing.assert_array_equal(store.column("wide")[:, 0], wide)
    np.testing.assert_array_equal(
        store.rows([2, 2], [1, 0], column="wide")[:, 0], wide[[spec.offsets[2] + 1, spec.offsets[2]]]
    )
    rows = store.rows([4], [3])
    np.testing.assert_array_equal(
        rows[:, spec.column_slice("embedding")], store.rows([4], [3], column="embedding")
    )
    # The same store from one stacked array, written in another chunk size.
    same = from_stacked(tmp_path / "stacked", spec, np.concatenate([deep, wide[:, None]], axis=1))
    assert same.description["sha256"] == store.description["sha256"]
    with pytest.raises(ExportError, match="differ from the row store's"):
        from_stacked(tmp_path / "bad", spec, {"embedding": deep})
    with pytest.raises(ExportError, match="column 'wide' must be 2353 x 1"):
        from_stacked(tmp_path / "bad", spec, {"embedding": deep, "wide": wide[:-1]})


def test_random_store_is_deterministic_chunk_independent_and_in_bounds(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm((5000, *SIZES[1:]), 4, "float32")
    store = random_store(tmp_path / "a", spec, seed=3)
    again = random_store(tmp_path / "b", spec, seed=3, chunk_rows=777)
    other = random_store(tmp_path / "c", spec, seed=4)
    np.testing.assert_array_equal(store.data, again.data)
    assert store.description["sha256"] == again.description["sha256"] != other.description["sha256"]
    assert store.description["metadata"] == {"source": "random", "seed": 3, "init": "dlrm"}
    for t, size in enumerate(spec.table_sizes):
        table = store.table(t)
        bound = math.sqrt(1.0 / size)
        assert np.abs(table).max() <= bound
        if size >= 1000:  # filled evenly, not a constant or a narrower range
            assert np.abs(table).max() > 0.99 * bound and abs(float(table.mean())) < 0.05 * bound
    # Any rows regenerate without the store, across a block boundary.
    first = RANDOM_BLOCK_ROWS - 3
    np.testing.assert_array_equal(random_rows(spec, 0, first, 10, seed=3), store.table(0)[first : first + 10])


def test_random_store_wide_column_float16_and_init(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_wide_deep(uniform_table_sizes(2000), 8, "float16")
    store = random_store(tmp_path / "wd", spec, seed=0, init="wide_deep")
    embedding, wide = store.column("embedding"), store.column("wide")
    assert np.abs(embedding).max() <= np.float16(0.05) and np.abs(embedding).max() > 0.049
    assert 0.9 * WIDE_STD < float(wide.astype(np.float32).std()) < 1.1 * WIDE_STD
    fp32 = random_rows(RowStoreSpec.for_wide_deep(uniform_table_sizes(2000), 8), 7, 0, 2000, init="wide_deep")
    np.testing.assert_array_equal(store.table(7), fp32.astype(np.float16))
    with pytest.raises(ConfigError, match="init must be dlrm or wide_deep"):
        random_store(tmp_path / "bad", spec, init="xavier")


def test_random_store_memory_stays_at_a_chunk(tmp_path: Path) -> None:
    # A first, tiny store: what the writer imports on first use is not what it holds per chunk.
    random_store(tmp_path / "first", RowStoreSpec.for_dlrm(uniform_table_sizes(10), 8), chunk_rows=512)

    def peak_of(rows: int) -> tuple[int, int]:
        """The store's size and the least peak of three writes (tracemalloc also counts what other
        threads of this process allocate meanwhile: a fresh-clone run once read 6 kB too many
        from the least of two)."""
        spec = RowStoreSpec.for_dlrm(uniform_table_sizes(rows), 8)
        peaks = []
        for attempt in range(3):
            tracemalloc.start()
            try:
                random_store(tmp_path / f"store-{rows}-{attempt}", spec, chunk_rows=512)
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
        return spec.total_bytes, min(peaks)

    # Stores of 4.2 and 16.6 MB: the writer's peak does not grow with the store (a chunk is 16 kB,
    # a generated block 128 kB); it stays far below the smaller store.
    small_bytes, small_peak = peak_of(5000)
    big_bytes, big_peak = peak_of(20000)
    assert big_bytes == 4 * small_bytes and small_peak < small_bytes / 3
    assert big_peak < small_peak + 256_000, (small_peak, big_peak)


def test_cli_random_and_info(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "store"
    done = runner.invoke(
        row_store_cli.app,
        ["random", "--table-sizes", "300", "--dim", "4", "--dtype", "float32", "--wide", "--out", str(out)],
    )
    assert done.exit_code == 0, done.output
    assert "wrote 7800 rows x 5 float32 (152.3 KiB)" in done.output
    assert RowStore.open(out).spec == RowStoreSpec.for_wide_deep(uniform_table_sizes(300), 4)
    done = runner.invoke(row_store_cli.app, ["info", str(out)])
    assert done.exit_code == 0 and "columns: embedding 0..3, wide 4..4" in done.output
    done = runner.invoke(row_store_cli.app, ["verify", str(out)])
    assert done.exit_code == 0 and "SHA-256 matches" in done.output
