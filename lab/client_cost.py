"""Client-side cost per request: HTTP, gRPC and system shared memory, batch 1 and 1024.

A benchmark, not a test: ``python -m lab client-cost`` writes
``benchmarks/clients/client_cost.json`` and ``client_cost.md``.

Each case is one transport at one batch size, driven by the closed-loop
driver (:mod:`loadtest.engine.driver`) with one worker in this thread, so one
request in flight.
Each request is timed in three phases on the sync client: *build* (check the
inputs against the metadata, make the tritonclient tensors, or copy them into
shared memory), *call* (serialize, send, wait, parse the response message)
and *decode* (the output as numpy, copied out of shared memory when used).
After each request the server's statistics give the time the request spent
inside tritonserver (``success.ns``, arrival to response); the client-side
cost is what is left: ``total - server``, i.e. the client library, the
loopback transport and the server's HTTP/gRPC front end. The process CPU time
of the client per request (all its threads, ``time.process_time``) is
reported too. Medians over many requests, the cases taking turns on the same
server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ClientError, ConfigError
from bundle.records import RunRecord
from bundle.snippets import section_end, section_start
from clients.options import ClientOptions, Protocol, SharedMemory
from clients.triton import TritonClient
from clients.verify import sample_rows
from loadtest.engine.driver import Answer, Connect, Driver, Request
from loadtest.engine.writer import table, write_json, write_markdown

logger = logging.getLogger(__name__)

#: (protocol, shared memory) pairs measured, in report order.
TRANSPORTS: tuple[tuple[Protocol, SharedMemory], ...] = (
    ("http", "none"),
    ("grpc", "none"),
    ("http", "system"),
    ("grpc", "system"),
)
#: Columns of one request's sample, in seconds.
PHASES = ("total", "server", "build", "call", "decode", "client_cpu")


@dataclass(frozen=True)
class CostOptions:
    """What to measure.

    Args:
        model: the served model to call.
        batch_sizes: rows per request, one set of cases each.
        requests: measured requests per case.
        warmup: unmeasured requests before each case (connection, metadata, shm registration).
        rounds: the cases take turns this many times, each with a share of the requests.
    """

    model: str = "dlrm_onnx"
    batch_sizes: tuple[int, ...] = (1, 1024)
    requests: int = 1000
    warmup: int = 50
    rounds: int = 10

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(size < 1 for size in self.batch_sizes):
            raise ConfigError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if self.requests < 10:
            raise ConfigError(f"requests must be >= 10 for a median to mean something, got {self.requests}")
        if self.warmup < 1:
            raise ConfigError(f"warmup must be >= 1, got {self.warmup}")
        if not 1 <= self.rounds <= self.requests:
            raise ConfigError(f"rounds must be in 1..requests, got {self.rounds}")


@dataclass(frozen=True)
class CaseResult:
    """Medians (and the 90th percentile of the client-side cost) of one case, in microseconds.

    Attributes:
        protocol: ``http`` or ``grpc``.
        shared_memory: ``none`` or ``system``.
        batch_size: rows per request.
        requests: measured requests.
        total_us: the whole ``infer`` as the caller sees it.
        server_us: time inside tritonserver (its statistics).
        client_us: ``total - server``: the client-side cost per request.
        client_p90_us: its 90th percentile.
        build_us: inputs checked and tensors built (or copied into shared memory).
        call_us: serialize, send, wait, parse (server time included).
        decode_us: output to numpy (copied out of shared memory when used).
        client_cpu_us: process CPU time of the client per request.
    """

    protocol: str
    shared_memory: str
    batch_size: int
    requests: int
    total_us: float
    server_us: float
    client_us: float
    client_p90_us: float
    build_us: float
    call_us: float
    decode_us: float
    client_cpu_us: float


@dataclass
class CostReport:
    """One run: its record, the server, the options and every case."""

    record: RunRecord
    tritonserver: str
    options: CostOptions
    cases: list[CaseResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.record.to_json(),
            "tritonserver": self.tritonserver,
            "model": self.options.model,
            "options": asdict(self.options),
            "cases": [asdict(case) for case in self.cases],
        }


#: How long the server may take to count a request after answering it.
COUNTED_WAIT_S = 5.0


def _server_counters(stats_client: TritonClient, model: str) -> tuple[int, int]:
    """``(successful requests, their nanoseconds)``, every version of ``model`` together."""
    entries = stats_client.statistics(model)
    return sum(e.success_count for e in entries), sum(e.success_ns for e in entries)


def _settled_counters(stats_client: TritonClient, model: str, at_least: int) -> tuple[int, int]:
    """The counters once the server has counted ``at_least`` successful requests and counts no more.

    A backend reports a request's statistics after its response is sent, so a read made as soon
    as the answer arrives can miss that request, and the next read would give it to the next
    request. Read again until the count reaches ``at_least`` and two reads agree (at most
    :data:`COUNTED_WAIT_S`).

    Raises:
        ClientError: the server did not count the requests in time.
    """
    deadline = time.monotonic() + COUNTED_WAIT_S
    last = _server_counters(stats_client, model)
    while True:
        time.sleep(0.001)
        now = _server_counters(stats_client, model)
        if now == last and now[0] >= at_least:
            return now
        if time.monotonic() > deadline:
            raise ClientError(
                f"the server counted {now[0]} requests of {model}, not {at_least}, "
                f"{COUNTED_WAIT_S:g} s after answering them"
            )
        last = now


def phase_timed(
    client: TritonClient, stats_client: TritonClient, model: str, inputs: dict[str, np.ndarray], into: list
) -> Connect:
    """One worker's requests: each timed phase by phase, its sample (:data:`PHASES`) appended to ``into``.

    Args:
        client: the measured client (warmed up).
        stats_client: a second client that reads the server's statistics between requests.
        model: the model to call.
        inputs: one batch, ``B x 13`` and ``B x 26``.
        into: where each request's seconds go.
    """
    rows = next(iter(inputs.values())).shape[0]

    @contextmanager
    def connect(_: int) -> Iterator[Request]:
        before = [_settled_counters(stats_client, model, 0)]

        def request(_: int) -> Answer:
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            prepared = client.prepare(model, inputs)
            t1 = time.perf_counter()
            result = client.send(prepared)
            t2 = time.perf_counter()
            client.decode(prepared, result)
            t3 = time.perf_counter()
            cpu1 = time.process_time()
            after = _settled_counters(stats_client, model, before[0][0] + 1)
            if (counted := after[0] - before[0][0]) != 1:
                # Another client's requests are in the server's figures: its time per request
                # would be theirs and ours together.
                raise ClientError(
                    f"the server counted {counted} requests of {model} while this client sent one: "
                    "another client is sending to it; measure on a server nothing else loads"
                )
            server_s = (after[1] - before[0][1]) / 1e9
            into.append((t3 - t0, server_s, t1 - t0, t2 - t1, t3 - t2, cpu1 - cpu0))
            before[0] = after
            return Answer(rows)

        yield request

    return connect


def measure(
    client: TritonClient, stats_client: TritonClient, model: str, inputs: dict[str, np.ndarray], requests: int
) -> np.ndarray:
    """``requests`` requests one after another on the driver: ``requests x 6`` seconds (:data:`PHASES`).

    Raises:
        ClientError: a request failed (a cost is only measured on answered requests).
    """
    samples: list[tuple[float, ...]] = []
    # In this thread: the clients were made here, and tritonclient's HTTP client stays on its thread.
    tally = Driver(phase_timed(client, stats_client, model, inputs, samples), 1, max_requests=requests).run()
    if tally.errors:
        raise ClientError(f"{tally.errors} of {requests} requests failed: {dict(tally.error_kinds)}")
    return np.asarray(samples, dtype=np.float64)


def summarize(options: ClientOptions, batch_size: int, samples: np.ndarray) -> CaseResult:
    """Medians (and the client-side p90) of one case's ``N x 6`` samples, in microseconds."""
    us = samples * 1e6
    client_side = us[:, 0] - us[:, 1]
    median = np.median(us, axis=0)

    def r(value: Any) -> float:
        return round(float(value), 1)

    return CaseResult(
        protocol=options.protocol,
        shared_memory=options.shared_memory,
        batch_size=batch_size,
        requests=int(samples.shape[0]),
        total_us=r(median[0]),
        server_us=r(median[1]),
        client_us=r(np.median(client_side)),
        client_p90_us=r(np.percentile(client_side, 90)),
        build_us=r(median[2]),
        call_us=r(median[3]),
        decode_us=r(median[4]),
        client_cpu_us=r(median[5]),
    )


