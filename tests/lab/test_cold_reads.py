"""The embedding stage's ways of reading cold rows give the bytes of a plain gather, whatever the ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundle.schema import NUM_CATEGORICAL
from export.stage import hot_cold_lookup
from export.stage.hot_cold_lookup import (
    COLD_READS,
    PAGE_BYTES,
    ColdReads,
    HotColdLookup,
    RequestError,
    StageError,
    dequantize_rows,
    open_store,
    page_runs,
    quantize_rows,
)
from export.tables.ensemble import write_embedding_stage
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays
from lab.cold_reads import (
    WAYS,
    ColdReadOptions,
    evict,
    resident_bytes,
    run_cold_reads,
)
from tests.stage_contract import stage_contract

#: 50 values: 200-byte float32 rows (100 in float16, 58 in int8), so rows span page boundaries.
WIDTH = 50
SIZES = tuple(40 + 11 * t for t in range(NUM_CATEGORICAL))
INT64 = np.iinfo(np.int64)


def _tables(dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.normal(0, 1, (size, WIDTH)).astype(dtype) for size in SIZES]


def _hot_set() -> HotSet:
    rng = np.random.default_rng(5)
    ids = tuple(rng.permutation(size)[: size // 3].astype(np.int64) for size in SIZES)
    counts = tuple(np.ones(i.size, dtype=np.int64) for i in ids)
    return HotSet(SIZES, (WIDTH * 4,) * NUM_CATEGORICAL, 10**6, ids, counts, sum(i.size for i in ids))


@pytest.fixture(params=["float32", "float16", "int8"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Path, list[np.ndarray]]:
    """The store, its hot set, and the values it holds (an int8 store's dequantized)."""
    tables = _tables("float32" if request.param == "int8" else request.param)
    write_arrays(tmp_path / "rows", RowStoreSpec.for_dlrm(SIZES, WIDTH, request.param), tables)
    if request.param == "int8":
        tables = [dequantize_rows(quantize_rows(t, [(0, WIDTH)]), WIDTH, [(0, WIDTH)]) for t in tables]
    return tmp_path / "rows", _hot_set().save(tmp_path / "hot.npz"), tables


def _requests() -> dict[str, np.ndarray]:
    """Hot, cold, mixed, repeated and out-of-range ids, and rows that span a page boundary."""
    rng = np.random.default_rng(7)
    hot = _hot_set()
    offsets = np.concatenate(([0], np.cumsum(SIZES)[:-1]))
    all_hot = np.stack([hot.ids[t][rng.integers(0, hot.ids[t].size, 8)] for t in range(NUM_CATEGORICAL)], 1)
    cold_ids = [np.setdiff1d(np.arange(size), hot.ids[t]) for t, size in enumerate(SIZES)]
    all_cold = np.stack([c[rng.integers(0, c.size, 8)] for c in cold_ids], 1)
    repeated = np.repeat(all_cold[:1], 6, axis=0)
    # Global row r spans a page boundary when its bytes cross a multiple of the page.
    # Rows of each store's row size (float32, float16, int8) whose bytes cross a page boundary.
    spanning = sorted(
        {
            r
            for row_bytes in (WIDTH * 4, WIDTH * 2, WIDTH + 8)
            for r in range(sum(SIZES))
            if (r * row_bytes) // PAGE_BYTES != ((r + 1) * row_bytes - 1) // PAGE_BYTES
        }
    )
    table_of = np.searchsorted(offsets, spanning, side="right") - 1
    across = np.tile(all_cold[:1], (len(spanning), 1))
    for index, (row, table) in enumerate(zip(spanning, table_of, strict=True)):
        across[index, table] = row - offsets[table]
    extremes = np.array([[INT64.min, INT64.max, -1, 2**62 + 3] * 6 + [0, -7]], dtype=np.int64)
    return {
        "hot": all_hot,
        "cold": all_cold,
        "mixed": rng.integers(-(10**6), 10**6, (64, NUM_CATEGORICAL)),
        "repeated rows": repeated,
        "rows across a page boundary": across,
        "out-of-range ids": extremes,
        "one row": all_cold[:1],
    }


def _reference(ids: np.ndarray, tables: list[np.ndarray], hot: HotSet) -> np.ndarray:
    """The cold rows by the contract, one lookup at a time with Python's %."""
    hot_ids = [set(map(int, table)) for table in hot.ids]
    rows = []
    for b in range(ids.shape[0]):
        for t in range(NUM_CATEGORICAL):
            row = int(ids[b, t]) % SIZES[t]
            if row not in hot_ids[t]:
                rows.append(tables[t][row].astype(np.float32))
    return np.array(rows, dtype=np.float32).reshape(-1, WIDTH)


@pytest.mark.parametrize("way", COLD_READS)
def test_every_way_reads_the_bytes_of_a_plain_gather(
    store: tuple[Path, Path, list[np.ndarray]], way: str
) -> None:
    store_dir, hot_path, tables = store
    lookup = HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads=way, threads=3)
    plain = HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads="fault")
    try:
        for name, ids in _requests().items():
            placement, expected = lookup.place(ids), plain.place(ids)
            assert placement.cold_rows.dtype == np.float32, name
            # Bit for bit: the same bytes, not merely close values.
            assert placement.cold_rows.tobytes() == expected.cold_rows.tobytes(), name
            np.testing.assert_array_equal(
                placement.cold_rows, _reference(ids, tables, _hot_set()), err_msg=name
            )
            np.testing.assert_array_equal(placement.hot_slots, expected.hot_slots, err_msg=name)
            np.testing.assert_array_equal(placement.cold_positions, expected.cold_positions, err_msg=name)
    finally:
        lookup.close()
        plain.close()


