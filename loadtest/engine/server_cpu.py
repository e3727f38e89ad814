"""The local server's CPU beside the load generator's: when the two share cores.

Load tests send to this machine only, so the server is a process here: the one
listening on the target's port (:func:`listening_pid`). Its CPU time, with
its children's (Triton's python-backend stubs), is read at a step's window
start and end (:func:`tree_cpu_s`), and the cores it may run on with it.

A load generator that runs on cores the server may use takes CPU the server
could have used. While those cores are nearly full, what the client spends
there is taken from the server: the step then measures the server with less
CPU than it has, and the engine with the cheaper client (perf_analyzer, in C++)
reads a higher rate on the same server. :func:`shared_cores_share` is the
client's share of the CPU the two used on the cores they share, and
:data:`SHARED_SHARE` the share above which the step is flagged client-bound,
with that share as its reason (stated with the rest of the client-bound rule,
:func:`loadtest.engine.client_cpu.threshold_line`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

#: The load generator's share of the CPU used on the cores it shares with the server above which
#: (those cores nearly full, :data:`SHARED_BUSY`) the server lost CPU to it.
SHARED_SHARE = 0.1
#: The shared cores count as full when the client and the server together used this share of them.
SHARED_BUSY = 0.8
#: How the reason for that flag begins (:meth:`SharedCores.reason`).
SHARED_REASON = "load generator and server share"

_TCP_LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (IPv4 and IPv6), from ``/proc/net``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _pids() -> Iterable[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def listening_pid(url: str) -> int | None:
    """The process listening on the port of ``url`` (``host:port``), if it is this user's (None:
    no such process, or one this user cannot see)."""
    _, _, port = url.rpartition(":")
    if not port.isdigit():
        return None
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(int(port))}
    if not inodes:
        return None
    for pid in _pids():
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    return None


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name (index 0 is field 3, state)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()


def _parent_of(pid: int) -> int | None:
    try:
        return int(_stat(pid)[1])
    except (OSError, ValueError, IndexError):
        return None


def _cpu_with_reaped_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of the children it has reaped (utime, stime, cutime, cstime:
    fields 14 to 17 of stat(5)), so a child's CPU still counts once it has ended."""
    fields = _stat(pid)
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds so far of ``pid`` and every process below it (e.g. Triton's python stubs),
    those that ended and were reaped included.

    Raises:
        OSError: ``pid`` is gone.
    """
    parents = {child: _parent_of(child) for child in _pids()}
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = _cpu_with_reaped_s(pid)
    for child in tree - {pid}:
        try:
            total += _cpu_with_reaped_s(child)
        except OSError:  # ended since
            continue
    return total


def allowed_cores(pid: int | None = None) -> frozenset[int]:
    """The cores ``pid`` (None: this process) may run on."""
    return frozenset(os.sched_getaffinity(pid or 0))


@dataclass(frozen=True)
class SharedCores:
    """The load generator and the server over one window, on the cores both may use.

    Attributes:
        client_cores: cores the load generator used on average (all its processes).
        server_cores: cores the server used on average (it and its children).
        shared: how many cores both may run on.
        share: the client's share of the CPU the two used on those cores (NaN: none shared).
        busy: the share of those cores the two used together.
    """

    client_cores: float
    server_cores: float
    shared: int
    share: float
    busy: float

    @classmethod
    def of(
        cls,
        client_cores: float,
        client_allowed: frozenset[int],
        server_cores: float,
        server_allowed: frozenset[int],
    ) -> SharedCores:
        """From each side's cores used and the cores each may use: each side's CPU on the shared
        cores is taken as its CPU in proportion to them (spread evenly over what it may use)."""
        shared = len(client_allowed & server_allowed)
        if not shared or not (client_cores >= 0 and server_cores >= 0):
            return cls(client_cores, server_cores, shared, math.nan, math.nan)
        client = client_cores * shared / len(client_allowed)
        server = server_cores * shared / len(server_allowed)
        used = client + server
        return cls(client_cores, server_cores, shared, client / used if used > 0 else 0.0, used / shared)

    @property
    def took_from_server(self) -> bool:
        """Whether the client took CPU the server needed: the shared cores nearly full, and the
        client's share of them above :data:`SHARED_SHARE`."""
        return self.busy >= SHARED_BUSY and self.share > SHARED_SHARE

    def reason(self) -> str:
        """The flag's reason in words (empty when the client took nothing from the server)."""
        if not self.took_from_server:
            return ""
        return (
            f"{SHARED_REASON} {self.shared} core(s), {self.busy:.0%} busy: "
            f"the load generator took {self.share:.0%} of the CPU used there "
            "(--client-cpus keeps them apart)"
        )
