"""The int8 row store: rows quantized row-wise, read back within their quantization error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError, ExportError
from bundle.schema import NUM_CATEGORICAL
from export.stage.hot_cold_lookup import (
    COLD_READS,
    INT8_LEVELS,
    HotColdLookup,
    dequantize_rows,
    open_store,
    quantize_rows,
)
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStore, RowStoreSpec, random_store, write_arrays

SIZES = tuple(5 + 3 * t for t in range(NUM_CATEGORICAL))


def _bound(values: np.ndarray, columns: list[tuple[int, int]]) -> np.ndarray:
    """Half a quantization step of each value's column in its row, plus float32 rounding."""
    bound = np.zeros_like(values)
    for start, stop in columns:
        part = values[:, start:stop]
        step = (part.max(axis=1) - part.min(axis=1)) / INT8_LEVELS
        spread = np.abs(part).max(axis=1)
        bound[:, start:stop] = (step / 2 + 4 * np.finfo(np.float32).eps * spread)[:, None]
    return bound


@pytest.mark.parametrize(
    "columns", [[(0, 16)], [(0, 16), (16, 17)], [(0, 1), (1, 9), (9, 17)]], ids=["dlrm", "wide_deep", "three"]
)
def test_rows_round_trip_within_half_a_step(columns: list[tuple[int, int]]) -> None:
    width = columns[-1][1]
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((500, width)) * rng.uniform(1e-4, 10, (500, 1))).astype(np.float32)
    values[7] = 0.25  # a constant row
    encoded = quantize_rows(values, columns)
    assert encoded.dtype == np.uint8 and encoded.shape == (500, width + 8 * len(columns))
    decoded = dequantize_rows(encoded, width, columns)
    assert decoded.dtype == np.float32 and decoded.shape == values.shape
    assert (np.abs(decoded - values) <= _bound(values, columns)).all()
    np.testing.assert_array_equal(decoded[7], values[7])  # scale 0: the bias, exactly
    for start, stop in columns:
        if stop - start == 1:  # a one-value column (Wide & Deep's wide weight) is kept exactly
            np.testing.assert_array_equal(decoded[:, start], values[:, start])
        # Each column's smallest value is its bias: exact.
        np.testing.assert_array_equal(decoded[:, start:stop].min(axis=1), values[:, start:stop].min(axis=1))
    assert dequantize_rows(quantize_rows(values[:0], columns), width, columns).shape == (0, width)


def test_an_int8_store_takes_a_little_over_half_of_fp16() -> None:
    fp16, int8 = RowStoreSpec.for_dlrm(SIZES, 128, "float16"), RowStoreSpec.for_dlrm(SIZES, 128, "int8")
    assert int8.row_bytes == 136 and int8.total_bytes / fp16.total_bytes == pytest.approx(136 / 256)
    assert int8.total_bytes <= 0.56 * fp16.total_bytes
    assert RowStoreSpec.for_wide_deep(SIZES, 16, "int8").row_bytes == 17 + 16
    with pytest.raises(ConfigError, match="must tile its rows"):
        RowStoreSpec(SIZES, 8, "int8", {"embedding": (0, 6)})


def test_written_read_and_served_alike(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_wide_deep(SIZES, 16, "int8")
    rng = np.random.default_rng(1)
    tables = [rng.normal(0, 0.05, (size, spec.width)).astype(np.float32) for size in SIZES]
    store = write_arrays(tmp_path / "rows", spec, tables)
    assert (tmp_path / "rows" / "rows.bin").stat().st_size == sum(SIZES) * (17 + 16)
    columns = [(0, 16), (16, 17)]
    expected = [dequantize_rows(quantize_rows(t, columns), spec.width, columns) for t in tables]
    for t in range(NUM_CATEGORICAL):
        np.testing.assert_array_equal(store.table(t), expected[t])
        assert (np.abs(store.table(t) - tables[t]) <= _bound(tables[t], columns)).all()
    rows = store.rows(np.array([0, 3, 25]), np.array([4, 0, 2]))
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, np.stack([expected[0][4], expected[3][0], expected[25][2]]))
    np.testing.assert_array_equal(store.column("wide")[:, 0], np.concatenate([t[:, 16] for t in tables]))

    # The serving stage reads the same values, whichever way it reads.
    served = open_store(tmp_path / "rows")
    assert (served.dtype, served.width, served.columns) == ("int8", 17, ((0, 16), (16, 17)))
    hot_ids = tuple(np.arange(0, size, 2, dtype=np.int64) for size in SIZES)
    hot = HotSet(
        SIZES, (68,) * NUM_CATEGORICAL, 10**6, hot_ids, tuple(np.ones(i.size, np.int64) for i in hot_ids), 1
    )
    ids = rng.integers(-(10**9), 10**9, (32, NUM_CATEGORICAL))
    reduced = np.mod(ids, np.asarray(SIZES))
    want = [
        expected[t][reduced[b, t]]
        for b in range(ids.shape[0])
        for t in range(NUM_CATEGORICAL)
        if reduced[b, t] % 2
    ]
    for way in COLD_READS:
        lookup = HotColdLookup.open(tmp_path / "rows", hot.save(tmp_path / "hot.npz"), SIZES, cold_reads=way)
        try:
            placement = lookup.place(ids)
            assert lookup.width == 17
            np.testing.assert_array_equal(placement.cold_rows, np.array(want), err_msg=way)
        finally:
            lookup.close()


def test_a_value_that_is_not_finite_is_refused(tmp_path: Path) -> None:
    spec = RowStoreSpec.for_dlrm(SIZES, 4, "int8")
    tables = [np.zeros((size, 4), dtype=np.float32) for size in SIZES]
    tables[2][1, 3] = np.nan
    with pytest.raises(ExportError, match=r"global row 14 .* not finite"):
        write_arrays(tmp_path / "rows", spec, tables)
    assert not (tmp_path / "rows" / "rows.bin").exists()


def test_a_random_int8_store_holds_the_quantized_random_rows(tmp_path: Path) -> None:
    float_store = random_store(tmp_path / "f32", RowStoreSpec.for_dlrm(SIZES, 8, "float32"), seed=4)
    int8_store = random_store(tmp_path / "i8", RowStoreSpec.for_dlrm(SIZES, 8, "int8"), seed=4)
    for t in (0, 13, 25):
        exact = np.asarray(float_store.table(t))
        np.testing.assert_array_equal(
            int8_store.table(t), dequantize_rows(quantize_rows(exact, [(0, 8)]), 8, [(0, 8)])
        )
    assert isinstance(int8_store, RowStore) and int8_store.spec.dtype == "int8"
