"""The stage's io_uring reads: the file's bytes, errors named, and the prefetch way where it is refused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from export.stage import hot_cold_lookup
from export.stage.hot_cold_lookup import COLD_READ_PREFETCH, COLD_READ_URING, ColdReads
from export.stage.uring import Ring, RingUnavailable


@pytest.fixture
def ring() -> Iterator[Ring]:
    try:
        opened = Ring(entries=16)
    except RingUnavailable as exc:  # a kernel or sandbox without io_uring: the fallback tests still run
        pytest.skip(f"no io_uring here: {exc}")
    yield opened
    opened.close()


@pytest.fixture
def data_file(tmp_path: Path) -> Iterator[tuple[int, np.ndarray]]:
    data = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def test_many_scattered_reads_give_the_files_bytes(ring: Ring, data_file: tuple[int, np.ndarray]) -> None:
    fd, data = data_file
    rng = np.random.default_rng(1)
    # More reads than the ring's entries (taken in turns), of 1 to 5000 bytes, some across pages.
    lengths = rng.integers(1, 5000, 100).astype(np.uint32)
    offsets = rng.integers(0, data.size - 5000, 100).astype(np.uint64)
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lengths.astype(np.int64))[:-1]))
    ring.read(fd, offsets, out.ctypes.data + starts, lengths)
    expected = np.concatenate([data[int(o) : int(o) + int(n)] for o, n in zip(offsets, lengths, strict=True)])
    assert out.tobytes() == expected.tobytes()
    # An empty batch is no read at all.
    ring.read(fd, np.zeros(0), np.zeros(0), np.zeros(0))


def test_batches_that_wrap_around_the_ring_read_their_own_bytes(
    ring: Ring, data_file: tuple[int, np.ndarray]
) -> None:
    fd, data = data_file
    rng = np.random.default_rng(3)
    # 5 + 16 + 13 + 7 + 16 reads into a ring of 16: most batches start mid-ring and wrap.
    for count in (5, 16, 13, 7, 16):
        offsets = rng.integers(0, data.size - 256, count).astype(np.uint64)
        out = np.zeros((count, 256), dtype=np.uint8)
        # One length for every read.
        ring.read(fd, offsets, out.ctypes.data + 256 * np.arange(count), 256)
        expected = np.stack([data[int(o) : int(o) + 256] for o in offsets])
        assert out.tobytes() == expected.tobytes(), count


def test_a_read_past_the_end_or_of_a_bad_file_is_an_error(
    ring: Ring, data_file: tuple[int, np.ndarray]
) -> None:
    fd, data = data_file
    out = np.zeros(64, dtype=np.uint8)
    with pytest.raises(OSError, match=f"short read: 10 of 64 bytes at offset {data.size - 10}"):
        ring.read(fd, np.array([data.size - 10]), np.array([out.ctypes.data]), np.array([64]))
    assert out[:10].tobytes() == data[-10:].tobytes()
    with pytest.raises(OSError, match="Bad file descriptor"):
        ring.read(987_654, np.array([0]), np.array([out.ctypes.data]), np.array([8]))
    # The ring still reads after both.
    ring.read(fd, np.array([5]), np.array([out.ctypes.data]), np.array([8]))
    assert out[:8].tobytes() == data[5:13].tobytes()


def test_io_uring_refused_reads_the_prefetch_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = np.random.default_rng(2).normal(size=(500, 33)).astype(np.float16)
    path = tmp_path / "rows.bin"
    path.write_bytes(rows.tobytes())

    def refused(*_: object, **__: object) -> Ring:
        raise RingUnavailable(1, "io_uring_setup refused: Operation not permitted")

    monkeypatch.setattr(hot_cold_lookup, "Ring", refused)
    reads = ColdReads(rows, COLD_READ_URING, rows_path=path)
    try:
        refusal = "io_uring_setup refused: Operation not permitted"
        assert reads.fallback == f"{refusal}; cold rows are read the '{COLD_READ_PREFETCH}' way"
        keys = np.array([499, 3, 3, 250, 0], dtype=np.int64)
        got = reads.start(keys)
        assert got.reads >= 2  # hints and preads: the prefetch way
        assert got.result().tobytes() == rows[keys].astype(np.float32).tobytes()
    finally:
        reads.close()