def run_client_cost(http_url: str, grpc_url: str, options: CostOptions, command: str) -> CostReport:
    """Every transport at every batch size against one running server.

    The cases take turns (``options.rounds`` rounds, each a share of every
    case's requests), so a change in the machine's background load during the
    run affects all cases alike instead of the ones that happened to run then.

    Args:
        http_url: ``host:port`` of the server's HTTP endpoint.
        grpc_url: ``host:port`` of its gRPC endpoint.
        options: model, batch sizes, request counts.
        command: the command line, recorded in the report.
    """
    record = RunRecord.begin(command)
    rows = sample_rows(None, max(options.batch_sizes), seed=3)
    urls = {"http": http_url, "grpc": grpc_url}
    cases = [
        (ClientOptions(urls[protocol], protocol, shared_memory=shared_memory), batch_size)
        for batch_size in options.batch_sizes
        for protocol, shared_memory in TRANSPORTS
    ]
    with ExitStack() as stack:
        stats_client = stack.enter_context(TritonClient(grpc_url, "grpc"))
        server_version = str(stats_client.server_metadata().get("version", "?"))
        clients = [stack.enter_context(TritonClient.from_options(case)) for case, _ in cases]
        inputs = [rows.slice(0, batch_size).inputs() for _, batch_size in cases]
        for client, batch in zip(clients, inputs, strict=True):
            for _ in range(options.warmup):
                client.infer(options.model, batch)
        samples: list[list[np.ndarray]] = [[] for _ in cases]
        shares = [len(part) for part in np.array_split(np.arange(options.requests), options.rounds)]
        for round_index, share in enumerate(shares):
            logger.info("round %d of %d", round_index + 1, options.rounds)
            for index, (client, batch) in enumerate(zip(clients, inputs, strict=True)):
                samples[index].append(measure(client, stats_client, options.model, batch, share))
    report = CostReport(record.finish(), server_version, options)
    for (case, batch_size), parts in zip(cases, samples, strict=True):
        report.cases.append(summarize(case, batch_size, np.concatenate(parts)))
    return report


