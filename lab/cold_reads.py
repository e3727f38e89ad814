"""Cold rows at the disk's speed: the embedding stage's ways of reading them, on a store not in memory.

``python -m lab cold-reads --repository DIR --data HELDOUT.tsv`` opens the row
store and hot set of a hot/cold model's embedding stage (its ``config.pbtxt``
names them) and, in this process, places requests of held-out rows the way the
stage does (:meth:`~export.stage.hot_cold_lookup.HotColdLookup.place`),
once per way of reading cold rows (:class:`~export.stage.hot_cold_lookup.ColdReads`):

- *cold*: the store is evicted from the page cache first (this process's mapping
  dropped, then ``posix_fadvise(DONTNEED)``; :func:`resident_bytes` checks it), and
  every request has rows never sent before, so its cold rows come from disk;
- *warm*: the same requests again, their rows now in memory.

The ways take turns (``rounds``), each on rows of its own. Beside them the disk's
own random-read rate is measured in the same run (:func:`probe_disk`: 4 KiB
``O_DIRECT`` reads of ``rows.bin`` at random pages, by 1 and 8 threads, and 32 kept
in flight by Linux AIO), and each request's *disk-bound time* is its cold pages
divided by the best of those rates. The report gives, per way and batch size, the
median stage time per request, cold and warm, and its ratio to the disk-bound time;
``cold_reads.json``, ``cold_reads.md`` and ``cold_reads.png``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ConfigError
from bundle.records import RunRecord, machine_with_flags
from bundle.repository import read_config
from bundle.snippets import section_end, section_start
from criteo.tsv import iter_batches
from export.stage.hot_cold_lookup import (
    COLD_READ_URING,
    COLD_READS,
    DEFAULT_COLD_READ_THREADS,
    PARAM_HOT_SET,
    PARAM_ROW_STORE,
    PARAM_TABLE_SIZES,
    STORE_ROWS_FILE,
    ColdReads,
    HotColdLookup,
    StoreRows,
    open_store,
    read_hot_ids,
)
from loadtest.engine.client_cpu import process_cpu_s
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown

logger = logging.getLogger(__name__)

#: Threads of the threaded disk probe: one read at a time, then eight.
PROBE_THREADS = (1, 8)
#: Reads kept in flight by the AIO probe (no thread per read: the disk's queue, not Python's, limits).
AIO_DEPTH = 32
#: Bytes of one probe read: the kernel's page, what a cold row costs.
PROBE_BYTES = 4096
#: A way measured beside the stage's: ``io_uring`` without its read-ahead hints, at any size.
URING_NO_HINTS = "io_uring-no-hints"
#: Every way the benchmark compares.
WAYS = (*COLD_READS, URING_NO_HINTS)


@dataclass(frozen=True)
class ColdReadOptions:
    """What to measure.

    Args:
        repository: a repository holding a hot/cold model.
        stage: the embedding stage's model name.
        data: held-out Criteo TSV; its rows are the requests, each sent once.
        batch_sizes: rows per request.
        requests: measured requests per way, batch size and round.
        rounds: turns the ways take.
        ways: the ways compared (:data:`WAYS`: the stage's, and :data:`URING_NO_HINTS`).
        threads: threads of the ``threads`` way.
        probe_seconds: seconds of each disk probe.
    """

    repository: Path
    stage: str = "dlrm_embedding"
    data: Path = Path("heldout.tsv")
    batch_sizes: tuple[int, ...] = (64, 1024)
    requests: int = 30
    rounds: int = 2
    ways: tuple[str, ...] = WAYS
    threads: int = DEFAULT_COLD_READ_THREADS
    probe_seconds: float = 3.0

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if self.requests < 3 or self.rounds < 1:
            raise ConfigError(f"need requests >= 3 and rounds >= 1, got {self.requests} and {self.rounds}")
        unknown = [way for way in self.ways if way not in WAYS]
        if unknown or not self.ways:
            raise ConfigError(f"ways must be some of {', '.join(map(repr, WAYS))}; got {list(self.ways)}")
        if self.threads < 1 or self.probe_seconds <= 0:
            raise ConfigError("threads must be >= 1 and probe seconds > 0")

    def rows_needed(self) -> int:
        """Held-out rows the run sends (each once)."""
        return sum(self.batch_sizes) * self.requests * self.rounds * len(self.ways)


# ------------------------------------------------------------------ the store's residency
def resident_bytes(store: StoreRows) -> int:
    """Bytes of ``rows.bin`` in the page cache (``mincore`` over the store's mapping)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    address = int(store.data.__array_interface__["data"][0])
    size = int(store.data.nbytes)
    pages = -(-size // mmap.PAGESIZE)
    vector = np.zeros(pages, dtype=np.uint8)
    if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector.ctypes.data_as(ctypes.c_void_p)):
        raise OSError(ctypes.get_errno(), f"mincore on {store.path / STORE_ROWS_FILE} failed")
    return int(np.count_nonzero(vector & 1)) * mmap.PAGESIZE


def evict(store: StoreRows) -> int:
    """Drop ``rows.bin`` from the page cache; the bytes still resident after (other mappers keep theirs).

    This process's mapping is dropped first (a mapped page cannot be evicted), then the
    file's pages are dropped (``posix_fadvise(DONTNEED)``).
    """
    if store.mapping is not None:
        store.mapping.madvise(mmap.MADV_DONTNEED)
    fd = os.open(store.path / STORE_ROWS_FILE, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_bytes(store)


# ------------------------------------------------------------------ the disk's own rate
@dataclass(frozen=True)
class DiskProbe:
    """Random 4 KiB reads of the store's file, straight from disk (``O_DIRECT``).

    ``threads`` is the queue depth: threads each with one read in flight, or reads kept
    queued by Linux AIO (``how``).
    """

    threads: int
    reads: int
    seconds: float
    how: str = "threads"

    @property
    def iops(self) -> float:
        return self.reads / self.seconds

    @property
    def mean_latency_us(self) -> float:
        """Mean time of one read (``threads`` reads always in flight)."""
        return self.threads * self.seconds / self.reads * 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            "queue_depth": self.threads,
            "how": self.how,
            "iops": self.iops,
            "mean_latency_us": self.mean_latency_us,
            "reads": self.reads,
        }


def disk_iops(path: Path, threads: int, seconds: float, seed: int = 0) -> DiskProbe:
    """Random page-aligned 4 KiB reads of ``path`` by ``threads`` threads for ``seconds``.

    ``O_DIRECT`` bypasses the page cache, so every read is the disk's; each thread keeps
    one read in flight, so ``threads`` is the queue depth.
    """
    size = path.stat().st_size
    pages = size // PROBE_BYTES
    if pages < 1:
        raise ConfigError(f"{path} is smaller than one page")
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def reader(index: int) -> None:
        rng = np.random.default_rng(seed + index)
        offsets = (rng.integers(0, pages, 1 << 16) * PROBE_BYTES).tolist()
        buffer = mmap.mmap(-1, PROBE_BYTES)  # page-aligned, as O_DIRECT needs
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            done = 0
            while time.perf_counter() < stop:
                os.preadv(fd, [buffer], offsets[done % len(offsets)])
                done += 1
            counts[index] = done
        finally:
            os.close(fd)
            buffer.close()

    started = time.perf_counter()
    workers = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return DiskProbe(threads, sum(counts), time.perf_counter() - started)


#: Linux AIO's system call numbers (io_setup, io_destroy, io_getevents, io_submit) by machine.
_AIO_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
#: ``struct iocb`` (64 bytes) and ``struct io_event`` (32 bytes) of <linux/aio_abi.h>, little-endian.
_IOCB = np.dtype(
    [
        ("data", "<u8"), ("key", "<u4"), ("rw_flags", "<u4"), ("opcode", "<u2"), ("reqprio", "<i2"),
        ("fildes", "<u4"), ("buf", "<u8"), ("nbytes", "<u8"), ("offset", "<i8"), ("reserved2", "<u8"),
        ("flags", "<u4"), ("resfd", "<u4"),
    ]
)  # fmt: skip
_IO_EVENT = np.dtype([("data", "<u8"), ("obj", "<u8"), ("res", "<i8"), ("res2", "<i8")])


def disk_iops_aio(path: Path, depth: int, seconds: float, seed: int = 0) -> DiskProbe:
    """Random page-aligned 4 KiB reads of ``path`` with ``depth`` always in flight (Linux AIO).

    One thread keeps ``depth`` ``O_DIRECT`` reads queued with ``io_submit`` and refills
    them as ``io_getevents`` returns them, so the queue depth is the disk's, not the
    number of Python threads (which, on a small machine, cap a threaded probe first).

    Raises:
        OSError: Linux AIO is missing or refuses (the caller keeps the threaded probes).
    """
    import platform

    numbers = _AIO_SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(f"no Linux AIO system call numbers for {platform.machine()}")
    setup, destroy, getevents, submit = numbers
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pages = path.stat().st_size // PROBE_BYTES
    rng = np.random.default_rng(seed)
    buffers = mmap.mmap(-1, depth * PROBE_BYTES)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffers))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    context = ctypes.c_ulong(0)
    iocbs = np.zeros(depth, dtype=_IOCB)
    events = np.zeros(depth, dtype=_IO_EVENT)
    pointers = np.zeros(depth, dtype=np.uint64)
    try:
        if libc.syscall(setup, depth, ctypes.byref(context)) < 0:
            raise OSError(ctypes.get_errno(), "io_setup failed")
        iocbs["fildes"] = fd
        iocbs["nbytes"] = PROBE_BYTES
        iocbs["buf"] = base + np.arange(depth, dtype=np.uint64) * PROBE_BYTES
        iocbs["offset"] = rng.integers(0, pages, depth) * PROBE_BYTES
        first = iocbs.ctypes.data
        pointers[:] = first + np.arange(depth, dtype=np.uint64) * _IOCB.itemsize
        if libc.syscall(submit, context, depth, ctypes.c_void_p(pointers.ctypes.data)) != depth:
            raise OSError(ctypes.get_errno(), "io_submit failed")
        done, started = 0, time.perf_counter()
        stop = started + seconds
        while True:
            got = libc.syscall(getevents, context, 1, depth, ctypes.c_void_p(events.ctypes.data), None)
            if got < 0:
                raise OSError(ctypes.get_errno(), "io_getevents failed")
            finished = events[:got]
            if (finished["res"] != PROBE_BYTES).any():
                raise OSError(f"an AIO read of {path} returned {int(finished['res'].min())} bytes")
            done += got
            if time.perf_counter() >= stop:
                break
            index = ((finished["obj"] - first) // _IOCB.itemsize).astype(np.int64)
            iocbs["offset"][index] = rng.integers(0, pages, got) * PROBE_BYTES
            pointers[:got] = finished["obj"]
            if libc.syscall(submit, context, got, ctypes.c_void_p(pointers.ctypes.data)) != got:
                raise OSError(ctypes.get_errno(), "io_submit failed")
        elapsed = time.perf_counter() - started
    finally:
        # io_destroy waits for the reads still in flight, so the buffers outlive them.
        if context.value:
            libc.syscall(destroy, context)
        os.close(fd)
        del buffers
    return DiskProbe(depth, done, elapsed, "Linux AIO")


def probe_disk(path: Path, seconds: float) -> list[DiskProbe]:
    """The disk's random-read rate: :data:`PROBE_THREADS` threads, then :data:`AIO_DEPTH` reads
    queued by Linux AIO (skipped, with a warning, where AIO is missing)."""
    probes = [disk_iops(path, threads, seconds) for threads in PROBE_THREADS]
    try:
        probes.append(disk_iops_aio(path, AIO_DEPTH, seconds))
    except OSError as exc:
        logger.warning("no Linux AIO probe of %s (%s); the threaded probes stand alone", path, exc)
    return probes


# ------------------------------------------------------------------ the stage's ways
@dataclass
class WayResult:
    """One way of reading at one batch size: per-request figures, cold and warm."""

    way: str
    batch_size: int
    cold_ms: list[float] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    cold_cpu_ms: list[float] = field(default_factory=list)
    warm_cpu_ms: list[float] = field(default_factory=list)
    cold_lookups: list[int] = field(default_factory=list)
    distinct_rows: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)
    resident_before: list[int] = field(default_factory=list)

    def summary(self, best_iops: float) -> dict[str, Any]:
        """Medians per request, and the cold time against the disk-bound time."""
        disk_ms = np.asarray(self.pages, dtype=float) / best_iops * 1e3
        cold = np.asarray(self.cold_ms)
        return {
            "way": self.way,
            "batch_size": self.batch_size,
            "requests": len(self.cold_ms),
            "cold_ms_p50": float(np.median(cold)),
            "warm_ms_p50": float(np.median(self.warm_ms)),
            "cold_cpu_ms_p50": float(np.median(self.cold_cpu_ms)),
            "warm_cpu_ms_p50": float(np.median(self.warm_cpu_ms)),
            "cold_lookups_p50": float(np.median(self.cold_lookups)),
            "distinct_rows_p50": float(np.median(self.distinct_rows)),
            "pages_p50": float(np.median(self.pages)),
            "reads_p50": float(np.median(self.reads)),
            "disk_bound_ms_p50": float(np.median(disk_ms)),
            "cold_over_disk_bound": float(np.median(cold / np.maximum(disk_ms, 1e-9))),
            "resident_before_max_bytes": max(self.resident_before, default=0),
        }


