"""The compiled embedding lookup against its Python definition, on random stores: the same bytes.

The C++ stage (``backends/embedding``: ``lookup.cc``, ``cold_reads.cc``, ``uring.cc``) places
a request's lookups and reads its cold rows in a second language. Its test driver (built by
``make stages``) opens a row store and a hot set as the backend does and answers requests of raw
ids; :meth:`HotColdLookup.open(...).place <export.stage.hot_cold_lookup.HotColdLookup.place>`
answers the same requests. Every answer must be identical, byte for byte: the hot slots, the cold
positions and the cold rows (float32 copied, float16 cast, int8 dequantized per column), for each
of the four ways of reading, with ids of any int64 value (negative, huge, ``INT64_MIN``,
``INT64_MAX``, repeated), bags, all-hot and all-cold requests and an empty hot set; so must the
distinct rows each request reads and the system calls it makes (a row asked for twice is read
once; the read-ahead hints as the Python definition gives them). Every float16 bit pattern is cast as
numpy casts it. A load that fails says what the Python definition says, and a store truncated under a
running lookup fails the requests that read past its end, not the process.

``EMBEDDING_LOOKUP_DRIVER`` names another driver (``make stages-sanitize`` runs this test against
the ASan + UBSan build).
"""

from __future__ import annotations

import mmap
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bundle.schema import NUM_CATEGORICAL
from export.stage.hot_cold_lookup import (
    COLD_READS,
    STORE_META_FILE,
    STORE_ROWS_FILE,
    HotColdLookup,
    StageError,
)
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(
    os.environ.get(
        "EMBEDDING_LOOKUP_DRIVER", ROOT / "build" / "stages" / "embedding" / "embedding_lookup_driver"
    )
)

pytestmark = pytest.mark.skipif(
    not DRIVER.is_file(), reason=f"the compiled stages are not built ({DRIVER} is missing): run `make stages`"
)

INT64 = np.iinfo(np.int64)
#: Threads of the ``threads`` way in these tests (fewer than most requests' spans, more than some).
THREADS = 3


@dataclass(frozen=True)
class Answer:
    """One request's outputs, and what its reads did (distinct rows, system calls)."""

    hot_slots: np.ndarray
    cold_positions: np.ndarray
    cold_rows: np.ndarray
    rows_read: int
    calls: int
    #: Cold lookups whose rows the memory tier held (the driver says with a tier only).
    hits: int = 0


@dataclass(frozen=True)
class Tables:
    """A row store and its hot sets, written once per module."""

    store: Path
    sizes: tuple[int, ...]
    width: int
    hot_sets: dict[str, Path]


def _hot_set(path: Path, sizes: Sequence[int], ids: Sequence[np.ndarray]) -> Path:
    hot = HotSet(
        table_sizes=tuple(sizes),
        row_bytes=(8,) * NUM_CATEGORICAL,
        budget_bytes=10**12,
        ids=tuple(np.asarray(table, dtype=np.int64) for table in ids),
        counts=tuple(np.ones(len(table), dtype=np.int64) for table in ids),
        profiled_lookups=1,
    )
    return hot.save(path)


