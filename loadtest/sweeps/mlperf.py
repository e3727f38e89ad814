"""MLPerf Inference's scenarios through the official LoadGen (``mlcommons-loadgen``).

``python -m loadtest mlperf --scenario server --target-qps 200 --latency-bound-ms 10`` runs a
served model under LoadGen: LoadGen draws the query arrivals (the Server scenario: Poisson
arrivals at the target QPS, judged against the latency bound at its percentile; the Offline
scenario: every query at once, judged on throughput), times each query from its issue to its
completion, and writes its own logs, whose summary gives the verdict (``Result is : VALID``)
and the latency percentiles. This module is only the system under test: each query sample
is ``--pairs`` rows (user-item pairs) of the request rows (a labelled Criteo file read by the
bundle's payload builder, or synthetic rows), sent to Triton through the bundle's client
(:class:`clients.triton.TritonClient`), one request per query in Server and requests of
``--batch-size`` samples in Offline, from ``--connections`` threads with a client each.
MLPerf's dlrm-v2 reference draws the pairs of each query from a distribution
(``--samples-to-aggregate-quantile-file``: a line of comma-separated pair counts, the
distribution's quantile function, from which each query takes an entry at random: inverse
transform sampling), and ``--pairs`` takes the same file (:class:`PairsPerQuery`), or a range
drawn uniformly (as its ``--samples-to-aggregate-min/max``), or one fixed count.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bundle.errors import BundleError, ConfigError, DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT
from loadtest.engine.collector import collector_held
from loadtest.engine.payload import PayloadPool, RequestForm, request_form

#: LoadGen's scenarios this command runs.
SCENARIOS = ("server", "offline")
#: The summary's keys a run prints.
SHOWN_KEYS = (
    "Scheduled samples per second",
    "Completed samples per second",
    "Samples per second",
    "50.00 percentile latency (ns)",
    "90.00 percentile latency (ns)",
    "99.00 percentile latency (ns)",
    "99.90 percentile latency (ns)",
    "Min duration satisfied",
    "Min queries satisfied",
    "Early stopping satisfied",
)
SUMMARY_FILE = "mlperf_log_summary.txt"


#: Query samples LoadGen's sample library holds where each carries a drawn number of pairs.
VARIABLE_SAMPLES = 1024


@dataclass(frozen=True)
class PairsPerQuery:
    """How many user-item pairs (rows) each query sample carries: ``counts`` drawn uniformly, one per
    sample. One count: every query the same; ``low`` to ``high``: uniform over that range; a
    quantile file's entries: that distribution.

    Attributes:
        counts: the values drawn from (a quantile file's entries, in order), or ``(low, high)``.
        spread: ``fixed``, ``range`` or ``quantile``.
        source: what was asked (``--pairs`` as given).
    """

    counts: tuple[int, ...]
    spread: Literal["fixed", "range", "quantile"]
    source: str

    @classmethod
    def parse(cls, spec: str | int) -> PairsPerQuery:
        """``N`` (every query N pairs), ``MIN:MAX`` (uniform), or a file of MLPerf's quantile format.

        Raises:
            ConfigError: a count below 1, a range the wrong way round, or a file that is not a line
                of comma-separated counts >= 1.
        """
        text = str(spec).strip()
        if re.fullmatch(r"\d+", text):
            count = int(text)
            if count < 1:
                raise ConfigError(f"--pairs must be >= 1, got {text}")
            return cls((count,), "fixed", text)
        if match := re.fullmatch(r"(\d+):(\d+)", text):
            low, high = int(match[1]), int(match[2])
            if not 1 <= low <= high:
                raise ConfigError(f"--pairs MIN:MAX needs 1 <= MIN <= MAX, got {text}")
            return cls((low, high), "range", text)
        path = Path(text)
        try:
            line = path.read_text().strip().splitlines()[0] if path.is_file() else None
        except (OSError, UnicodeDecodeError, IndexError):
            line = None
        if line is None:
            raise ConfigError(f"--pairs must be a count, MIN:MAX or a quantile file, got {text!r}")
        try:
            counts = tuple(int(word) for word in line.replace(",", " ").split())
        except ValueError:
            counts = ()
        if not counts or min(counts) < 1:
            raise ConfigError(f"{path}: not a quantile file (one line of comma-separated pair counts >= 1)")
        return cls(counts, "quantile", text)

    def draw(self, samples: int, rng: np.random.Generator) -> np.ndarray:
        """``samples`` pair counts."""
        if self.spread == "fixed":
            return np.full(samples, self.counts[0], dtype=np.int64)
        if self.spread == "range":
            return rng.integers(self.counts[0], self.counts[1], samples, endpoint=True)
        return np.asarray(self.counts, dtype=np.int64)[rng.integers(0, len(self.counts), samples)]

    def describe(self) -> str:
        """The distribution in a few words."""
        if self.spread == "fixed":
            return f"{self.counts[0]} pairs per query"
        if self.spread == "range":
            return f"{self.counts[0]} to {self.counts[1]} pairs per query, uniform"
        mean = sum(self.counts) / len(self.counts)
        return (
            f"pairs per query from {self.source} ({min(self.counts)} to {max(self.counts)}, mean {mean:.1f})"
        )


class QuerySamples:
    """LoadGen's query samples, each ``sizes[i]`` consecutive rows of ``rows`` (wrapping around),
    held ready as model inputs in ``form``: a pool of users (:attr:`PayloadPool.split`) makes each
    sample one user (its first row's) and its candidates, a ranking request or the tiled rows."""

    def __init__(self, rows: PayloadPool, sizes: np.ndarray, form: RequestForm = "rows") -> None:
        total = rows.dense.shape[0]
        self.sizes = sizes
        self.form = form
        self._samples: list[dict[str, np.ndarray]] = []
        start = 0
        for size in sizes.tolist():
            if rows.split is not None:
                at = (start + np.arange(size)) % total
                request = rows.split.split(rows.dense[at], rows.categorical[at], rows.hotness)
                if form == "ranking":
                    self._samples.append(request)
                else:
                    dense, ids = rows.split.tile(request, rows.hotness)
                    self._samples.append({DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})
                start = (start + size) % total
                continue
            if form == "ranking":
                raise DataError(f"the payload from {rows.source} knows no split of the features")
            # Runs of consecutive rows (PayloadPool.rows), cut where the rows wrap around.
            pieces, left = [], size
            while left:
                stop = min(start + left, total)
                pieces.append(rows.rows(start, stop))
                left -= stop - start
                start = stop % total
            self._samples.append(
                {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}
            )

    def __len__(self) -> int:
        return len(self._samples)

    def batch(self, index: int, form: RequestForm = "rows") -> dict[str, np.ndarray]:
        """Sample ``index``'s inputs (held in :attr:`form` only).

        Raises:
            ConfigError: another form than the samples were made in.
        """
        if form != self.form:
            raise ConfigError(f"the query samples are held as {self.form!r} requests, not {form!r}")
        return self._samples[index % len(self._samples)]


#: Every query one pair (``--pairs``'s default).
ONE_PAIR = PairsPerQuery((1,), "fixed", "1")


def query_samples(
    pool: PayloadPool, pairs: PairsPerQuery, seed: int = 0, form: RequestForm = "rows"
) -> PayloadPool | QuerySamples:
    """The pool's rows as LoadGen's samples in a model's ``form``: batches of the fixed count, or
    :data:`VARIABLE_SAMPLES` samples of drawn counts."""
    if pairs.spread == "fixed":
        return pool.rebatched(pairs.counts[0])
    return QuerySamples(pool, pairs.draw(VARIABLE_SAMPLES, np.random.default_rng(seed)), form)


def loadgen() -> Any:
    """The ``mlperf_loadgen`` module.

    Raises:
        ConfigError: ``mlcommons-loadgen`` is not installed (``make setup`` installs it).
    """
    try:
        import mlperf_loadgen
    except ImportError:
        raise ConfigError(
            "MLPerf's LoadGen is not installed: run `make setup` (it installs mlcommons-loadgen, "
            "whose wheel is for Python 3.11 on x86_64 Linux)"
        ) from None
    return mlperf_loadgen


@dataclass(frozen=True)
class LoadGenRun:
    """What LoadGen said of one run.

    Attributes:
        scenario: ``server`` or ``offline``.
        valid: LoadGen's verdict (``Result is : VALID``).
        summary: every ``key : value`` line of its summary.
        failed: requests the server refused (each query of them still completed for LoadGen).
        log_dir: where LoadGen wrote its logs.
    """

    scenario: str
    valid: bool
    summary: dict[str, str]
    failed: int
    log_dir: Path

    def lines(self) -> list[str]:
        """The verdict and the figures, one per line."""
        verdict = self.summary.get("Result is", "?")
        shown = [f"LoadGen {self.scenario}: Result is {verdict}"]
        for key in SHOWN_KEYS:
            if key in self.summary:
                value = self.summary[key]
                if key.endswith("(ns)") and value.isdigit():
                    shown.append(f"  {key.replace('(ns)', '(ms)')}: {int(value) / 1e6:.3f}")
                else:
                    shown.append(f"  {key}: {value}")
        if self.failed:
            shown.append(f"  requests the server refused: {self.failed} (the run does not count)")
        shown.append(f"  LoadGen's logs: {self.log_dir}")
        return shown


def read_summary(path: Path) -> dict[str, str]:
    """The ``key : value`` lines of LoadGen's summary.

    Raises:
        BundleError: no summary (LoadGen did not finish).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise BundleError(f"LoadGen wrote no summary at {path}: {exc}") from None
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([^:=]+?)\s*:\s*(.+?)\s*$", line)
        if match and match[1] not in found:
            found[match[1]] = match[2]
    return found


def run_loadgen(
    send: Callable[[dict[str, np.ndarray]], None],
    pool: PayloadPool | QuerySamples,
    scenario: str,
    out: Path,
    *,
    target_qps: float,
    latency_bound_ms: float = 10.0,
    duration_s: float = 10.0,
    min_queries: int = 1024,
    batch_size: int = 64,
    connections: int = 8,
    form: RequestForm = "rows",
) -> LoadGenRun:
    """Run LoadGen's ``scenario`` over ``pool``'s samples (each :meth:`batch` one query sample, in
    the model's ``form``), each query sent by ``send(inputs)`` (which raises :class:`BundleError`
    for a refused request). Offline, ``batch_size`` samples go in one request; a ranking model's
    samples, each one user, go one a request (the server batches users).

    Raises:
        ConfigError: an unknown scenario, or figures that are not > 0.
        BundleError: LoadGen wrote no summary.
    """
    lg = loadgen()
    if scenario not in SCENARIOS:
        raise ConfigError(f"--scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    if not (
        target_qps > 0 and latency_bound_ms > 0 and duration_s > 0 and min_queries >= 1 and batch_size >= 1
    ):
        raise ConfigError(
            "--target-qps, --latency-bound-ms and --duration must be > 0, --min-queries and --batch-size >= 1"
        )
    settings = lg.TestSettings()
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(duration_s * 1000)
    settings.min_query_count = min_queries
    if scenario == "server":
        settings.scenario = lg.TestScenario.Server
        settings.server_target_qps = target_qps
        settings.server_target_latency_ns = int(latency_bound_ms * 1e6)
    else:
        settings.scenario = lg.TestScenario.Offline
        settings.offline_expected_qps = target_qps
    samples = len(pool)
    failed = 0
    lock = threading.Lock()
    executor = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="loadgen-sut")

    def handle(chunk: Sequence[Any]) -> None:
        nonlocal failed
        rows = [pool.batch(int(sample.index), form) for sample in chunk]
        inputs = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}
        try:
            send(inputs)
        except BundleError:
            with lock:
                failed += 1
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0) for sample in chunk])

    def issue(query_samples: Sequence[Any]) -> None:
        step = 1 if scenario == "server" or form == "ranking" else batch_size
        for start in range(0, len(query_samples), step):
            executor.submit(handle, query_samples[start : start + step])

    out.mkdir(parents=True, exist_ok=True)
    log_output = lg.LogOutputSettings()
    log_output.outdir = str(out)
    log_output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = log_output
    log_settings.enable_trace = False  # a trace of every query: large, and read by no one here
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(samples, min(samples, 1024), lambda indexes: None, lambda indexes: None)
    try:
        with collector_held():  # no full collection holds the senders (loadtest.engine.collector)
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        executor.shutdown(wait=True)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    summary = read_summary(out / SUMMARY_FILE)
    valid = summary.get("Result is", "").upper() == "VALID" and not failed
    return LoadGenRun(scenario, valid, summary, failed, out)


@contextlib.contextmanager
def triton_sender(url: str, protocol: str, model: str) -> Iterator[Callable[[dict[str, np.ndarray]], None]]:
    """``send(inputs)``: one request of ``model``, each calling thread on a client of its own (made
    at its first request, without retries); every client is closed on exit."""
    from clients.retry import RetryPolicy
    from clients.triton import TritonClient

    wire: Literal["grpc", "http"] = "grpc" if protocol == "grpc" else "http"
    local = threading.local()
    clients: list[TritonClient] = []
    lock = threading.Lock()

    def send(inputs: dict[str, np.ndarray]) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = TritonClient(url, wire, 60.0, retry=RetryPolicy(max_tries=1), validate=False)
            local.client = client
            with lock:
                clients.append(client)
        client.infer(model, inputs)

    try:
        yield send
    finally:
        for client in clients:
            client.close()


def mlperf_run(
    model: str,
    protocol: str,
    url: str | None,
    repository: Path | None,
    scenarios: Sequence[str],
    out: Path,
    *,
    target_qps: float,
    latency_bound_ms: float = 10.0,
    pairs: PairsPerQuery = ONE_PAIR,
    batch_size: int = 64,
    duration_s: float = 60.0,
    min_queries: int = 1024,
    connections: int = 8,
    data: Path | None = None,
) -> list[LoadGenRun]:
    """Each of ``scenarios`` under LoadGen against a running server (``url``) or a local
    tritonserver serving ``repository``; LoadGen's logs under ``out/<scenario>``."""
    from loadtest.sweeps.rates import open_endpoints
    from loadtest.sweeps.runs import models_payload

    loadgen()
    unknown = [name for name in scenarios if name not in SCENARIOS]
    if unknown or not scenarios:
        raise ConfigError(
            f"--scenario must be one of {', '.join(SCENARIOS)}, got {', '.join(unknown) or 'none'}"
        )
    urls = [url] if url else []
    raw = out / "raw"
    payload = models_payload(raw, data, repository, urls, [protocol], [model])
    form = request_form(model)
    pool = query_samples(PayloadPool.load(payload), pairs, form=form)
    runs = []
    with contextlib.ExitStack() as stack:
        ((_, endpoint),) = open_endpoints(stack, [model], [protocol], urls, repository, raw, None)
        send = stack.enter_context(triton_sender(endpoint, protocol, model))
        options: dict[str, Any] = {
            "target_qps": target_qps, "latency_bound_ms": latency_bound_ms, "duration_s": duration_s,
            "min_queries": min_queries, "batch_size": batch_size, "connections": connections, "form": form,
        }  # fmt: skip
        for name in scenarios:
            runs.append(run_loadgen(send, pool, name, out / name, **options))
    return runs
