"""Access-skew profiling: exact streamed counts, table-size reduction, coverage, files, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import criteo.profile as profile_module
from bundle.errors import ConfigError, DataError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.__main__ import app
from criteo.coverage import HIT_RATE_PNG, RESULT_JSON, RESULT_MD, HotRanking, parse_fractions, parse_row_bytes
from criteo.profile import (
    COUNTS_FILE,
    COVERAGE_PNG,
    PROFILE_JSON,
    AccessProfile,
    TableCounts,
    coverage,
    profile_file,
)
from criteo.schema import MISSING_ID
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 skewed rows with small vocabularies, so ids repeat across chunks."""
    path = tmp_path_factory.mktemp("profile") / "train.tsv"
    write_tsv(SynthConfig(rows=2000, seed=1, max_vocabulary=300), path)
    return path


def _direct_counts(ids: np.ndarray) -> dict[int, int]:
    values, counts = np.unique(ids, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist(), strict=True))


def _as_dict(table: TableCounts) -> dict[int, int]:
    return dict(zip(table.ids.tolist(), table.counts.tolist(), strict=True))


def _assert_hottest_first(table: TableCounts) -> None:
    assert np.all(np.diff(table.counts) <= 0)
    ties = table.counts[1:] == table.counts[:-1]
    assert np.all(table.ids[1:][ties] > table.ids[:-1][ties])  # ties: lower id first


