"""The server's CPU beside the load generator's (loadtest.engine.server_cpu): the process behind
a port, its CPU with its children's, and the rule for a client that takes the server's cores."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

import pytest

from loadtest.engine.server_cpu import (
    SHARED_BUSY,
    SHARED_SHARE,
    SharedCores,
    allowed_cores,
    listening_pid,
    tree_cpu_s,
)


def test_the_process_listening_on_a_port_is_found_and_a_closed_port_has_none() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert listening_pid(f"127.0.0.1:{port}") == os.getpid()
    assert listening_pid(f"127.0.0.1:{port}") is None
    assert listening_pid("no-port") is None


def test_a_process_tree_counts_its_childrens_cpu() -> None:
    # A parent that sleeps while its child spins 0.4 s: the tree's CPU is the child's, while the
    # child runs and once it has ended (reaped, its CPU is its parent's children's time).
    spin = "import time; end = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    code = (
        f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {spin!r}]); "
        "print('done', flush=True); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        while_running = tree_cpu_s(parent.pid)
        assert parent.stdout.readline().strip() == "done"
        # Only the child's CPU makes the tree pass 0.4 s (the parent itself only starts Python).
        assert while_running <= tree_cpu_s(parent.pid) and 0.4 <= tree_cpu_s(parent.pid) < 5
    finally:
        parent.kill()
        parent.wait()
    with pytest.raises(OSError):
        tree_cpu_s(parent.pid)
    assert allowed_cores() == frozenset(os.sched_getaffinity(0))


def test_a_client_on_the_servers_full_cores_is_flagged_with_its_share() -> None:
    cores = frozenset({0, 1})
    # Both cores busy, the client a fifth of what was used there: it took that from the server.
    taken = SharedCores.of(0.4, cores, 1.6, cores)
    assert taken.shared == 2 and taken.busy == pytest.approx(1.0) and taken.share == pytest.approx(0.2)
    assert taken.took_from_server and "20%" in taken.reason() and "2 core" in taken.reason()
    # A client as cheap as perf_analyzer's on the same cores takes too little to matter.
    cheap = SharedCores.of(0.04, cores, 1.9, cores)
    assert cheap.share < SHARED_SHARE and not cheap.took_from_server and cheap.reason() == ""
    # Cores with room to spare: the client's CPU was not the server's.
    idle = SharedCores.of(0.3, cores, 0.6, cores)
    assert idle.busy < SHARED_BUSY and not idle.took_from_server


def test_a_client_pinned_apart_shares_nothing_and_a_partial_overlap_counts_its_part() -> None:
    apart = SharedCores.of(0.9, frozenset({1}), 0.95, frozenset({0}))
    assert apart.shared == 0 and math.isnan(apart.share) and not apart.took_from_server
    # The client may use cores 1-2 and the server 0-1: half of each side's CPU is on core 1.
    overlap = SharedCores.of(0.6, frozenset({1, 2}), 1.6, frozenset({0, 1}))
    assert overlap.shared == 1
    assert overlap.share == pytest.approx(0.3 / (0.3 + 0.8)) and overlap.busy == pytest.approx(1.1)


def test_a_windows_document_holds_the_servers_cpu_only_where_both_readings_have_it() -> None:
    from loadtest.sweeps.stepfiles import SERVER_COUNTERS, ServerReading, server_document, shared_cores

    zero = dict.fromkeys(SERVER_COUNTERS, 0)
    later = {**zero, "success_count": 10, "success_ns": 5_000_000}
    cores = frozenset({0, 1})
    before, after = ServerReading(zero, 1.0, cores, 100.0), ServerReading(later, 4.2, cores, 102.0)
    document = server_document("m", before, after)
    assert document is not None and document["delta"]["success_count"] == 10
    assert document["server_cpu_s"] == pytest.approx(3.2) and document["server_cpus"] == [0, 1]
    shared = shared_cores(document, 0.4, cores)
    assert shared is not None and shared.server_cores == pytest.approx(1.6) and shared.took_from_server
    # No process read: the counters still, no CPU, and nothing to say about shared cores.
    unread = server_document("m", ServerReading(zero, None, frozenset(), 100.0), after)
    assert unread is not None and "server_cpu_s" not in unread and shared_cores(unread, 0.4, cores) is None
    # No counters: no document.
    assert server_document("m", ServerReading(None, 1.0, cores, 100.0), after) is None
