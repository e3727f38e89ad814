"""What a load generator's own CPU cost, and when it, not the server, sets a step's figures.

Every engine (the locust sweep, perf_analyzer, the closed-loop driver) records
over a step's measurement window the CPU time (user + system) of all its
processes, and each process's *demand*: the seconds its threads were running
or waiting for a CPU (``/proc/<pid>/task/<tid>/schedstat``), over the
window. A step is *client-bound* when one load-generator process demanded
more than :data:`CORE_SHARE` of a core: saturated (its event loop always
busy) or starved (waiting for a core the server or others hold), it queues
requests on the client, not the server. It is also client-bound when its
processes together used more than :data:`MACHINE_SHARE` of the machine's
cores (on a small machine that CPU is taken from the server), or when each
closed-loop user spent more than :data:`USER_SHARE` of its request cycle on
the client's own CPU (CPU seconds per second / users): a user sends its next
request only after the client has done its part, so that part lowers the rate
of any server. One
threshold for every engine, stated in every report (:func:`threshold_line`): a
client-bound step's rate and latency describe the client, so ratios and
``tune`` never take it as the server's limit. A load generator that shares
cores with the server is judged against the server's CPU as well
(:mod:`loadtest.engine.server_cpu`).
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass

from loadtest.engine.server_cpu import SHARED_BUSY, SHARED_SHARE

#: A load-generator process whose threads ran or waited to run above this many core-seconds per
#: second of the window is saturated, or starved.
CORE_SHARE = 0.75
#: Load-generator processes together above this share of the machine's cores take its CPU.
MACHINE_SHARE = 0.25
#: A closed-loop user whose client CPU takes more than this share of its request cycle.
USER_SHARE = 0.2
#: A closed-loop step whose serial client time per request is more than this share of its mean
#: latency is client-limited.
SERIAL_SHARE = 0.10
#: Words every serial-time reason starts with (reports pick the flag's short form by it).
SERIAL_REASON = "of serial client time per request"


def process_cpu_s() -> float:
    """This process's CPU seconds so far (user + system, every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pid_cpu_s(pid: int) -> float:
    """CPU seconds so far of process ``pid`` (user + system, every thread), from ``/proc``.

    Raises:
        OSError: no such process (or no ``/proc``).
    """
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); index 0 here is field 3 (state).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_busy_s(pid: int | str = "self") -> dict[int, float]:
    """Seconds each thread of ``pid`` has been running or waiting to run, so far.

    From ``/proc/<pid>/task/<tid>/schedstat`` (time on a CPU, time on a run queue, in ns);
    empty where the kernel keeps no such statistics.
    """
    busy: dict[int, float] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return busy
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as handle:
                running, waiting = handle.read().split()[:2]
        except (OSError, ValueError):
            continue
        busy[int(tid)] = (int(running) + int(waiting)) / 1e9
    return busy


def process_demand(before: dict[int, float], after: dict[int, float], seconds: float) -> float:
    """Core-seconds per second that a process's threads were running or waiting to run, between
    two :func:`thread_busy_s` readings ``seconds`` apart (a thread born in between counts from
    zero; one that ended in between is not counted)."""
    if seconds <= 0 or not after:
        return math.nan
    return sum(busy - before.get(tid, 0.0) for tid, busy in after.items()) / seconds


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threshold_line(cores: int | None = None) -> str:
    """The client-bound rule in words, as every report states it (the shared-cores part from
    :mod:`loadtest.engine.server_cpu`)."""
    cores = cores or machine_cores()
    return (
        f"over the measurement window, one load-generator process running or waiting "
        f"for a CPU more than {CORE_SHARE:g} of a core (its threads together), or all of them more than "
        f"{CORE_SHARE:g} of each core they may use, or all of them using more than {MACHINE_SHARE:.0%} "
        f"of this machine's {cores} cores, or more than {USER_SHARE:.0%} of each closed-loop user's "
        "request cycle spent on the client's CPU, or a serial client time per request (from an "
        f"answer's arrival to the next request's send) above {SERIAL_SHARE:.0%} of the mean latency; "
        "or the load generator running on cores the server "
        f"may use, those cores at least {SHARED_BUSY:.0%} busy, and the load generator above "
        f"{SHARED_SHARE:.0%} of the CPU used there"
    )