def stage_files(repository: Path, stage: str) -> tuple[Path, Path, tuple[int, ...]]:
    """The stage's row store folder, hot-set file and table sizes, as its config names them."""
    model_dir = repository / stage
    config_path = model_dir / "config.pbtxt"
    if not config_path.is_file():
        raise ConfigError(f"no embedding stage '{stage}' in {repository} (no {config_path})")
    config = read_config(config_path)
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    missing = [key for key in (PARAM_ROW_STORE, PARAM_HOT_SET, PARAM_TABLE_SIZES) if not parameters.get(key)]
    if missing:
        raise ConfigError(f"{config_path} is not an embedding stage's config: no {', '.join(missing)}")
    versions = sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not versions:
        raise ConfigError(f"{model_dir} has no version folder")
    version = versions[-1]
    sizes = tuple(int(size) for size in parameters[PARAM_TABLE_SIZES].split(","))
    return (
        (version / parameters[PARAM_ROW_STORE]).resolve(),
        (version / parameters[PARAM_HOT_SET]).resolve(),
        sizes,
    )


def _requests(options: ColdReadOptions) -> dict[tuple[int, str, int], list[np.ndarray]]:
    """Each (round, way, batch size)'s requests: consecutive held-out rows, none used twice."""
    needed = options.rows_needed()
    chunks, have = [], 0
    for batch in iter_batches(options.data):
        chunks.append(batch.categorical)
        have += len(batch)
        if have >= needed:
            break
    if have < needed:
        raise ConfigError(f"{options.data} has {have} rows; this run sends {needed} rows, each once")
    ids = np.concatenate(chunks)[:needed]
    plan: dict[tuple[int, str, int], list[np.ndarray]] = {}
    start = 0
    for round_ in range(options.rounds):
        for way in options.ways:
            for size in options.batch_sizes:
                plan[(round_, way, size)] = [
                    ids[start + i * size : start + (i + 1) * size] for i in range(options.requests)
                ]
                start += size * options.requests
    return plan


