"""Batched file reads through Linux's ``io_uring``, with ctypes and numpy alone.

The embedding stage reads a request's cold rows as hundreds of small reads at
scattered offsets of its row store. One system call per read costs the same CPU
time whether the row is cached or not, so at large batches the calls alone took
longer than the disk needed for the uncached ones (the ways of reading, side by
side: benchmarks/cold_tier/cold_reads.md). An ``io_uring`` takes every
read of a request in one ``io_uring_enter``: the kernel copies the cached ones at
once and sends the others to the disk together, and the call returns when all
are done.

The stdlib has no ``io_uring`` and the stage's Python definition
(:mod:`export.stage.hot_cold_lookup`) imports only numpy and the standard
library, so this module makes the two system calls itself (``io_uring_setup``, ``io_uring_enter``:
425 and 426 on every architecture since Linux 5.1), maps the rings with
:mod:`mmap`, and writes the submission entries as one numpy structured array.
Only what the stage needs is here: ``IORING_OP_READ`` (Linux 5.6) of a file into
caller-owned memory, submitted and waited for in one call, from one thread at a
time.

Where the kernel refuses (older than 5.6, ``kernel.io_uring_disabled``, or a
container's seccomp profile: Docker's default blocks ``io_uring_setup``),
:class:`Ring` raises :class:`RingUnavailable` with the kernel's reason, and the
caller reads another way.

Layouts (``include/uapi/linux/io_uring.h``): ``struct io_uring_params`` (120 bytes),
``struct io_uring_sqe`` (64 bytes) and ``struct io_uring_cqe`` (16 bytes).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
from typing import Any

import numpy as np

#: System call numbers, the same on every architecture (Linux 5.1's unified table).
SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
#: ``IORING_OP_READ``: a read at an offset into one buffer (Linux 5.6).
IORING_OP_READ = 22
#: ``io_uring_enter`` flag: wait for ``min_complete`` completions.
IORING_ENTER_GETEVENTS = 1
#: mmap offsets of the submission ring, the completion ring and the submission entries.
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
#: Submission entries of a ring: the most reads one ``io_uring_enter`` takes.
DEFAULT_ENTRIES = 1024

_SQE = np.dtype(
    {
        "names": ["opcode", "flags", "ioprio", "fd", "off", "addr", "len", "rw_flags", "user_data"],
        "formats": ["u1", "u1", "<u2", "<i4", "<u8", "<u8", "<u4", "<u4", "<u8"],
        "offsets": [0, 1, 2, 4, 8, 16, 24, 28, 32],
        "itemsize": 64,
    }
)
_CQE = np.dtype({"names": ["user_data", "res", "flags"], "formats": ["<u8", "<i4", "<u4"], "itemsize": 16})


class _SqOffsets(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint32)
        for name in ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array", "resv1")
    ] + [("user_addr", ctypes.c_uint64)]


class _CqOffsets(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint32)
        for name in ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags", "resv1")
    ] + [("user_addr", ctypes.c_uint64)]


_PARAM_WORDS = ("sq_entries", "cq_entries", "flags", "sq_thread_cpu", "sq_thread_idle", "features", "wq_fd")


class _Params(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_uint32) for name in _PARAM_WORDS),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", _SqOffsets),
        ("cq_off", _CqOffsets),
    ]


assert ctypes.sizeof(_Params) == 120


class RingUnavailable(OSError):
    """The kernel offers no ``io_uring`` here (the message says why)."""


def _syscall() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.syscall
    call.restype = ctypes.c_long
    return call


class Ring:
    """One ``io_uring`` for batches of reads; :meth:`read` submits them and waits for all.

    Args:
        entries: submission entries (a power of two is used as is; the kernel rounds up);
            a larger batch is submitted in turns of this many.

    Raises:
        RingUnavailable: ``io_uring_setup`` refused, or the kernel lacks ``IORING_OP_READ``.
    """

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        self._call = _syscall()
        params = _Params()
        fd = int(self._call(SYS_IO_URING_SETUP, ctypes.c_uint32(entries), ctypes.byref(params)))
        if fd < 0:
            code = ctypes.get_errno()
            raise RingUnavailable(code, f"io_uring_setup refused: {os.strerror(code)}")
        self._fd = fd
        self._maps: list[mmap.mmap] = []
        self._lock = threading.Lock()
        try:
            self._map(params)
            self._probe()
        except BaseException:
            self.close()
            raise

    def _map(self, params: _Params) -> None:
        sq, cq = params.sq_off, params.cq_off
        self.entries = int(params.sq_entries)
        shared, prot = mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        sq_bytes, cq_bytes = sq.array + params.sq_entries * 4, cq.cqes + params.cq_entries * 16
        sq_ring = mmap.mmap(self._fd, sq_bytes, shared, prot, offset=IORING_OFF_SQ_RING)
        cq_ring = mmap.mmap(self._fd, cq_bytes, shared, prot, offset=IORING_OFF_CQ_RING)
        sqes = mmap.mmap(self._fd, params.sq_entries * 64, shared, prot, offset=IORING_OFF_SQES)
        self._maps = [sq_ring, cq_ring, sqes]
        words_sq = np.frombuffer(sq_ring, dtype="<u4")
        words_cq = np.frombuffer(cq_ring, dtype="<u4")
        self._sq_tail = words_sq[sq.tail // 4 : sq.tail // 4 + 1]
        self._sq_mask = int(words_sq[sq.ring_mask // 4])
        # Slot i of the submission array names entry i, once for all.
        self._sq_array = words_sq[sq.array // 4 : sq.array // 4 + params.sq_entries]
        self._sq_array[:] = np.arange(params.sq_entries, dtype="<u4")
        self._cq_head = words_cq[cq.head // 4 : cq.head // 4 + 1]
        self._cq_tail = words_cq[cq.tail // 4 : cq.tail // 4 + 1]
        self._cq_mask = int(words_cq[cq.ring_mask // 4])
        self._cqes = np.frombuffer(cq_ring, dtype=_CQE, count=params.cq_entries, offset=cq.cqes)
        self._sqes = np.frombuffer(sqes, dtype=_SQE, count=params.sq_entries)
        # Every entry is a read, and carries its own index as user_data, once for all: a
        # submission writes only fd, offset, address and length.
        self._sqes["opcode"] = IORING_OP_READ
        self._sqes["user_data"] = np.arange(params.sq_entries, dtype="<u8")

    def _probe(self) -> None:
        """Read 0 bytes of /dev/zero: a kernel before ``IORING_OP_READ`` answers EINVAL."""
        fd = os.open("/dev/zero", os.O_RDONLY)
        try:
            buffer = np.zeros(1, dtype=np.uint8)
            address = np.array([buffer.ctypes.data], "<u8")
            result = self._submit(fd, np.zeros(1, "<u8"), address, np.zeros(1, "<u4"))
        finally:
            os.close(fd)
        if result[0] < 0:
            code = int(-result[0])
            raise RingUnavailable(code, f"io_uring cannot read files here: {os.strerror(code)}")

    def read(self, fd: int, offsets: np.ndarray, addresses: np.ndarray, lengths: np.ndarray | int) -> None:
        """Read ``lengths[i]`` bytes at ``offsets[i]`` of ``fd`` into memory at ``addresses[i]``.

        ``lengths`` may be one int for all reads. All reads are in flight together
        (``entries`` at a time) and all are done on return. The caller keeps the memory
        alive and writable for the call.

        Raises:
            OSError: a read failed (its error), or came back short at the end of the file.
        """
        offsets = np.asarray(offsets, dtype="<u8")
        addresses = np.asarray(addresses, dtype="<u8")
        lengths = np.broadcast_to(np.asarray(lengths, dtype="<u4"), offsets.shape)
        with self._lock:
            for start in range(0, offsets.size, self.entries):
                stop = start + self.entries
                got = self._submit(fd, offsets[start:stop], addresses[start:stop], lengths[start:stop])
                short = np.flatnonzero(got != lengths[start:stop])
                for index in (start + short).tolist():
                    self._finish_short(
                        fd, int(got[index - start]), offsets[index], addresses[index], lengths[index]
                    )

    def _finish_short(self, fd: int, got: int, offset: Any, address: Any, length: Any) -> None:
        """A read that failed or came back short: its error, or the rest read directly."""
        if got < 0:
            reason = os.strerror(-got)
            raise OSError(-got, f"{reason} (a read of {int(length)} bytes at offset {int(offset)})")
        want = int(length) - got
        rest = (ctypes.c_char * want).from_address(int(address) + got)
        more = os.preadv(fd, [memoryview(rest).cast("B")], int(offset) + got)
        if more != want:
            read = f"{got + more} of {int(length)} bytes at offset {int(offset)}"
            raise OSError(errno.EIO, f"short read: {read} (end of file?)")

    def _submit(self, fd: int, offsets: np.ndarray, addresses: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Queue ``n <= entries`` reads, submit them, wait for all; each read's result, in order."""
        n = int(offsets.size)
        tail = int(self._sq_tail[0])
        first = tail & self._sq_mask
        # The entries from ``first``, in one or (where the ring wraps) two slices.
        split = min(n, self.entries - first)
        for lo, hi, slot in ((0, split, first), (split, n, 0)):
            if hi > lo:
                entries = self._sqes[slot : slot + hi - lo]
                entries["fd"] = fd
                entries["off"] = offsets[lo:hi]
                entries["addr"] = addresses[lo:hi]
                entries["len"] = lengths[lo:hi]
        # The kernel reads the tail inside io_uring_enter, on this thread: no barrier is needed.
        self._sq_tail[0] = (tail + n) & 0xFFFFFFFF
        results = np.empty(n, dtype=np.int64)
        submitted = done = 0
        while done < n:
            to_submit = n - submitted
            flags = IORING_ENTER_GETEVENTS if self._ready() < n - done else 0
            if to_submit or flags:
                entered = int(
                    self._call(
                        SYS_IO_URING_ENTER,
                        ctypes.c_int(self._fd),
                        ctypes.c_uint32(to_submit),
                        ctypes.c_uint32(n - done if flags else 0),
                        ctypes.c_uint32(flags),
                        None,
                        ctypes.c_size_t(0),
                    )
                )
                if entered < 0:
                    code = ctypes.get_errno()
                    if code in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                        continue
                    raise OSError(code, f"io_uring_enter: {os.strerror(code)}")
                submitted += entered
            done += self._reap(results, first)
        return results

    def _ready(self) -> int:
        return (int(self._cq_tail[0]) - int(self._cq_head[0])) & 0xFFFFFFFF

    def _reap(self, results: np.ndarray, first: int) -> int:
        """Copy the completions waiting in the ring into ``results``, each at its entry's
        place after ``first`` (its user_data is its entry's index); how many."""
        head = int(self._cq_head[0])
        ready = (int(self._cq_tail[0]) - head) & 0xFFFFFFFF
        if ready:
            done = self._cqes[(head + np.arange(ready, dtype=np.int64)) & self._cq_mask]
            results[(done["user_data"].astype(np.int64) - first) & self._sq_mask] = done["res"]
            self._cq_head[0] = (head + ready) & 0xFFFFFFFF
        return ready

    def close(self) -> None:
        """Unmap the rings and close the ring's file descriptor."""
        for view in ("_sq_tail", "_sq_array", "_cq_head", "_cq_tail", "_cqes", "_sqes"):
            self.__dict__.pop(view, None)
        for mapping in self._maps:
            with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
                mapping.close()
        self._maps = []
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
