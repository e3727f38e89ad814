"""Pairs per LoadGen query: a fixed count, a uniform range, or MLPerf's quantile file (dlrm-v2's
``--samples-to-aggregate-quantile-file``: one line of pair counts, one drawn at random per query)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE
from loadtest.engine.payload import PayloadPool
from loadtest.sweeps.mlperf import VARIABLE_SAMPLES, PairsPerQuery, QuerySamples, query_samples


def _pool(rows: int) -> PayloadPool:
    dense = np.arange(rows * NUM_DENSE, dtype=np.float32).reshape(rows, NUM_DENSE)
    categorical = np.arange(rows * NUM_CATEGORICAL, dtype=np.int64).reshape(rows, NUM_CATEGORICAL)
    return PayloadPool(dense=dense, categorical=categorical, batch_size=1, source="test")


def test_a_quantile_file_is_sampled_as_mlperf_samples_it(tmp_path: Path) -> None:
    quantile = tmp_path / "dist_quantile.txt"
    quantile.write_text("100, 100, 200, 200, 200, 200, 300, 700\n")
    pairs = PairsPerQuery.parse(str(quantile))
    assert pairs.spread == "quantile" and pairs.counts == (100, 100, 200, 200, 200, 200, 300, 700)
    drawn = pairs.draw(80_000, np.random.default_rng(0))
    # Each entry is drawn with equal chance: 200 half the time, 100 a quarter, 300 and 700 an eighth each.
    shares = {value: float(np.mean(drawn == value)) for value in (100, 200, 300, 700)}
    assert shares == pytest.approx({100: 0.25, 200: 0.5, 300: 0.125, 700: 0.125}, abs=0.01)
    assert "(100 to 700, mean 250.0)" in pairs.describe()


def test_fixed_and_uniform_counts_and_bad_specs() -> None:
    assert PairsPerQuery.parse("64").draw(5, np.random.default_rng(0)).tolist() == [64] * 5
    assert PairsPerQuery.parse(3).describe() == "3 pairs per query"
    uniform = PairsPerQuery.parse("2:5").draw(10_000, np.random.default_rng(1))
    assert set(uniform.tolist()) == {2, 3, 4, 5}
    for bad, says in (
        ("0", ">= 1"),
        ("5:2", "1 <= MIN <= MAX"),
        ("nowhere.txt", "a count, MIN:MAX or a quantile"),
    ):
        with pytest.raises(ConfigError, match=says):
            PairsPerQuery.parse(bad)


def test_a_file_that_is_no_quantile_file_is_one_error(tmp_path: Path) -> None:
    for name, text in (("words", "a, b, c\n"), ("zero", "0, 1, 2\n"), ("empty", "\n"), ("bytes", None)):
        path = tmp_path / name
        if text is None:
            path.write_bytes(bytes(range(256)))
        else:
            path.write_text(text)
        with pytest.raises(ConfigError):
            PairsPerQuery.parse(str(path))


def test_variable_samples_hold_consecutive_rows_of_their_drawn_size() -> None:
    pool = _pool(50)
    sizes = np.array([3, 7, 45, 1])
    samples = QuerySamples(pool, sizes)
    assert len(samples) == 4
    starts = [0, 3, 10, 5]  # 10 + 45 wraps around the 50 rows to 5
    for index, (size, start) in enumerate(zip(sizes.tolist(), starts, strict=True)):
        inputs = samples.batch(index)
        assert inputs[DENSE_INPUT].shape == (size, NUM_DENSE)
        assert inputs[CATEGORICAL_INPUT].shape == (size, NUM_CATEGORICAL)
        expected = [(start + offset) % 50 for offset in range(size)]
        np.testing.assert_array_equal(
            inputs[DENSE_INPUT][:, 0], np.array(expected, dtype=np.float32) * NUM_DENSE
        )
    # A sample larger than the pool takes its rows round more than once.
    longer = QuerySamples(pool, np.array([120])).batch(0)[DENSE_INPUT][:, 0] / NUM_DENSE
    np.testing.assert_array_equal(longer, np.arange(120) % 50)
    assert len(query_samples(pool, PairsPerQuery.parse("1:4"))) == VARIABLE_SAMPLES
    fixed = query_samples(pool, PairsPerQuery.parse("10"))
    assert isinstance(fixed, PayloadPool) and len(fixed) == 5