@contextmanager
def local_server(repository: Path) -> Iterator[tuple[str, str]]:
    """Start the bundle's local tritonserver on ``repository``; yield its HTTP and gRPC urls."""
    from server import LocalServer, ServerConfig

    config = ServerConfig.with_free_ports(repository, log_file=Path("logs/tritonserver-client-cost.log"))
    with LocalServer(config) as server:
        yield server.http_url, server.grpc_url


_TRANSPORT_NAMES = {("http", "none"): "HTTP", ("grpc", "none"): "gRPC"}


def _transport(case: CaseResult) -> str:
    return _TRANSPORT_NAMES.get(
        (case.protocol, case.shared_memory), f"{'HTTP' if case.protocol == 'http' else 'gRPC'} + system shm"
    )


#: The report's named section (:mod:`bundle.snippets`) that the documentation includes: all of it
#: below the title.
SECTION_RESULTS = "results"


def markdown(report: CostReport, reproduce: Sequence[str]) -> list[str]:
    """The report as a Markdown page, with how to reproduce it."""
    options = report.options
    lines = [
        "# Client-side cost per request",
        "",
        section_start(SECTION_RESULTS),
        f"Model `{options.model}` on the bundle's local tritonserver {report.tritonserver} "
        f"(Python-based onnxruntime backend), client and server on the same machine.",
        "",
        *report.record.lines(),
        f"- {options.requests} measured requests per case after {options.warmup} warm-up requests, one "
        f"request in flight (the closed-loop driver, one worker, sync client); the cases take turns in "
        f"{options.rounds} rounds, so background load changes hit them alike",
        "",
        "Medians in microseconds. **client-side** = total - server, where *server* is the request's "
        "time inside tritonserver from its statistics API (read after every request); it holds the "
        "client library, the loopback transport and the server's HTTP/gRPC front end. *build*: "
        "inputs checked against the model metadata and the request tensors made (or copied into "
        "shared memory); *call*: serialize, send, wait, parse (server time included); *decode*: "
        "output to numpy. *client CPU*: the client process's CPU time per request (all threads).",
        "",
    ]
    lines += table(
        ["transport", "batch", "total", "server", "**client-side**", "client-side p90", "build", "call",
         "decode", "client CPU"],
        [
            [_transport(c), str(c.batch_size), f"{c.total_us:.0f}", f"{c.server_us:.0f}",
             f"**{c.client_us:.0f}**", f"{c.client_p90_us:.0f}", f"{c.build_us:.0f}", f"{c.call_us:.0f}",
             f"{c.decode_us:.0f}", f"{c.client_cpu_us:.0f}"]
            for c in report.cases
        ],
    )  # fmt: skip
    lines += ["", "## Reproduce", "", "```bash", *reproduce, "```", section_end(SECTION_RESULTS)]
    return lines


def write_report(report: CostReport, out_dir: Path, reproduce: Sequence[str]) -> dict[str, Path]:
    """Write ``client_cost.json`` and ``client_cost.md`` into ``out_dir``."""
    return {
        "json": write_json(out_dir / "client_cost.json", report.to_json()),
        "markdown": write_markdown(out_dir / "client_cost.md", markdown(report, reproduce)),
    }
