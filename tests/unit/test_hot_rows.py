"""Hot-row choice under a byte budget: sizes, the greedy order across tables, hit rates, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError, DataError
from bundle.schema import NUM_CATEGORICAL
from criteo.coverage import CoverageConfig, measure_coverage
from criteo.profile import AccessProfile, TableCounts, profile_file
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch
from export.tables.hot_rows import HotSet, choose_hot_rows, parse_size

SIZES = (10,) * NUM_CATEGORICAL
#: C1 8 bytes a row, C2 12, every other table 4.
ROW_BYTES = (8, 12) + (4,) * (NUM_CATEGORICAL - 2)


def _profile(table_sizes: tuple[int, ...] | None = SIZES) -> AccessProfile:
    """20 rows: C1 ids {5: 10, 9: 4, 3: 3, 7: 3}, C2 {2: 12, 8: 6, 1: 2}, every other table id 0 only.

    Hottest first across tables: the 24 single-id tables (20 each, C3 first), then
    C2:2, C1:5, C2:8, C1:9, C1:3, C1:7, C2:1; with ROW_BYTES their bytes add up to
    96, 108, 116, 128, 136, 144, 152, 164.
    """
    tables = [
        TableCounts.from_unsorted(np.array([7, 3, 9, 5]), np.array([3, 3, 4, 10])),
        TableCounts.from_unsorted(np.array([1, 2, 8]), np.array([2, 12, 6])),
    ] + [TableCounts(np.array([0]), np.array([20]))] * (NUM_CATEGORICAL - 2)
    return AccessProfile(tuple(tables), rows=20, table_sizes=table_sizes)


def test_parse_size() -> None:
    assert parse_size("0") == 0
    assert parse_size("4096") == 4096
    assert parse_size("1k") == 1024
    assert parse_size(" 512M ") == 512 * 2**20
    assert parse_size("2G") == 2 * 2**30
    assert parse_size("3T") == 3 * 2**40
    for bad in ("", "1.5G", "-1", "10MB", "5P", "abc", "1 000"):
        with pytest.raises(ConfigError, match="a size must be") as info:
            parse_size(bad)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("budget", "c1", "c2"),
    [
        (96, [], []),  # the single-id tables only
        (140, [5, 9], [2, 8]),  # through C1:9 (136 bytes)
        (147, [5, 9, 3], [2, 8]),  # C1:3 before C1:7 (a tie: lower id first)
        (127, [5], [2]),  # C2:8 (12 bytes) does not fit; the prefix stops there
        (10**6, [5, 9, 3, 7], [2, 8, 1]),  # every profiled row, never an unseen one
    ],
)
def test_greedy_choice_across_tables(budget: int, c1: list[int], c2: list[int]) -> None:
    hot = choose_hot_rows(_profile(), SIZES, ROW_BYTES, budget)
    assert hot.ids[0].tolist() == c1 and hot.ids[1].tolist() == c2
    assert all(ids.tolist() == [0] for ids in hot.ids[2:])
    assert hot.rows == 24 + len(c1) + len(c2)
    assert hot.bytes_used == 96 + 8 * len(c1) + 12 * len(c2) <= budget
    counts = {5: 10, 9: 4, 3: 3, 7: 3, 2: 12, 8: 6, 1: 2}
    expected = (480 + sum(counts[i] for i in c1) + sum(counts[i] for i in c2)) / 520
    assert hot.expected_hit_rate == pytest.approx(expected)


def test_row_bytes_and_budget_checks() -> None:
    # One size for all tables: 26 rows of 10 bytes in 260 bytes, the 24 singles then C2:2 and C1:5.
    hot = choose_hot_rows(_profile(), SIZES, 10, 260)
    assert hot.row_bytes == (10,) * NUM_CATEGORICAL and hot.table_rows[:2] == (1, 1)
    assert choose_hot_rows(_profile(), SIZES, 10, 0).rows == 0
    with pytest.raises(ConfigError, match="1 or 26"):
        choose_hot_rows(_profile(), SIZES, (8, 12), 100)
    with pytest.raises(ConfigError, match=">= 1 byte"):
        choose_hot_rows(_profile(), SIZES, 0, 100)
    with pytest.raises(ConfigError, match=">= 0 bytes"):
        choose_hot_rows(_profile(), SIZES, 4, -1)
    with pytest.raises(ConfigError, match="other table sizes"):
        choose_hot_rows(_profile(), (20,) * NUM_CATEGORICAL, 4, 100)


def test_raw_profile_is_reduced_into_the_tables() -> None:
    # Raw ids 15 and 5 are both row 5 of a 10-row table: their counts add up.
    raw = _profile(table_sizes=None)
    tables = list(raw.tables)
    tables[0] = TableCounts.from_unsorted(np.array([15, 5, 9, 33]), np.array([6, 5, 7, 2]))
    hot = choose_hot_rows(AccessProfile(tuple(tables), 20, None), SIZES, 4, 4 * 26)  # singles, C2:2, C1:5
    assert hot.ids[0].tolist() == [5] and hot.counts[0].tolist() == [11] and hot.ids[1].tolist() == [2]


def test_hit_rate_on_heldout_ids() -> None:
    hot = choose_hot_rows(_profile(), SIZES, ROW_BYTES, 140)  # C1 {5, 9}, C2 {2, 8}, others {0}
    ids = np.zeros((4, NUM_CATEGORICAL), dtype=np.int64)
    ids[:, 0] = [5, 15, 3, -1]  # 15 -> row 5 (hot), 3 cold, -1 -> row 9 (hot)
    ids[:, 1] = [2, 1, 1, 1]
    ids[:, 2] = [0, 10, 7, 0]  # 10 -> row 0 (hot)
    hits = hot.hits(ids)
    assert hits[:3].tolist() == [3, 1, 3] and hits[3:].tolist() == [4] * (NUM_CATEGORICAL - 3)
    assert hot.hit_rate(ids) == pytest.approx((3 + 1 + 3 + 4 * 23) / (4 * NUM_CATEGORICAL))
    with pytest.raises(DataError, match="B x 26"):
        hot.hit_rate(np.zeros((4, 3), dtype=np.int64))


def test_hits_of_bags_count_every_id_in_its_tables_lookups() -> None:
    hot = choose_hot_rows(_profile(), SIZES, ROW_BYTES, 140)  # C1 {5, 9}, C2 {2, 8}, others {0}
    hotness = (2, 3) + (1,) * (NUM_CATEGORICAL - 2)
    ids = np.zeros((2, sum(hotness)), dtype=np.int64)
    ids[:, :2] = [[5, 3], [-1, 9]]  # C1's bag: 3 of 4 hot (-1 -> row 9)
    ids[:, 2:5] = [[2, 2, 1], [8, 0, 12]]  # C2's bag: 12 -> row 2; 4 of 6 hot
    hits = hot.hits(ids, hotness)
    assert hits[:2].tolist() == [3, 4] and hits[2:].tolist() == [2] * (NUM_CATEGORICAL - 2)
    assert hot.hit_rate(ids, hotness) == pytest.approx((3 + 4 + 2 * 24) / ids.size)
    with pytest.raises(DataError, match="B x 29"):
        hot.hits(ids[:, :-1], hotness)


def test_save_load_round_trip(tmp_path: Path) -> None:
    hot = choose_hot_rows(_profile(), SIZES, ROW_BYTES, 147)
    path = hot.save(tmp_path / "sub" / "hot_rows.npz")
    assert path.is_file()
    loaded = HotSet.load(path)
    assert (loaded.table_sizes, loaded.row_bytes, loaded.budget_bytes) == (SIZES, ROW_BYTES, 147)
    assert loaded.expected_hit_rate == hot.expected_hit_rate and loaded.bytes_used == hot.bytes_used
    for a, b in zip(hot.ids + hot.counts, loaded.ids + loaded.counts, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(DataError, match="no hot-row file"):
        HotSet.load(tmp_path / "none.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(1))
    with pytest.raises(DataError, match="not a hot-row file"):
        HotSet.load(tmp_path / "other.npz")


def test_hot_set_checks_its_ids() -> None:
    ids = [np.array([0])] * NUM_CATEGORICAL
    with pytest.raises(DataError, match=r"in \[0, 10\)"):
        HotSet(SIZES, (4,) * NUM_CATEGORICAL, 200, (np.array([10]), *ids[1:]), tuple(ids), 20)
    with pytest.raises(DataError, match="over the budget"):
        HotSet(SIZES, (4,) * NUM_CATEGORICAL, 100, tuple(ids), tuple(ids), 20)


def test_same_choice_and_hit_rate_as_the_coverage_measurement(tmp_path: Path) -> None:
    train, heldout = tmp_path / "train.tsv", tmp_path / "heldout.tsv"
    write_tsv(SynthConfig(rows=2000, seed=1, max_vocabulary=2000), train)
    write_tsv(SynthConfig(rows=1000, seed=2, max_vocabulary=2000), heldout)
    sizes = (1000,) * NUM_CATEGORICAL
    profile = profile_file(train)
    result = measure_coverage(profile, heldout, CoverageConfig(sizes, (64,) * NUM_CATEGORICAL, (0.02, 0.1)))
    batch = read_batch(heldout)
    for fraction in (0.02, 0.1):
        measured = result.result_at("tables", fraction)
        assert measured is not None
        hot = choose_hot_rows(profile, sizes, 64, measured.budget_bytes)
        assert (hot.rows, hot.bytes_used) == (measured.hot_rows, measured.bytes_used)
        assert hot.expected_hit_rate == pytest.approx(measured.expected_hit_rate)
        assert hot.hit_rate(batch) == pytest.approx(measured.heldout_hit_rate)
        np.testing.assert_allclose(hot.hits(batch) / len(batch), measured.heldout_table_hit_rate)
    assert result.heldout_seen_share == pytest.approx(
        choose_hot_rows(profile, sizes, 64, 10**9).hit_rate(batch)
    )
