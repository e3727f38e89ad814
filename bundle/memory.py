"""Peak memory of this process, split into what it allocated and what it maps from files.

A process that reads a memory-mapped row store larger than its own allocations
shows a large resident set (``ru_maxrss``, ``/usr/bin/time``'s "Maximum
resident set size"), yet most of it may be the store's file pages: clean page
cache that the kernel drops under pressure and that other processes share.
What a machine must have free is the anonymous part. Linux reports the two
apart (``RssAnon`` and ``RssFile`` in ``/proc/self/status``), but only as they
are now, so :class:`PeakMemory` samples them from a child process and keeps the peaks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


#: The sampler: a separate process, so that it samples while this one holds the GIL in
#: native code (torch.onnx's passes, protobuf, ONNX Runtime's session set-up), which a
#: thread here cannot. Args: pid, interval, :data:`_FIELD`'s pattern; it prints the peaks
#: when its stdin closes.
_SAMPLER = """
import re, select, sys
pid, interval = sys.argv[1], float(sys.argv[2])
field = re.compile(sys.argv[3], re.MULTILINE)
anon = file = 0
while True:
    try:
        found = {k: int(v) * 1024 for k, v in field.findall(open(f"/proc/{pid}/status").read())}
    except OSError:
        break
    anon = max(anon, found.get("RssAnon", 0))
    file = max(file, found.get("RssFile", 0) + found.get("RssShmem", 0))
    if select.select([sys.stdin], [], [], interval)[0]:
        break
print(anon, file, flush=True)
"""


class PeakMemory:
    """The peak anonymous and file-backed resident bytes while the ``with`` block runs.

    Peaks are sampled every ``interval_s`` by a child process (and once here at each end),
    so a buffer that lives shorter than that may be missed: the figures are lower bounds.

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
        self._sampler: subprocess.Popen[str] | None = None

    def _sample(self) -> None:
        now = resident()
        if now is not None:
            self.anon_bytes = max(self.anon_bytes, now["anon"])
            self.file_bytes = max(self.file_bytes, now["file"] + now["shmem"])

    def __enter__(self) -> PeakMemory:
        if self.available:
            self._sample()
            self._sampler = subprocess.Popen(
                [sys.executable, "-c", _SAMPLER, str(os.getpid()), str(self.interval_s), _FIELD.pattern],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._sampler is None:
            return
        self._sample()
        output, _ = self._sampler.communicate(timeout=30)  # closes its stdin: it prints and exits
        fields = output.split()
        if len(fields) == 2:
            self.anon_bytes = max(self.anon_bytes, int(fields[0]))
            self.file_bytes = max(self.file_bytes, int(fields[1]))

    def report(self) -> dict[str, Any]:
        """``{"anon_bytes", "file_bytes"}``, or ``{"available": False}`` where Linux does not report them."""
        if not self.available:
            return {"available": False}
        return {"anon_bytes": self.anon_bytes, "file_bytes": self.file_bytes}