def test_io_uring_reads_the_same_bytes_with_and_without_its_read_ahead_hints(
    store: tuple[Path, Path, list[np.ndarray]],
) -> None:
    store_dir, hot_path, _ = store
    hinted = HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads="io_uring", hint_rows=10**6)
    bare = HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads="io_uring", hint_rows=0)
    try:
        if hinted.reads.fallback:
            pytest.skip(f"no io_uring here: {hinted.reads.fallback}")
        for name, ids in _requests().items():
            with_hints, without = hinted.place(ids), bare.place(ids)
            assert with_hints.cold_rows.tobytes() == without.cold_rows.tobytes(), name
            rows = with_hints.cold_distinct_rows
            runs = page_runs(with_hints.pending.distinct, with_hints.pending.row_bytes)[0].size
            enters = -(-rows // hinted.reads._ring.entries) if hinted.reads._ring else 0
            # One hint per run of pages, then the ring's calls; without hints only the ring's.
            assert with_hints.cold_reads == runs + enters and without.cold_reads == enters, name
    finally:
        hinted.close()
        bare.close()


def test_a_repeated_row_is_read_once(store: tuple[Path, Path, list[np.ndarray]]) -> None:
    store_dir, hot_path, _ = store
    lookup = HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads="threads", threads=2)
    try:
        repeated = _requests()["repeated rows"]
        placement = lookup.place(repeated)
        assert placement.cold_lookups == NUM_CATEGORICAL * repeated.shape[0]
        assert placement.cold_distinct_rows == NUM_CATEGORICAL
        assert placement.cold_reads <= NUM_CATEGORICAL
    finally:
        lookup.close()