def _tables(root: Path, dtype: str, seed: int) -> Tables:
    """26 tables of 1 to 200 rows (a few of 1 row); hot sets: a third of each table in a shuffled
    order (slot order is not id order), none, and every row."""
    rng = np.random.default_rng(seed)
    sizes = tuple(int(size) for size in rng.integers(1, 200, NUM_CATEGORICAL))
    sizes = (1, *sizes[1:5], 1, *sizes[6:])
    if dtype == "int8":
        spec = RowStoreSpec.for_wide_deep(sizes, 6, dtype)  # two columns: embedding, wide weight
    else:
        spec = RowStoreSpec.for_dlrm(sizes, 8 if dtype == "float16" else 4, dtype)
    tables: list[np.ndarray] = []
    for size in sizes:
        if dtype == "float16":
            # Any bit pattern: NaN payloads, infinities, subnormals, negative zero.
            bits = rng.integers(0, 1 << 16, (size, spec.width), dtype=np.uint16)
            tables.append(bits.view(np.float16))
        else:
            values = rng.normal(0, 2, (size, spec.width)).astype(np.float32)
            if dtype == "int8" and size > 2:
                values[1] = 0.5  # a row whose columns are constant: scale 0
            tables.append(values)
    store = root / f"store-{dtype}"
    write_arrays(store, spec, tables)
    some = [rng.permutation(size)[: max(1, size // 3)] if size > 1 else np.zeros(0) for size in sizes]
    every = [rng.permutation(size) for size in sizes]
    hot_sets = {
        "some": _hot_set(root / f"hot-some-{dtype}.npz", sizes, some),
        "none": _hot_set(root / f"hot-none-{dtype}.npz", sizes, [np.zeros(0)] * NUM_CATEGORICAL),
        "all": _hot_set(root / f"hot-all-{dtype}.npz", sizes, every),
    }
    return Tables(store, sizes, spec.width, hot_sets)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tables]:
    root = tmp_path_factory.mktemp("native-lookup")
    return {dtype: _tables(root, dtype, seed) for seed, dtype in enumerate(("float32", "float16", "int8"))}


def _ids(rng: np.random.Generator, sizes: Sequence[int], hotness: Sequence[int], batch: int) -> np.ndarray:
    """``batch x sum(hotness)`` raw ids: in range, negative, huge, the int64 extremes, repeats."""
    positions = np.repeat(np.asarray(sizes, dtype=np.int64), hotness)
    ids = rng.integers(0, positions, (batch, positions.size))
    wild = rng.random(ids.shape) < 0.3
    ids[wild] = rng.integers(INT64.min, INT64.max, int(wild.sum()), dtype=np.int64, endpoint=True)
    edges = np.array([INT64.min, INT64.max, -1, 0, 1, INT64.min + 1, INT64.max - 1], dtype=np.int64)
    picked = rng.random(ids.shape) < 0.1
    ids[picked] = rng.choice(edges, int(picked.sum()))
    negative = rng.random(ids.shape) < 0.1
    ids[negative] = -np.broadcast_to(positions, ids.shape)[negative] * rng.integers(1, 4, int(negative.sum()))
    if batch > 2:
        ids[batch // 2] = ids[0]  # a row repeated: its cold rows read once
    return ids


def _case(
    tables: Tables,
    hot_set: str,
    way: str,
    requests: Sequence[np.ndarray],
    hotness: Sequence[int] | None = None,
    extra: Sequence[str] = (),
) -> str:
    lines = [
        f"store {tables.store}",
        f"hot_set {tables.hot_sets[hot_set]}",
        "table_sizes " + ",".join(map(str, tables.sizes)),
        f"way {way}",
        f"threads {THREADS}",
        *extra,
    ]
    if hotness is not None:
        lines.append("hotness " + ",".join(map(str, hotness)))
    for ids in requests:
        lines.append(f"ids {ids.shape[0]} {ids.shape[1]} " + " ".join(map(str, ids.reshape(-1).tolist())))
    return "\n".join(lines) + "\n"


def _parse(output: str) -> tuple[dict[str, str], list[Answer | str]]:
    """The driver's header lines (``fallback``, ``slot_map``, ``hot_bits``) and one answer or error per
    request."""
    header: dict[str, str] = {}
    answers: list[Answer | str] = []
    fields: dict[str, list[str]] = {}
    for line in output.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("fallback", "slot_map", "hot_bits", "direct", "tier"):
            header[key] = rest
        elif key == "error":
            answers.append(rest)
        elif key == "reads":
            distinct, calls = (int(value) for value in rest.split())
            answers.append(
                Answer(
                    _array(fields["hot_slots"], np.int64),
                    _array(fields["cold_positions"], np.int64),
                    _array(fields["cold_rows"], np.float32),
                    distinct,
                    calls,
                    int(fields["hits"][0]) if "hits" in fields else 0,
                )
            )
            fields = {}
        else:
            fields[key] = rest.split()
    return header, answers


def _array(parts: list[str], dtype: Any) -> np.ndarray:
    *shape, data = parts
    raw = b"" if data == "-" else bytes.fromhex(data)
    return np.frombuffer(raw, dtype=dtype).reshape([int(size) for size in shape])


def _drive(case: str) -> tuple[dict[str, str], list[Answer | str]]:
    completed = subprocess.run(
        [str(DRIVER)], input=case, capture_output=True, text=True, check=False, timeout=300
    )
    assert completed.returncode in (0, 1), completed.stderr
    return _parse(completed.stdout)


def _expected(
    tables: Tables,
    hot_set: str,
    way: str,
    requests: Sequence[np.ndarray],
    hotness: Sequence[int] | None = None,
    hint_rows: int | None = None,
) -> list[Answer]:
    options: dict[str, Any] = {} if hint_rows is None else {"hint_rows": hint_rows}
    lookup = HotColdLookup.open(
        tables.store, tables.hot_sets[hot_set], tables.sizes, cold_reads=way, threads=THREADS,
        hotness=hotness, **options,
    )  # fmt: skip
    try:
        answers = []
        for ids in requests:
            placed = lookup.place(ids)
            answers.append(
                Answer(
                    placed.hot_slots,
                    placed.cold_positions,
                    placed.cold_rows,
                    placed.cold_distinct_rows,
                    placed.cold_reads,
                )
            )
        return answers
    finally:
        lookup.close()


def _assert_same(got: Sequence[Answer | str], expected: Sequence[Answer], counts: bool = True) -> None:
    assert len(got) == len(expected)
    for index, (answer, want) in enumerate(zip(got, expected, strict=True)):
        assert isinstance(answer, Answer), (index, answer)
        assert answer.hot_slots.shape == want.hot_slots.shape, index
        assert answer.hot_slots.tobytes() == np.ascontiguousarray(want.hot_slots, dtype=np.int64).tobytes(), (
            index
        )
        assert answer.cold_positions.tobytes() == want.cold_positions.astype(np.int64).tobytes(), index
        assert answer.cold_rows.shape == want.cold_rows.shape, index
        assert answer.cold_rows.tobytes() == np.ascontiguousarray(want.cold_rows).tobytes(), index
        if counts:
            assert (answer.rows_read, answer.calls) == (want.rows_read, want.calls), index


def _requests(tables: Tables, seed: int, hotness: Sequence[int] | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = (1,) * NUM_CATEGORICAL if hotness is None else tuple(hotness)
    return [_ids(rng, tables.sizes, counts, batch) for batch in (1, 7, 64, 300)]


@pytest.mark.parametrize("way", COLD_READS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_every_way_answers_as_the_python_stage(stores: dict[str, Tables], dtype: str, way: str) -> None:
    tables = stores[dtype]
    requests = _requests(tables, seed=len(way) * 7 + len(dtype))
    header, got = _drive(_case(tables, "some", way, requests))
    assert header.get("slot_map") == "1" and header.get("hot_bits") == "1" and "fallback" not in header, (
        header
    )
    _assert_same(got, _expected(tables, "some", way, requests))


@pytest.mark.parametrize("way", COLD_READS)
def test_bags_are_placed_in_their_tables(stores: dict[str, Tables], way: str) -> None:
    tables = stores["float16"]
    hotness = tuple(int(count) for count in np.random.default_rng(5).integers(1, 4, NUM_CATEGORICAL))
    requests = _requests(tables, seed=9, hotness=hotness)
    _, got = _drive(_case(tables, "some", way, requests, hotness=hotness))
    _assert_same(got, _expected(tables, "some", way, requests, hotness=hotness))


@pytest.mark.parametrize("hot_set", ["none", "all"])
@pytest.mark.parametrize("way", ["io_uring", "fault"])
def test_all_cold_all_hot_and_an_empty_hot_set(stores: dict[str, Tables], way: str, hot_set: str) -> None:
    tables = stores["int8"]
    requests = _requests(tables, seed=3)
    header, got = _drive(_case(tables, hot_set, way, requests))
    # No hot ids: no slot map, every lookup cold; every row hot: no cold row at all.
    assert header.get("slot_map") == ("0" if hot_set == "none" else "1"), header
    _assert_same(got, _expected(tables, hot_set, way, requests))
    for answer in got:
        assert isinstance(answer, Answer)
        cold = answer.cold_positions.size
        assert cold == (answer.hot_slots.size if hot_set == "none" else 0)


def test_the_binary_search_answers_as_the_slot_map(stores: dict[str, Tables]) -> None:
    """Above the slot map's limit (forced here with 0 bytes) the lookup searches the sorted keys."""
    tables = stores["float32"]
    requests = _requests(tables, seed=4)
    header, got = _drive(_case(tables, "some", "prefetch", requests, extra=["slot_map_max_bytes 0"]))
    assert header.get("slot_map") == "0" and header.get("hot_bits") == "0", header
    _assert_same(got, _expected(tables, "some", "prefetch", requests))


def test_the_hot_bits_before_the_binary_search_answer_as_the_slot_map(stores: dict[str, Tables]) -> None:
    """Where a bit a row fits the limit and the slot map does not, the bits tell the cold lookups
    and only the hot ones search the keys."""
    tables = stores["float32"]
    requests = _requests(tables, seed=5)
    limit = (sum(tables.sizes) + 7) // 8
    header, got = _drive(_case(tables, "some", "prefetch", requests, extra=[f"slot_map_max_bytes {limit}"]))
    assert header.get("slot_map") == "0" and header.get("hot_bits") == "1", header
    _assert_same(got, _expected(tables, "some", "prefetch", requests))


@pytest.mark.parametrize("hint_rows", [0, 1, 10_000])
def test_the_read_ahead_hints_follow_hint_rows(stores: dict[str, Tables], hint_rows: int) -> None:
    tables = stores["float32"]
    requests = _requests(tables, seed=6)
    _, got = _drive(_case(tables, "some", "io_uring", requests, extra=[f"hint_rows {hint_rows}"]))
    _assert_same(got, _expected(tables, "some", "io_uring", requests, hint_rows=hint_rows))


def test_a_small_ring_takes_the_reads_in_turns(stores: dict[str, Tables]) -> None:
    """A ring of 16 entries reads hundreds of rows in turns that wrap around it: the same bytes, and
    one io_uring_enter per turn."""
    tables = stores["float16"]
    requests = _requests(tables, seed=12)
    header, got = _drive(_case(tables, "some", "io_uring", requests, extra=["ring_entries 16"]))
    assert "fallback" not in header, header
    # The Python definition's ring has 1024 entries: the same hints, more turns here.
    expected = [
        replace(want, calls=want.calls - (-(-want.rows_read // 1024)) + -(-want.rows_read // 16))
        for want in _expected(tables, "some", "io_uring", requests)
    ]
    _assert_same(got, expected)
    assert any(want.rows_read > 16 for want in expected)


def test_a_ring_the_kernel_refuses_reads_the_prefetch_way(stores: dict[str, Tables]) -> None:
    """io_uring_setup refused (here: more entries than the kernel allows; elsewhere a seccomp
    profile or an old kernel): the reason, and the prefetch way's reads."""
    tables = stores["int8"]
    requests = _requests(tables, seed=13)
    header, got = _drive(_case(tables, "some", "io_uring", requests, extra=[f"ring_entries {1 << 20}"]))
    assert header.get("fallback") == (
        "io_uring_setup refused: Invalid argument; cold rows are read the 'prefetch' way"
    ), header
    _assert_same(got, _expected(tables, "some", "prefetch", requests))


@pytest.mark.parametrize("way", ["io_uring", "fault"])
def test_every_float16_pattern_is_cast_as_numpy_casts_it(tmp_path: Path, way: str) -> None:
    patterns = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    sizes = (8192, *(1,) * (NUM_CATEGORICAL - 1))
    tables = [patterns.reshape(8192, 8), *(np.zeros((1, 8), dtype=np.float16),) * (NUM_CATEGORICAL - 1)]
    write_arrays(tmp_path / "store", RowStoreSpec.for_dlrm(sizes, 8, "float16"), tables)
    hot = _hot_set(tmp_path / "hot.npz", sizes, [np.zeros(0)] * NUM_CATEGORICAL)
    store = Tables(tmp_path / "store", sizes, 8, {"none": hot})
    ids = np.zeros((8192, NUM_CATEGORICAL), dtype=np.int64)
    ids[:, 0] = np.arange(8192)
    _, got = _drive(_case(store, "none", way, [ids]))
    answer = got[0]
    assert isinstance(answer, Answer)
    rows = answer.cold_rows.reshape(8192, NUM_CATEGORICAL, 8)[:, 0]
    assert rows.reshape(-1).view(np.uint32).tobytes() == patterns.astype(np.float32).view(np.uint32).tobytes()
    _assert_same(got, _expected(store, "none", way, [ids]))


def _python_error(store: Path, hot_set: Path, sizes: Sequence[int], fingerprint: str = "") -> str:
    with pytest.raises(StageError) as caught:
        HotColdLookup.open(store, hot_set, sizes, fingerprint=fingerprint)
    return str(caught.value)


def _load_error(case: str) -> str:
    completed = subprocess.run(
        [str(DRIVER)], input=case, capture_output=True, text=True, check=False, timeout=60
    )
    assert completed.returncode == 1, (completed.stdout, completed.stderr)
    assert completed.stdout.startswith("error load "), completed.stdout
    return completed.stdout.removeprefix("error load ").rstrip("\n")


def test_a_load_that_fails_says_what_the_python_stage_says(stores: dict[str, Tables], tmp_path: Path) -> None:
    tables = stores["float32"]
    ids = np.zeros((1, NUM_CATEGORICAL), dtype=np.int64)
    other_sizes = (tables.sizes[0] + 1, *tables.sizes[1:])
    bad_hot = tmp_path / "bad-hot.npz"
    sizes_array = np.asarray(tables.sizes, dtype=np.int64)
    hot_arrays: dict[str, np.ndarray] = {"table_sizes": sizes_array}
    hot_arrays.update({f"ids_C{t + 1}": np.zeros(0, dtype=np.int64) for t in range(NUM_CATEGORICAL)})
    hot_arrays["ids_C4"] = np.array([0, tables.sizes[3]], dtype=np.int64)  # out of its table
    with bad_hot.open("wb") as handle:
        np.savez(handle, **hot_arrays)
    twice = tmp_path / "twice-hot.npz"
    hot_arrays["ids_C4"] = np.array([0, 0], dtype=np.int64)  # not distinct
    with twice.open("wb") as handle:
        np.savez(handle, **hot_arrays)
    other_hot = _hot_set(tmp_path / "other-hot.npz", other_sizes, [np.zeros(0)] * NUM_CATEGORICAL)
    cases = [
        # The config's sizes differ from the store's.
        (tables.store, tables.hot_sets["some"], other_sizes, ""),
        # Another store than the one the stage was exported against.
        (tables.store, tables.hot_sets["some"], tables.sizes, "0123456789abcdef" * 4),
        # A hot set of other sizes; hot ids out of their table; hot ids twice.
        (tables.store, other_hot, tables.sizes, ""),
        (tables.store, bad_hot, tables.sizes, ""),
        (tables.store, twice, tables.sizes, ""),
        # No store, no hot set.
        (tmp_path / "nowhere", tables.hot_sets["some"], tables.sizes, ""),
        (tables.store, tmp_path / "nowhere.npz", tables.sizes, ""),
    ]
    for store, hot_set, sizes, fingerprint in cases:
        expected = _python_error(store, hot_set, sizes, fingerprint)
        lines = [
            f"store {store}",
            f"hot_set {hot_set}",
            "table_sizes " + ",".join(map(str, sizes)),
            "way fault",
        ]
        if fingerprint:
            lines.append(f"fingerprint {fingerprint}")
        lines.append(f"ids 1 {NUM_CATEGORICAL} " + " ".join(map(str, ids.reshape(-1).tolist())))
        assert _load_error("\n".join(lines) + "\n") == expected


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("way", ["io_uring", "prefetch", "threads"])
def test_a_store_truncated_under_the_lookup_fails_the_request_not_the_process(
    tmp_path: Path, way: str, cache: bool
) -> None:
    """Reads past the end of a store cut short after it was opened: that request's error; the
    requests before and after it (reading rows still there) are answered. With a cache, the
    io_uring way's O_DIRECT reads of whole blocks find the end too."""
    sizes = (4096, *(1,) * (NUM_CATEGORICAL - 1))
    values = np.random.default_rng(2).normal(0, 1, (4096, 4)).astype(np.float32)
    tables = [values, *(np.zeros((1, 4), dtype=np.float32),) * (NUM_CATEGORICAL - 1)]
    store = tmp_path / "store"
    write_arrays(store, RowStoreSpec.for_dlrm(sizes, 4), tables)
    # The one-row tables are hot: only C1's lookups read the store.
    hot = _hot_set(tmp_path / "hot.npz", sizes, [np.zeros(0), *[np.zeros(1)] * (NUM_CATEGORICAL - 1)])
    spec = Tables(store, sizes, 4, {"c1": hot})

    def request(rows: Sequence[int]) -> str:
        ids = np.zeros((len(rows), NUM_CATEGORICAL), dtype=np.int64)
        ids[:, 0] = rows
        return f"ids {ids.shape[0]} {ids.shape[1]} " + " ".join(map(str, ids.reshape(-1).tolist())) + "\n"

    driver = subprocess.Popen(
        [str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert driver.stdin is not None and driver.stdout is not None
    try:
        extra = ["cache_bytes 100000"] if cache else []
        driver.stdin.write(_case(spec, "c1", way, [], extra=extra) + request([5, 4000, 5]))
        driver.stdin.flush()
        # slot_map, hot_bits (and tier, direct), then one answer (with hits)
        lines = [driver.stdout.readline() for _ in range(9 if cache else 6)]
        assert lines[0].startswith("slot_map") and lines[-1].startswith("reads 2 "), lines
        # Cut rows.bin to its first 1024 rows (the 25 one-row tables lie after them).
        os.truncate(store / STORE_ROWS_FILE, 1024 * 16)
        driver.stdin.write(request([3, 3000]) + request([7, 1]))
        driver.stdin.close()
        rest = driver.stdout.read().splitlines()
        assert driver.wait(timeout=60) == 0, driver.stderr.read() if driver.stderr else ""
    finally:
        if driver.poll() is None:
            driver.kill()
    assert rest[0].startswith("error request ") and "short read" in rest[0], rest
    assert rest[-1].startswith("reads 2 "), rest
    assert (store / STORE_META_FILE).is_file()


def _reads_direct(path: Path) -> bool:
    """Whether the file system under ``path`` reads with O_DIRECT: one aligned read of a block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, mmap.PAGESIZE) as buffer:  # page-aligned memory
            os.preadv(fd, [buffer], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _cold_keys(tables: Tables, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The store row of each cold lookup of ``ids`` (one id per table) at ``positions``."""
    sizes = np.asarray(tables.sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    columns = positions % len(sizes)
    return np.mod(ids.reshape(-1)[positions], sizes[columns]) + offsets[columns]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("way", ["io_uring", "prefetch", "threads"])
def test_a_tier_of_the_whole_store_answers_as_the_python_stage(
    stores: dict[str, Tables], dtype: str, way: str
) -> None:
    """A tier larger than the store holds every row in its place: the same bytes; each request's
    cold lookups whose rows an earlier request read come from the tier, the store reads the
    others' distinct rows; the same requests again read nothing. The io_uring way reads what the
    tier misses with O_DIRECT where the file system allows it."""
    tables = stores[dtype]
    requests = _requests(tables, seed=21)
    header, got = _drive(_case(tables, "some", way, [*requests, *requests], extra=["cache_bytes 10000000"]))
    expected = _expected(tables, "some", way, requests)
    _assert_same(got, [*expected, *expected], counts=False)
    assert header.get("tier") == f"whole {sum(tables.sizes)}", header
    if way == "io_uring" and _reads_direct(tables.store / STORE_ROWS_FILE):
        assert header.get("direct") == "with O_DIRECT", header
    elif way == "io_uring":
        assert header.get("direct", "").startswith("through the page cache (the file system refuses"), header
    else:
        assert header.get("direct") == (
            f"through the page cache (O_DIRECT reads go through io_uring, and the way is {way})"
        ), header
    first, again = got[: len(requests)], got[len(requests) :]
    seen: set[int] = set()
    for answer, want, ids in zip(first, expected, requests, strict=True):
        assert isinstance(answer, Answer)
        keys = _cold_keys(tables, ids, want.cold_positions).tolist()
        new = set(keys) - seen
        assert (answer.hits, answer.rows_read) == (sum(key in seen for key in keys), len(new))
        seen |= new
    assert any(isinstance(answer, Answer) and answer.hits > 0 for answer in first)  # rows shared
    for answer, want in zip(again, expected, strict=True):
        assert isinstance(answer, Answer)
        assert (answer.hits, answer.rows_read, answer.calls) == (want.cold_positions.size, 0, 0)


def test_the_default_tier_holds_a_small_store_whole(stores: dict[str, Tables]) -> None:
    """``cache_bytes default``, the backend's default: a store far smaller than a quarter of the
    machine's memory is held whole."""
    tables = stores["float32"]
    requests = _requests(tables, seed=26)
    header, got = _drive(_case(tables, "some", "io_uring", requests, extra=["cache_bytes default"]))
    assert header.get("tier") == f"whole {sum(tables.sizes)}", header
    _assert_same(got, _expected(tables, "some", "io_uring", requests), counts=False)


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_a_cache_smaller_than_the_traffic_gives_up_rows_and_answers_the_same(
    stores: dict[str, Tables], rows: int
) -> None:
    """Tiers of 1, 7 and 300 rows, smaller than the store (one shard, more shards than rows...
    shards of a few rows), under requests that keep replacing what they hold: every answer the same
    bytes; a request's distinct rows read are at most those it would read without a tier, and a
    request whose rows are all distinct and new to the tier reads them all."""
    tables = stores["float32"]
    requests = [*_requests(tables, seed=22), *_requests(tables, seed=23), *_requests(tables, seed=22)]
    row_bytes = tables.width * 4
    tier = [f"cache_bytes {rows * row_bytes}"]
    header, got = _drive(_case(tables, "some", "io_uring", requests, extra=tier))
    assert header.get("tier") == f"rows {rows}", header
    expected = _expected(tables, "some", "io_uring", requests)
    _assert_same(got, expected, counts=False)
    for answer, want in zip(got, expected, strict=True):
        assert isinstance(answer, Answer)
        assert answer.rows_read <= want.rows_read
        assert answer.hits <= want.cold_positions.size
    first = got[0]
    assert isinstance(first, Answer) and (first.hits, first.rows_read) == (0, expected[0].rows_read)
    assert any(isinstance(answer, Answer) and answer.hits > 0 for answer in got)


def test_a_cache_for_a_ring_the_kernel_refuses_reads_through_the_page_cache(
    stores: dict[str, Tables],
) -> None:
    tables = stores["float16"]
    requests = _requests(tables, seed=24)
    extra = [f"ring_entries {1 << 20}", "cache_bytes 10000000"]
    header, got = _drive(_case(tables, "some", "io_uring", requests, extra=extra))
    assert header.get("direct") == (
        "through the page cache (O_DIRECT reads go through io_uring, and the way is prefetch)"
    ), header
    _assert_same(got, _expected(tables, "some", "prefetch", requests), counts=False)


@pytest.mark.parametrize(
    ("way", "cache_bytes", "says"),
    [
        (
            "fault",
            4096,
            "a cold row cache needs cold_reads io_uring, prefetch or threads: 'fault' maps the store",
        ),
        ("io_uring", 15, "a cold row cache of 15 bytes holds no row of 16 bytes"),
    ],
)
def test_a_cache_that_cannot_be_fails_the_load(
    stores: dict[str, Tables], way: str, cache_bytes: int, says: str
) -> None:
    tables = stores["float32"]
    assert tables.width * 4 == 16
    header, got = _drive(
        _case(tables, "some", way, _requests(tables, seed=25)[:1], extra=[f"cache_bytes {cache_bytes}"])
    )
    assert got == [f"load {says}"], (header, got)


@pytest.mark.parametrize("copy_threads", [1, 3])
def test_a_large_request_copied_by_several_threads_answers_the_same(
    stores: dict[str, Tables], copy_threads: int
) -> None:
    """A request of 2,000 rows (thousands of cold lookups, past the stage's share-out size) copied out
    of a whole tier by one thread and by three, each a share: the same bytes and counts as the
    Python stage."""
    tables = stores["float16"]
    rng = np.random.default_rng(31)
    requests = [*_requests(tables, seed=31), _ids(rng, tables.sizes, (1,) * NUM_CATEGORICAL, 2000)]
    extra = ["cache_bytes 10000000", f"copy_threads {copy_threads}"]
    header, got = _drive(_case(tables, "some", "io_uring", [*requests, *requests], extra=extra))
    assert header.get("tier") == f"whole {sum(tables.sizes)}", header
    expected = _expected(tables, "some", "io_uring", requests)
    _assert_same(got, [*expected, *expected], counts=False)
    for answer, want in zip(got[len(requests) :], expected, strict=True):
        assert isinstance(answer, Answer)
        assert (answer.hits, answer.rows_read) == (want.cold_positions.size, 0)