def test_streamed_counts_match_a_direct_count(train_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = read_batch(train_file).categorical
    # Chunks of 300 rows and merges every 50 pending entries: many chunks, many merges.
    monkeypatch.setattr(profile_module, "_MERGE_ENTRIES", 50)
    profile = profile_file(train_file, chunk_rows=300)
    assert profile.rows == 2000 and profile.table_sizes is None and profile.lookups == 2000 * NUM_CATEGORICAL
    for t, table in enumerate(profile.tables):
        assert _as_dict(table) == _direct_counts(ids[:, t])
        _assert_hottest_first(table)
    # One chunk gives the same profile.
    whole = profile_file(train_file)
    for a, b in zip(profile.tables, whole.tables, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.counts, b.counts)


def test_max_rows_and_progress(train_file: Path) -> None:
    seen: list[int] = []
    profile = profile_file(train_file, max_rows=1234, on_rows=seen.append, chunk_rows=500)
    assert profile.rows == 1234 and seen == [500, 500, 234]
    ids = read_batch(train_file, max_rows=1234).categorical
    assert _as_dict(profile.tables[7]) == _direct_counts(ids[:, 7])
    with pytest.raises(ConfigError, match="max_rows"):
        profile_file(train_file, max_rows=0)
    with pytest.raises(DataError, match="no such file"):
        profile_file(train_file.parent / "missing.tsv")


def test_table_size_reduction(train_file: Path) -> None:
    sizes = tuple(range(3, 3 + NUM_CATEGORICAL))
    ids = read_batch(train_file).categorical
    reduced = profile_file(train_file, table_sizes=sizes)
    assert reduced.table_sizes == sizes and reduced.table_rows() == sizes
    for t, table in enumerate(reduced.tables):
        assert _as_dict(table) == _direct_counts(np.mod(ids[:, t], sizes[t]))
        assert table.ids.max() < sizes[t]
    # Reducing a raw profile afterwards gives the same counts.
    later = profile_file(train_file).reduced(sizes)
    for a, b in zip(reduced.tables, later.tables, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.counts, b.counts)
    assert reduced.reduced(sizes) is reduced
    with pytest.raises(ConfigError, match="other table sizes"):
        reduced.reduced((1000,) * NUM_CATEGORICAL)


def test_missing_ids_count_like_any_id(tmp_path: Path) -> None:
    ids = [f"{i + 1:08x}" for i in range(NUM_CATEGORICAL)]
    lines = []
    for row in range(3):
        fields = list(ids)
        if row < 2:
            fields[0] = ""  # C1 missing in two rows
        lines.append("\t".join(["0", *["1"] * NUM_DENSE, *fields]) + "\n")
    path = tmp_path / "missing.tsv"
    path.write_text("".join(lines))
    profile = profile_file(path)
    assert _as_dict(profile.tables[0]) == {MISSING_ID: 2, 1: 1}
    assert _as_dict(profile.tables[1]) == {2: 3}


def test_coverage_of_a_hand_made_distribution() -> None:
    counts = np.array([5, 50, 10, 30, 5])  # any order; 100 lookups over 5 ids of a 10-row table
    shares = coverage(counts, [0.0, 0.1, 0.2, 0.3, 0.5, 1.0], rows=10)
    np.testing.assert_allclose(shares, [0.0, 0.5, 0.8, 0.9, 1.0, 1.0])
    # Without a size, the rows are the distinct ids: 40 % of 5 ids is 2 ids.
    np.testing.assert_allclose(coverage(counts, [0.4]), [0.8])
    # floor(0.29 * 100) is 29 rows, not 28 (float noise).
    np.testing.assert_allclose(coverage(np.ones(100, dtype=np.int64), [0.29]), [0.29])
    with pytest.raises(ConfigError, match="cannot hold"):
        coverage(counts, [0.1], rows=4)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        coverage(counts, [1.5])


def _hand_profile() -> AccessProfile:
    """20 rows: C1 ids {5: 10, 9: 4, 3: 3, 7: 3}, C2 {2: 12, 8: 6, 1: 2}, every other table id 0 only."""
    tables = [
        TableCounts.from_unsorted(np.array([7, 3, 9, 5]), np.array([3, 3, 4, 10])),
        TableCounts.from_unsorted(np.array([1, 2, 8]), np.array([2, 12, 6])),
    ] + [TableCounts(np.array([0]), np.array([20]))] * (NUM_CATEGORICAL - 2)
    return AccessProfile(tuple(tables), rows=20, table_sizes=(10,) * NUM_CATEGORICAL, source="hand")


def test_overall_coverage_is_greedy_across_tables() -> None:
    profile = _hand_profile()
    assert profile.tables[0].ids.tolist() == [5, 9, 3, 7]  # the 3-3 tie: lower id first
    # 260 rows in all; the 24 single-id tables serve 480 of 520 lookups with 24 rows, then 12, 10, 6, ...
    shares = profile.overall_coverage([24 / 260, 26 / 260, 1.0])
    np.testing.assert_allclose(shares, [480 / 520, 502 / 520, 1.0])
    per_table = profile.table_coverage([0.1, 0.2])  # 1 and 2 rows of each 10-row table
    np.testing.assert_allclose(per_table[0], [0.5, 0.7])
    np.testing.assert_allclose(per_table[1], [0.6, 0.9])
    np.testing.assert_allclose(per_table[5], [1.0, 1.0])


def test_ranking_orders_rows_and_ranks_heldout_ids() -> None:
    ranking = HotRanking(_hand_profile())
    assert len(ranking) == 24 + 7 and ranking.lookups == 520
    tail = list(zip(ranking.tables[24:].tolist(), ranking.ids[24:].tolist(), strict=True))
    assert tail == [(1, 2), (0, 5), (1, 8), (0, 9), (0, 3), (0, 7), (1, 1)]
    ids = np.zeros((2, NUM_CATEGORICAL), dtype=np.int64)
    ids[0, :2] = [3, 8]
    ids[1, :3] = [6, 4, 1]  # C1 6 and C2 4 never profiled; C3 id 1 neither
    ranks = ranking.ranks_of(ids)
    assert ranks[0, :3].tolist() == [28, 26, 0]  # C3 is the first single-id table
    assert ranks[1, :3].tolist() == [len(ranking)] * 3


def test_save_load_round_trip(tmp_path: Path, train_file: Path) -> None:
    profile = profile_file(train_file, table_sizes=(50,) * NUM_CATEGORICAL)
    files = profile.save(tmp_path / "p")
    assert {p.name for p in files.values()} == {COUNTS_FILE, PROFILE_JSON, COVERAGE_PNG}
    loaded = AccessProfile.load(tmp_path / "p")
    assert (loaded.rows, loaded.table_sizes, loaded.source) == (
        profile.rows,
        profile.table_sizes,
        str(train_file),
    )
    for a, b in zip(profile.tables, loaded.tables, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.counts, b.counts)
        assert b.counts.dtype == np.int64
    summary = json.loads((tmp_path / "p" / PROFILE_JSON).read_text())
    assert summary["rows"] == 2000 and len(summary["tables"]) == NUM_CATEGORICAL
    c1 = summary["tables"][0]
    assert c1["name"] == "C1" and c1["table_size"] == 50 and set(c1["top_share"]) == {"0.001", "0.01", "0.1"}
    assert summary["overall_curve"][-1] == {"fraction": 1.0, "rows": profile.distinct, "share": 1.0}
    with pytest.raises(DataError, match="no access profile"):
        AccessProfile.load(tmp_path)


def test_option_parsers() -> None:
    assert parse_fractions("10%,0.01, 0.5") == (0.01, 0.1, 0.5)
    for bad in ("0", "1.5", "abc", "150%"):
        with pytest.raises(ConfigError, match="--fractions"):
            parse_fractions(bad)
    assert parse_row_bytes("64") == (64,) * NUM_CATEGORICAL
    assert parse_row_bytes(",".join(["68"] * NUM_CATEGORICAL))[0] == 68
    with pytest.raises(ConfigError, match="--row-bytes"):
        parse_row_bytes("64B")
    with pytest.raises(ConfigError, match="1 or 26"):
        parse_row_bytes("64,68")


def test_cli_writes_profile_and_coverage(tmp_path: Path, train_file: Path) -> None:
    heldout = tmp_path / "heldout.tsv"
    write_tsv(SynthConfig(rows=500, seed=2, max_vocabulary=300), heldout)
    runner = CliRunner()
    result = runner.invoke(
        app, ["profile", "--data", str(train_file), "--out", str(tmp_path / "p"), "--table-sizes", "200"]
    )
    assert result.exit_code == 0, result.output
    assert "hottest 0.1/1/10 %" in result.output
    assert all((tmp_path / "p" / name).is_file() for name in (COUNTS_FILE, PROFILE_JSON, COVERAGE_PNG))
    args = [
        "coverage",
        "--profile",
        str(tmp_path / "p"),
        "--data",
        str(heldout),
        "--out",
        str(tmp_path / "c"),
    ]
    result = runner.invoke(app, [*args, "--row-bytes", "64", "--fractions", "5%,10%"])
    assert result.exit_code == 0, result.output
    assert all((tmp_path / "c" / name).is_file() for name in (RESULT_JSON, RESULT_MD, HIT_RATE_PNG))
    document = json.loads((tmp_path / "c" / RESULT_JSON).read_text())
    assert document["heldout"]["rows"] == 500 and document["table_rows"] == 200 * NUM_CATEGORICAL
    assert [(r["reference"], r["fraction"]) for r in document["results"]] == [
        ("tables", 0.05), ("tables", 0.1), ("profiled", 0.05), ("profiled", 0.1)
    ]  # fmt: skip
    assert document["target"]["measured"] == document["results"][1]["heldout_hit_rate"]
    # Other table sizes than the profile's: one clear error.
    result = runner.invoke(app, [*args, "--table-sizes", "300"])
    assert isinstance(result.exception, ConfigError)


def test_a_file_of_bags_counts_every_id_of_every_bag(tmp_path: Path) -> None:
    dense = "\t".join(["1"] * NUM_DENSE)
    fields = ["a,b,a", ""] + ["1"] * (NUM_CATEGORICAL - 2)  # C1: a twice and b; C2: an empty bag
    other = ["b"] + ["2,1"] + ["1"] * (NUM_CATEGORICAL - 2)
    path = tmp_path / "bags.tsv"
    path.write_text("\n".join("\t".join(["0", dense, *row]) for row in (fields, other)) + "\n")
    profile = profile_file(path, bags=True)
    assert profile.rows == 2
    assert _as_dict(profile.tables[0]) == {0xA: 2, 0xB: 2}
    assert _as_dict(profile.tables[1]) == {2: 1, 1: 1}
    assert profile.lookups == 4 + 2 + 2 * (NUM_CATEGORICAL - 2)
    reduced = profile_file(path, (5,) * NUM_CATEGORICAL, bags=True)
    assert _as_dict(reduced.tables[0]) == {0xA % 5: 2, 0xB % 5: 2}
