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


def test_drawn_bags_keep_the_rows_id_first_and_slice_by_rows() -> None:
    from criteo.multihot import BagBatch, draw_bags
    from criteo.tsv import Batch

    ids = np.arange(50 * NUM_CATEGORICAL, dtype=np.int64).reshape(50, NUM_CATEGORICAL) * 7
    bags = draw_bags(Batch(np.zeros((50, 13), np.float32), ids, None), seed=4)
    assert isinstance(bags, BagBatch) and (bags.lengths == 0).any() and bags.lengths.sum() == bags.values.size
    values, lengths = bags.per_table()
    for table in (0, 20):
        firsts = np.cumsum(lengths[table]) - lengths[table]
        present = lengths[table] > 0
        np.testing.assert_array_equal(values[table][firsts[present]], ids[present, table])
    part = bags.slice(10, 13)
    assert len(part) == 3 and part.values.size == bags.lengths[10:13].sum()
    np.testing.assert_array_equal(part.values, bags.values[bags.row_starts()[10] : bags.row_starts()[13]])
    with pytest.raises(Exception, match="add up to"):
        BagBatch(bags.dense, bags.values[:-1], None, bags.lengths)


def test_the_multi_hot_text_format_round_trips_and_names_bad_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bundle.errors import DataError
    from criteo.multihot import fixed_bags, parse_bag_lines, read_bags
    from criteo.synth import SynthConfig, write_tsv

    path = tmp_path / "bags.tsv"
    write_tsv(SynthConfig(rows=400, seed=1, bags="variable"), path)
    bags = read_bags(path)
    assert len(bags) == 400 and bags.labels is not None and 0.05 < bags.labels.mean() < 0.6
    assert (bags.lengths == 0).any() and (bags.lengths > 1).any()
    assert len(read_bags(path, max_rows=7)) == 7
    fixed = tmp_path / "fixed.tsv"
    write_tsv(SynthConfig(rows=50, seed=1, bags=MLPERF_HOTNESS), fixed)
    assert fixed_bags(read_bags(fixed), MLPERF_HOTNESS).categorical.shape == (50, 214)
    wrong = np.argwhere(bags.lengths[0] != np.asarray(MLPERF_HOTNESS))[0][0]
    held = MLPERF_HOTNESS[wrong]
    message = f"row 1, table C{wrong + 1}: {bags.lengths[0, wrong]} ids, the model's bags hold {held}"
    with pytest.raises(DataError, match=message):
        fixed_bags(bags, MLPERF_HOTNESS)
    line = "1\t" + "\t".join(["2"] * 13) + "\t" + "\t".join(["a,ff"] + [""] * 25)
    parsed = parse_bag_lines([line])
    assert parsed.values.tolist() == [10, 255] and parsed.lengths[0, :2].tolist() == [2, 0]
    with pytest.raises(DataError, match=r"f\.tsv:3: 39 fields where the rows before had 40"):
        parse_bag_lines([line, line, line[2:]], "f.tsv")
    with pytest.raises(DataError, match="'zz' is not a hex number"):
        parse_bag_lines([line.replace("a,ff", "a,zz")], "f.tsv")
    with pytest.raises(DataError, match=r"f\.tsv:1: 12 fields"):
        parse_bag_lines(["\t".join(["1"] * 12)], "f.tsv")
