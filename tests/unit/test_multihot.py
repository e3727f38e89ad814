"""Multi-hot rows: the bags made from single-hot rows, the config's hotness, and the load tests' payload."""

from __future__ import annotations

import numpy as np
import pytest

from bundle.errors import ConfigError
from bundle.repository import ServingConfig, build_config, config_hotness
from bundle.schema import CATEGORICAL_INPUT, NUM_CATEGORICAL
from criteo.multihot import MLPERF_HOTNESS, bag_starts, expand, parse_hotness
from loadtest.engine.payload import build_pool


def test_bags_start_with_the_rows_own_id_and_repeat_with_the_seed() -> None:
    ids = np.arange(3 * NUM_CATEGORICAL, dtype=np.int64).reshape(3, NUM_CATEGORICAL) * 1000
    bags = expand(ids, MLPERF_HOTNESS, seed=1)
    assert bags.shape == (3, 214) and bags.dtype == np.int64
    starts = bag_starts(MLPERF_HOTNESS)
    np.testing.assert_array_equal(bags[:, list(starts)], ids)
    np.testing.assert_array_equal(bags, expand(ids, MLPERF_HOTNESS, seed=1))
    assert not np.array_equal(bags, expand(ids, MLPERF_HOTNESS, seed=2))
    table_20 = bags[:, starts[20] : starts[20] + 100]
    assert len(np.unique(table_20[0])) == 100  # a bag's other ids differ from its first
    extreme = np.full((1, NUM_CATEGORICAL), np.iinfo(np.int64).max, dtype=np.int64)
    assert expand(extreme, (2,) * NUM_CATEGORICAL).shape == (1, 52)  # wraps, never raises


def test_the_config_records_the_hotness_and_the_input_width() -> None:
    config = build_config("m", ServingConfig(hotness=MLPERF_HOTNESS))
    categorical = next(t for t in config.input if t.name == CATEGORICAL_INPUT)
    assert list(categorical.dims) == [214]
    assert config_hotness(config) == MLPERF_HOTNESS
    assert config_hotness(build_config("m", ServingConfig())) is None
    with pytest.raises(ConfigError, match="26 counts"):
        ServingConfig(hotness=(1, 2))


def test_a_payload_for_a_multi_hot_model_holds_its_bags() -> None:
    pool = build_pool(8, batches=2)
    bags = pool.multi_hot(parse_hotness("3"))
    assert bags.categorical.shape == (16, 78) and bags.text is None
    assert bags.batch(1)[CATEGORICAL_INPUT].shape == (8, 78)
    assert pool.multi_hot(None) is pool