def _reader(store: StoreRows, way: str, threads: int) -> ColdReads:
    if way == URING_NO_HINTS:
        return ColdReads.of_store(store, COLD_READ_URING, threads, hint_rows=0)
    return ColdReads.of_store(store, way, threads)


def run_cold_reads(options: ColdReadOptions, command: str, progress: Any = None) -> dict[str, Any]:
    """Measure every way at every batch size, cold and warm, with the disk probe; the report."""
    store_dir, hot_set, sizes = stage_files(options.repository, options.stage)
    store = open_store(store_dir, verify=False)
    _, hot_ids = read_hot_ids(hot_set, len(sizes))
    lookup = HotColdLookup(sizes, hot_ids, store.data)
    readers = {way: _reader(store, way, options.threads) for way in options.ways}
    plan = _requests(options)
    results = {(way, size): WayResult(way, size) for way in options.ways for size in options.batch_sizes}
    record = RunRecord.begin(command)
    probes = []
    try:
        evict(store)
        probes = probe_disk(store.path / STORE_ROWS_FILE, options.probe_seconds)
        for round_ in range(options.rounds):
            for way in options.ways:
                lookup.reads = readers[way]
                for size in options.batch_sizes:
                    result = results[(way, size)]
                    requests = plan[(round_, way, size)]
                    result.resident_before.append(evict(store))
                    for ids in requests:
                        started, cpu = time.perf_counter(), process_cpu_s()
                        placement = lookup.place(ids)
                        result.cold_ms.append((time.perf_counter() - started) * 1e3)
                        result.cold_cpu_ms.append((process_cpu_s() - cpu) * 1e3)
                        result.cold_lookups.append(placement.cold_lookups)
                        result.distinct_rows.append(placement.cold_distinct_rows)
                        result.pages.append(placement.cold_pages)
                        result.reads.append(placement.cold_reads)
                    for ids in requests:
                        started, cpu = time.perf_counter(), process_cpu_s()
                        lookup.place(ids)
                        result.warm_ms.append((time.perf_counter() - started) * 1e3)
                        result.warm_cpu_ms.append((process_cpu_s() - cpu) * 1e3)
                    if progress is not None:
                        progress()
    finally:
        for reader in readers.values():
            reader.close()
        record.finish()
    best = max(probes, key=lambda probe: probe.iops)
    return {
        "record": record.to_json(),
        "options": {**asdict(options), "repository": str(options.repository), "data": str(options.data)},
        "store": {
            "path": str(store.path),
            "bytes": int(store.data.nbytes),
            "rows": int(store.data.shape[0]),
            "row_bytes": int(store.data.shape[1] * store.data.dtype.itemsize),
            "dtype": str(store.data.dtype),
            "hot_rows": lookup.hot_rows,
        },
        "disk": [probe.to_json() for probe in probes],
        "best_iops": best.iops,
        "ways": [results[key].summary(best.iops) for key in results],
        "requests": {f"{way}/{size}": asdict(result) for (way, size), result in results.items()},
    }