@dataclass(frozen=True)
class ClientCpu:
    """A load generator's CPU over one measurement window.

    Attributes:
        cpu_s: CPU seconds of all its processes over the window.
        seconds: the window's length.
        demand: the most core-seconds per second any one of its processes was running or
            waiting for a CPU, all its threads together.
        total_demand: the same, all its processes together.
        requests: requests completed in the window (successes and failures).
        cores: the machine's cores (the base of the machine share).
        allowed: the cores the load generator may run on.
        users: closed-loop users (requests in flight).
        serial_us: the mean serial client time per request (us): from an answer's arrival to the
            sender's next request going out (perf_analyzer: its client send plus receive); NaN
            where not measured.
        mean_ms: the mean latency of the window's answers (ms), what ``serial_us`` is judged against.
    """

    cpu_s: float
    seconds: float
    demand: float
    total_demand: float
    requests: int
    cores: int
    allowed: int
    users: int = 1
    serial_us: float = math.nan
    mean_ms: float = math.nan

    @classmethod
    def of_processes(
        cls,
        per_process: list[tuple[float, float, float]],
        requests: int,
        allowed: int | None = None,
        users: int = 1,
        serial_us: float = math.nan,
        mean_ms: float = math.nan,
    ) -> ClientCpu:
        """From ``(cpu seconds, window seconds, demand)`` of each process, on ``allowed`` cores
        (None: all of this machine's), driving ``users`` closed-loop users, with their serial
        client time per request and mean latency (see the attributes)."""
        cores = machine_cores()
        allowed = allowed or cores
        if not per_process:
            return cls(
                math.nan, math.nan, math.nan, math.nan, requests, cores, allowed, users, serial_us, mean_ms
            )
        demands = [demand for _, _, demand in per_process if not math.isnan(demand)]
        return cls(
            cpu_s=sum(cpu for cpu, _, _ in per_process),
            seconds=max(seconds for _, seconds, _ in per_process),
            demand=max(demands) if demands else math.nan,
            total_demand=sum(demands) if demands else math.nan,
            requests=requests,
            cores=cores,
            allowed=allowed,
            users=users,
            serial_us=serial_us,
            mean_ms=mean_ms,
        )

    @property
    def share(self) -> float:
        """Cores used on average over the window, all processes together."""
        return self.cpu_s / self.seconds if self.seconds > 0 else math.nan

    @property
    def per_request_us(self) -> float:
        """CPU microseconds per request."""
        return self.cpu_s / self.requests * 1e6 if self.requests else math.nan

    @property
    def serial_share(self) -> float:
        """The serial client time per request as a share of the mean latency (NaN: not measured)."""
        return self.serial_us / 1000.0 / self.mean_ms if self.mean_ms > 0 else math.nan

    @property
    def bound(self) -> bool:
        """Whether the load generator, not the server, limited the step."""
        return bool(self.reason())

    def reason(self) -> str:
        """Which part of the client-bound rule the window broke, in words (empty: none)."""
        if self.demand > CORE_SHARE:
            return (
                f"one load-generator process ran or waited for a CPU {self.demand:.2f} of a core "
                f"(above {CORE_SHARE:g})"
            )
        if self.total_demand > CORE_SHARE * self.allowed:
            return (
                f"the load generator's processes ran or waited for a CPU {self.total_demand:.2f} cores "
                f"on the {self.allowed} they may use (above {CORE_SHARE:g} of each)"
            )
        if self.share > MACHINE_SHARE * self.cores:
            return (
                f"the load generator used {self.share:.2f} of this machine's {self.cores} cores "
                f"(above {MACHINE_SHARE:.0%})"
            )
        if self.share / self.users > USER_SHARE:
            return (
                f"{self.share / self.users:.0%} of each closed-loop user's request cycle was spent "
                f"on the client's CPU (above {USER_SHARE:.0%})"
            )
        if self.serial_share > SERIAL_SHARE:
            return (
                f"{self.serial_us:.0f} us {SERIAL_REASON}, {self.serial_share:.0%} of the mean "
                f"latency of {self.mean_ms:.3g} ms (above {SERIAL_SHARE:.0%})"
            )
        return ""