def test_page_runs() -> None:
    def runs(rows: list[int], row_bytes: int = 200) -> list[tuple[int, int]]:
        offsets, lengths = page_runs(np.asarray(rows, dtype=np.int64), row_bytes, 4096)
        return [(int(o) // 4096, int(n) // 4096) for o, n in zip(offsets, lengths, strict=True)]

    assert runs([]) == []
    assert runs([0]) == [(0, 1)]
    assert runs([20]) == [(0, 2)]  # bytes 4000..4199: both pages
    assert runs([0, 20]) == [(0, 2)]
    assert runs([0, 21]) == [(0, 2)]  # pages 0 and 1 are adjacent: one run
    assert runs([0, 41]) == [(0, 1), (2, 1)]  # page 1 lies between
    assert runs([0, 100]) == [(0, 1), (4, 1)]
    assert runs([3, 5], row_bytes=8192) == [(6, 2), (10, 2)]


def test_bad_ways_are_refused(store: tuple[Path, Path, list[np.ndarray]]) -> None:
    opened = open_store(store[0], verify=False)
    with pytest.raises(StageError, match="one of io_uring, prefetch, threads, fault"):
        ColdReads(opened.data, "mmap")
    with pytest.raises(StageError, match="threads must be >= 1"):
        ColdReads(opened.data, "threads", threads=0)
    with pytest.raises(StageError, match="give its path"):
        ColdReads(opened.data, "threads")


def test_eviction_empties_the_page_cache_of_the_store(store: tuple[Path, Path, list[np.ndarray]]) -> None:
    opened = open_store(store[0], verify=False)
    opened.data.reshape(-1).view(np.uint8).sum()  # every page read through the mapping
    assert resident_bytes(opened) >= opened.data.nbytes - PAGE_BYTES
    assert evict(opened) == 0


def test_the_benchmark_measures_every_way_on_fresh_rows(
    tmp_path: Path, store: tuple[Path, Path, list[np.ndarray]]
) -> None:
    store_dir, hot_path, _ = store
    repository = tmp_path / "repo"
    write_embedding_stage(repository, "dlrm", store_dir, hot_path)
    data = tmp_path / "heldout.tsv"
    rng = np.random.default_rng(9)
    with data.open("w") as out:
        for _ in range(2 * len(WAYS) * (4 + 16) * 3):
            ids = "\t".join(f"{v:x}" for v in rng.integers(0, 10**6, NUM_CATEGORICAL))
            out.write("1\t" + "\t".join(["1"] * 13) + "\t" + ids + "\n")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "lab", "cold-reads", "--repository", str(repository), "--data", str(data),
         "--batch-size", "4,16", "--requests", "3", "--rounds", "2", "--threads", "2",
         "--probe-seconds", "0.1", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((out / "cold_reads.json").read_text())
    assert [(w["way"], w["batch_size"]) for w in report["ways"]] == [(w, b) for w in WAYS for b in (4, 16)]
    for way in report["ways"]:
        assert way["requests"] == 6 and way["cold_lookups_p50"] > 0 and way["pages_p50"] > 0
        assert way["cold_cpu_ms_p50"] >= 0 and way["warm_cpu_ms_p50"] >= 0
    assert [d["queue_depth"] for d in report["disk"]] == [1, 8, 32] and report["best_iops"] > 0
    assert report["record"]["command"].startswith("python -m lab cold-reads")
    assert all((out / name).stat().st_size > 0 for name in ("cold_reads.md", "cold_reads.png"))
    assert "CPU ms cold / warm" in (out / "cold_reads.md").read_text()
    with pytest.raises(Exception, match=f"sends {2 * len(WAYS) * 20 * (4 + 16)} rows"):
        run_cold_reads(
            ColdReadOptions(repository, data=data, batch_sizes=(4, 16), requests=20, rounds=2), "test"
        )


def test_float16_rows_become_float32_bit_for_bit() -> None:
    # Every float16 bit pattern, NaN payloads and infinities included.
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 64)
    got = hot_cold_lookup._as_float32(every)
    assert got.dtype == np.float32 and got.shape == every.shape
    assert got.view(np.uint32).tobytes() == every.astype(np.float32).view(np.uint32).tobytes()


#: Ids per bag of each table for the multi-hot cases: 1 to 4, so positions and tables differ.
HOTNESS = tuple(1 + t % 4 for t in range(NUM_CATEGORICAL))


@pytest.mark.parametrize("way", COLD_READS)
def test_bags_place_each_id_in_its_tables_rows(store: tuple[Path, Path, list[np.ndarray]], way: str) -> None:
    store_dir, hot_path, tables = store
    lookup = HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads=way, threads=3, hotness=HOTNESS)
    try:
        assert lookup.positions == sum(HOTNESS)
        rng = np.random.default_rng(11)
        # Each table's one-hot cases spread over its bag's positions, repeats and extremes included.
        one_hot = _requests()
        table_of = np.repeat(np.arange(NUM_CATEGORICAL), HOTNESS)
        for name, ids in one_hot.items():
            bags = ids[:, table_of].copy()
            bags[:, 1::3] = rng.integers(INT64.min, INT64.max, bags[:, 1::3].shape, dtype=np.int64)
            placement = lookup.place(lookup.check_ids(bags, "categorical_ids"))
            slots, positions, rows = stage_contract(bags, _hot_set().ids, SIZES, tables, HOTNESS)
            np.testing.assert_array_equal(placement.hot_slots, slots, err_msg=name)
            np.testing.assert_array_equal(placement.cold_positions, positions, err_msg=name)
            assert placement.cold_rows.tobytes() == rows.tobytes(), name
        with pytest.raises(RequestError, match=rf"shape \[2, 26\], expected \[-1, {sum(HOTNESS)}\]"):
            lookup.check_ids(np.zeros((2, NUM_CATEGORICAL), dtype=np.int64), "categorical_ids")
    finally:
        lookup.close()


def test_hotness_that_does_not_fit_the_tables_is_refused(store: tuple[Path, Path, list[np.ndarray]]) -> None:
    store_dir, hot_path, _ = store
    for hotness in ((2,) * (NUM_CATEGORICAL - 1), (0,) + (1,) * (NUM_CATEGORICAL - 1)):
        with pytest.raises(StageError, match="hotness must be 26 counts >= 1"):
            HotColdLookup.open(store_dir, hot_path, SIZES, cold_reads="fault", hotness=hotness)