def disk_table(probes: list[dict[str, Any]]) -> list[str]:
    """The disk probes as a markdown table."""
    return table(
        ["queue depth", "how", "reads/s", "mean latency us"],
        [[d["queue_depth"], d["how"], f"{d['iops']:,.0f}", f"{d['mean_latency_us']:.0f}"] for d in probes],
        "rlrr",
    )


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes:
#: everything below the title but the chart, and the disk with the stage's ways of reading.
SECTION_RESULTS = "results"
SECTION_WAYS = "ways"


def write_cold_reads(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """``cold_reads.json``, ``cold_reads.md`` and ``cold_reads.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    store, record = report["store"], report["record"]
    lines = [
        "# Cold rows: the embedding stage's ways of reading them",
        "",
        section_start(SECTION_RESULTS),
        f"- command: `{record['command']}`; started {record['started']}",
        *([f"- machine: {machine_with_flags(record['machine'])}"] if "machine" in record else []),
        f"- store: {store['rows']:,} rows of {store['row_bytes']} bytes ({store['dtype']}), "
        f"{store['bytes'] / 1e9:.2f} GB; {store['hot_rows']:,} hot rows in the dense model",
        "- cold: the store evicted from the page cache before each way's requests, each request of held-out "
        "rows never sent before; warm: the same requests again",
        "- disk-bound time: a request's cold pages / the disk's best random-read rate below (the kernel's "
        "read-ahead may queue deeper than the probe, so a way can come in under it)",
        "",
        "## The disk (4 KiB O_DIRECT reads at random pages of rows.bin)",
        "",
        section_start(SECTION_WAYS),
        *disk_table(report["disk"]),
        "",
        "## The stage's time per request (medians)",
        "",
        *table(
            [
                "way",
                "batch",
                "cold lookups",
                "distinct rows",
                "pages",
                "reads",
                "cold ms",
                "warm ms",
                "CPU ms cold / warm",
                "disk-bound ms",
                "cold / disk-bound",
            ],
            [
                [
                    w["way"],
                    w["batch_size"],
                    f"{w['cold_lookups_p50']:.0f}",
                    f"{w['distinct_rows_p50']:.0f}",
                    f"{w['pages_p50']:.0f}",
                    f"{w['reads_p50']:.0f}",
                    f"{w['cold_ms_p50']:.2f}",
                    f"{w['warm_ms_p50']:.2f}",
                    f"{w['cold_cpu_ms_p50']:.2f} / {w['warm_cpu_ms_p50']:.2f}",
                    f"{w['disk_bound_ms_p50']:.2f}",
                    f"{w['cold_over_disk_bound']:.2f}",
                ]
                for w in report["ways"]
            ],
            "llrrrrrrrrr",
        ),
        "",
        "CPU ms: this process's CPU time per request (user and system, every thread: the system calls "
        "and page faults the reads make).",
        "",
        section_end(SECTION_WAYS),
        section_end(SECTION_RESULTS),
        "",
        "![cold reads](cold_reads.png)",
        "",
    ]
    panels = []
    for size in report["options"]["batch_sizes"]:
        series = []
        for way in report["options"]["ways"]:
            figures = report["requests"][f"{way}/{size}"]
            series.append(Series(f"{way}, cold", figures["pages"], figures["cold_ms"], "o", way))
        pages = sorted(
            p for w in report["options"]["ways"] for p in report["requests"][f"{w}/{size}"]["pages"]
        )
        series.append(
            Series(
                "disk-bound (pages / best reads/s)",
                [pages[0], pages[-1]],
                [pages[0] / report["best_iops"] * 1e3, pages[-1] / report["best_iops"] * 1e3],
                "--",
                "disk",
            )
        )
        panels.append(
            Panel(f"batch {size}", "cold pages in the request", "stage ms per request", series, ylog=True)
        )
    paths = {
        "json": write_json(out / "cold_reads.json", report),
        "markdown": write_markdown(out / "cold_reads.md", lines),
        "plot": plot(out / "cold_reads.png", "The embedding stage on a cold store: time per request", panels),
    }
    return paths
