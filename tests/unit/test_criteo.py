"""The data contract: TSV parsing, preprocessing, hashing, synthetic data, metrics."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError, DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE
from criteo.metrics import logloss, roc_auc
from criteo.preprocess import hash_ids
from criteo.schema import MISSING_ID
from criteo.synth import HiddenModel, SynthConfig, write_tsv
from criteo.tsv import iter_batches, parse_lines, read_batch

# label, 13 counts (some missing, one negative), 26 ids (some missing)
COUNTS = ["5", "", "-3", "0", "12", "", "1", "2", "3", "4", "", "7", "100"]
IDS = ["68fd1e64", "", "0000000a", "ffffffff"] + [f"{i:08x}" for i in range(22)]
LINE = "\t".join(["1", *COUNTS, *IDS]) + "\n"


def test_parse_missing_and_negative_fields() -> None:
    raw = parse_lines([LINE])
    assert raw.labels is not None and raw.labels.tolist() == [1.0]
    assert raw.count_missing[0].tolist() == [c == "" for c in COUNTS]
    assert raw.counts[0, 2] == -3
    assert raw.ids[0, :4].tolist() == [0x68FD1E64, MISSING_ID, 10, 0xFFFFFFFF]


def test_preprocess_clamps_and_log1p(tmp_path: Path) -> None:
    path = tmp_path / "one.tsv"
    path.write_text(LINE)
    batch = read_batch(path)
    expected = np.log1p([5, 0, 0, 0, 12, 0, 1, 2, 3, 4, 0, 7, 100]).astype(np.float32)
    np.testing.assert_allclose(batch.dense[0], expected, rtol=1e-6)
    assert batch.dense.dtype == np.float32 and batch.categorical.dtype == np.int64
    assert set(batch.inputs()) == {DENSE_INPUT, CATEGORICAL_INPUT}


def test_unlabeled_format() -> None:
    raw = parse_lines(["\t".join([*COUNTS, *IDS])])
    assert raw.labels is None
    assert raw.ids.shape == (1, NUM_CATEGORICAL) and raw.counts.shape == (1, NUM_DENSE)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\t2\t3\n", "expected 40 tab-separated fields"),
        (LINE.replace("68fd1e64", "zz"), "is not 1 to 16 hex digits"),
        (LINE.replace("\t12\t", "\t1.5\t"), "is not an integer"),
        ("2" + LINE[1:], "label must be 0 or 1"),
    ],
)
def test_malformed_rows_name_their_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text(LINE + LINE + line)
    with pytest.raises(DataError, match=rf"bad.tsv:3: .*{message}"):
        read_batch(path)


def test_streams_in_chunks_and_reads_gzip(tmp_path: Path) -> None:
    path = tmp_path / "many.tsv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(LINE * 10)
    chunks = list(iter_batches(path, chunk_rows=3))
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert read_batch(path, max_rows=4).dense.shape == (4, NUM_DENSE)


def test_hash_ids_is_a_non_negative_modulo() -> None:
    ids = np.array([[-1, 2**62, 7, -(2**63)] + [0] * 22], dtype=np.int64)
    hashed = hash_ids(ids, [10] * NUM_CATEGORICAL)
    assert hashed[0, :4].tolist() == [9, 2**62 % 10, 7, (-(2**63)) % 10]
    assert hashed.min() >= 0 and hashed.max() < 10


def test_synthetic_file_is_criteo_format_and_skewed(tmp_path: Path) -> None:
    path = tmp_path / "synth.tsv"
    write_tsv(SynthConfig(rows=20_000, seed=3, chunk_rows=7_000), path)
    batch = read_batch(path)
    assert len(batch) == 20_000 and batch.labels is not None
    assert 0.1 < batch.labels.mean() < 0.5
    # The largest table: the hottest id is thousands of times as frequent as the median id.
    model = HiddenModel(SynthConfig(rows=1).model_seed, 1.05, SynthConfig(rows=1).max_vocabulary)
    rng = np.random.default_rng(0)
    _, _, _, ranks, _ = model.sample(rng, 200_000)
    table = int(np.argmax(model.vocabulary))
    counts = np.bincount(ranks[:, table], minlength=int(model.vocabulary[table]))
    assert counts[0] / max(np.median(counts[counts > 0]), 1) > 1000


def test_same_model_seed_gives_the_same_task(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    write_tsv(SynthConfig(rows=100, seed=1), a)
    write_tsv(SynthConfig(rows=100, seed=1), b)
    assert a.read_text() == b.read_text()
    with pytest.raises(ConfigError):
        SynthConfig(rows=0)


def test_auc_and_logloss() -> None:
    labels = np.array([0, 0, 1, 1])
    assert roc_auc(labels, np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert roc_auc(labels, np.array([0.5, 0.5, 0.5, 0.5])) == pytest.approx(0.5)
    assert logloss(labels, np.array([0.5] * 4)) == pytest.approx(np.log(2))
    with pytest.raises(DataError):
        roc_auc(np.zeros(3), np.ones(3))


def test_every_chunk_keeps_the_files_format(tmp_path: Path) -> None:
    unlabeled = LINE.split("\t", 1)[1]
    path = tmp_path / "mixed.tsv"
    path.write_text(LINE * 3 + unlabeled)
    with pytest.raises(DataError, match=r"mixed.tsv:4: expected 40 tab-separated fields, got 39"):
        list(iter_batches(path, chunk_rows=3))


@pytest.mark.parametrize("bad", ["0x1f", "-1", "5_0", "12345678901234567", "ffffffffffffffffffff"])
def test_ids_must_be_hex_of_up_to_16_digits(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "ids.tsv"
    path.write_text(LINE.replace("68fd1e64", bad))
    with pytest.raises(DataError, match=r"ids.tsv:1: C1: categorical id"):
        read_batch(path)


@pytest.mark.parametrize("bad", ["5_0", " 5", "99999999999999999999999", "1e3"])
def test_counts_must_be_plain_integers(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "counts.tsv"
    path.write_text(LINE.replace("\t12\t", f"\t{bad}\t"))
    with pytest.raises(DataError, match=r"counts.tsv:1: I5: count"):
        read_batch(path)


def test_non_ascii_file_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "utf8.tsv"
    path.write_text(LINE.replace("\t12\t", "\t１２\t"), encoding="utf-8")
    with pytest.raises(DataError, match="not an ASCII"):
        read_batch(path)
