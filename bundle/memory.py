"""Peak memory of this process, split into what it allocated and what it maps from files.

A process that reads a memory-mapped row store larger than its own allocations
shows a large resident set (``ru_maxrss``, ``/usr/bin/time``'s "Maximum
resident set size"), yet most of it may be the store's file pages: clean page
cache that the kernel drops under pressure and that other processes share.
What a machine must have free is the anonymous part. Linux reports the two
apart (``RssAnon`` and ``RssFile`` in ``/proc/self/status``), but only as they
are now, so :class:`PeakMemory` samples them in a thread and keeps the peaks.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

STATUS = Path("/proc/self/status")
#: Seconds between samples: short enough to catch a buffer that lives a fraction of a second.
INTERVAL_S = 0.02
_FIELD = re.compile(r"^(RssAnon|RssFile|RssShmem):\s+(\d+)\s+kB$", re.MULTILINE)


def resident() -> dict[str, int] | None:
    """This process's resident bytes now: ``anon``, ``file`` and ``shmem``; None where Linux does not say."""
    try:
        text = STATUS.read_text()
    except OSError:
        return None
    found = {name: int(value) * 1024 for name, value in _FIELD.findall(text)}
    if "RssAnon" not in found or "RssFile" not in found:
        return None
    return {"anon": found["RssAnon"], "file": found["RssFile"], "shmem": found.get("RssShmem", 0)}


class PeakMemory:
    """The peak anonymous and file-backed resident bytes while the ``with`` block runs.

    Peaks are sampled every ``interval_s`` (and once at each end), so a buffer
    that lives shorter than that may be missed: the figures are lower bounds.

    Attributes:
        anon_bytes: peak anonymous memory (heap, numpy arrays, protobuf): what must fit in RAM.
        file_bytes: peak file-backed resident pages (memory-mapped files, the loaded libraries):
            page cache, dropped by the kernel under pressure.
        available: whether the platform reports them (else both stay 0).
    """

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.anon_bytes = 0
        self.file_bytes = 0
        self.available = resident() is not None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        now = resident()
        if now is not None:
            self.anon_bytes = max(self.anon_bytes, now["anon"])
            self.file_bytes = max(self.file_bytes, now["file"] + now["shmem"])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        if self.available:
            self._sample()
            self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    def report(self) -> dict[str, Any]:
        """``{"anon_bytes", "file_bytes"}``, or ``{"available": False}`` where Linux does not report them."""
        if not self.available:
            return {"available": False}
        return {"anon_bytes": self.anon_bytes, "file_bytes": self.file_bytes}
