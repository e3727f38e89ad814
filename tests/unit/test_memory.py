"""bundle.memory: peak anonymous and file-backed memory, told apart."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from bundle.memory import PeakMemory, resident

MB = 2**20


@pytest.mark.skipif(resident() is None, reason="needs Linux /proc/self/status")
def test_allocations_and_mapped_file_pages_are_counted_apart(tmp_path: Path) -> None:
    path = tmp_path / "rows.bin"
    np.arange(48 * MB // 8, dtype=np.int64).tofile(path)
    before = resident()
    assert before is not None
    with PeakMemory() as peak:
        allocated = np.ones(64 * MB // 8)  # written: 64 MB of anonymous pages
        mapped = np.memmap(path, dtype=np.int64, mode="r")
        assert int(mapped.sum()) > 0  # read: 48 MB of the file's pages mapped in
        held = (allocated, mapped)  # both alive when the block ends, when the last sample is taken
    assert held[0].size and peak.available
    assert peak.anon_bytes >= before["anon"] + 60 * MB
    assert peak.file_bytes >= before["file"] + 40 * MB
    assert peak.report() == {"anon_bytes": peak.anon_bytes, "file_bytes": peak.file_bytes}


def test_without_proc_status_it_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("bundle.memory.STATUS", tmp_path / "missing")
    assert resident() is None
    with PeakMemory() as peak:
        pass
    assert not peak.available and peak.report() == {"available": False}


def test_a_process_tree_s_anonymous_memory_leaves_mapped_pages_out(tmp_path: Path) -> None:
    from server.processes import tree_rss

    path = tmp_path / "rows.bin"
    np.ones(32 * MB // 8).tofile(path)
    mapped = np.memmap(path, dtype=np.float64, mode="r")
    assert float(mapped.sum()) > 0  # 32 MB of file pages resident in this process
    me = os.getpid()
    rss, anonymous = tree_rss(me)[me], tree_rss(me, anonymous=True)[me]
    assert 0 < anonymous <= rss - 30 * MB


@pytest.mark.skipif(resident() is None, reason="needs Linux /proc/self/status")
def test_memory_held_while_native_code_keeps_the_gil_is_counted() -> None:
    """torch.onnx's passes and protobuf hold the GIL for seconds: a sampling thread here would
    never run then, so a buffer allocated and freed within such a call went unseen."""
    import ctypes
    import sys

    before = resident()
    assert before is not None
    libc = ctypes.PyDLL(None)  # PyDLL: calls keep the GIL
    interval = sys.getswitchinterval()
    with PeakMemory() as peak:
        sys.setswitchinterval(1000.0)  # nor does this thread hand the GIL over between the calls
        try:
            buffer = np.ones(96 * MB // 8)
            libc.usleep(400_000)
            del buffer
        finally:
            sys.setswitchinterval(interval)
    assert peak.anon_bytes >= before["anon"] + 90 * MB
