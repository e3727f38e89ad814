"""``python -m loadtest``: concurrency sweeps, in-process baselines, peer comparison.

Commands:

- ``sweep``: locust headless or perf_analyzer, step by step, against Triton; CSV, JSON, PNG
  curves, report.md; with ``--request-rate``, open-loop steps at given rates
  (:mod:`loadtest.sweeps.rates`).
- ``baseline``: in-process ONNX Runtime throughput and latency of a model file.
- ``compare``: the same sweep against the local Triton, PyTriton and a FastAPI server.
- ``report``: rewrite the CSV, PNGs and report.md of a report.json.
- ``roofline``: this machine's sgemm ceiling, a model's FLOPs per sample, and its in-process and
  served throughput as fractions of that ceiling, in one run.
- ``capacity``: the highest Poisson request rate whose p99 holds a budget (:mod:`loadtest.sweeps.capacity`).
- ``mlperf``: MLPerf's Server and Offline scenarios through the official LoadGen
  (:mod:`loadtest.sweeps.mlperf`).
- ``tune``: search serving configs and client loads within a p99 budget (:mod:`loadtest.tune`).
- ``perf-analyzer install|where``: the reference load tool, fetched into the venv.

The commands that reproduce the committed benchmarks are ``python -m lab``'s; the demo is
``triton-recsys demo``.
"""

from __future__ import annotations

from bundle.grpc_client import use_polling_client

# Before anything imports gRPC: it reads its experiments when it is imported.
use_polling_client()

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bundle.cli import new_app, run, shared_options
from bundle.errors import ConfigError
from bundle.options import Model, OptionalInstall, RawRequests, ReportOut, Repository
from bundle.records import command_line
from loadtest.engine.writer import write_json
from loadtest.options import (
    Arrival,
    BaselineFlag,
    BaselineRepeats,
    BaselineSeconds,
    BatchSizes,
    ClientBatchSizes,
    ClientCpus,
    Concurrency,
    Connections,
    Data,
    Duration,
    Family,
    GemmSize,
    InProcessThreads,
    InstanceCounts,
    JsonOut,
    MaxRate,
    MaxRows,
    MinRequests,
    ModelFile,
    P99Budget,
    Processes,
    Protocol,
    QueueDelays,
    Raw,
    RepeatSeconds,
    RequestRates,
    Resolution,
    Rounds,
    RowsPerCall,
    StartRate,
    Stream,
    ThreadCounts,
    TimedRepeats,
    Title,
    Url,
    Warmup,
)
from loadtest.sweeps.runs import PEERS, RunOptions, compare_run, sweep_run
from loadtest.sweeps.steps import ENGINES, parse_cpus, parse_ints

if TYPE_CHECKING:
    from loadtest.tune.capacity import CapacityPolicy
    from loadtest.tune.search import TuneOptions

app = new_app(
    "Load tests of the served models: sweeps and latency curves, in-process baselines, peer comparison, "
    "the roofline, and the search for the fastest serving config within a p99 budget."
)


def _check_protocols(protocols: list[str]) -> list[str]:
    """``protocols``, each checked to be ``grpc`` or ``http`` (before anything is measured)."""
    for name in protocols:
        if name not in ("grpc", "http"):
            raise ConfigError(f"--protocol must be grpc or http, got {name!r}")
    return protocols


def _write_results(out: Path, results: Any) -> None:
    """``results`` as indented strict JSON in ``out`` (its folder created), and say where."""
    print(f"results: {write_json(out, results)}")


@dataclass(frozen=True)
class SweepSettings:
    """What ``sweep`` and ``compare`` share: every step's options and where the report goes.

    Args:
        run: batch sizes, concurrency, step times, data and the in-process baseline.
        out: the report folder.
        raw: the folder of the payload, raw latencies and logs (None: ``out/raw``).
        title: the report's heading (None: the command's own).
    """

    run: RunOptions
    out: Path
    raw: Path | None
    title: str | None


def _sweep_options(default_batch_sizes: str, default_out: Path) -> Callable[..., SweepSettings]:
    """The options ``sweep`` and ``compare`` share, declared once (:func:`bundle.cli.shared_options`);
    the two defaults the commands differ in are the arguments."""

    def build(
        batch_size: BatchSizes = default_batch_sizes,
        concurrency: Concurrency = "1,2,4,8",
        duration: Duration = 10.0,
        warmup: Warmup = 2.0,
        processes: Processes = 0,
        max_rows_in_flight: MaxRows = 0,
        data: Data = None,
        out: ReportOut[Path] = default_out,
        raw: Raw = None,
        baseline: BaselineFlag = True,
        baseline_seconds: BaselineSeconds = 1.0,
        baseline_repeats: BaselineRepeats = 5,
        title: Title = None,
        rounds: Rounds = 1,
        client_cpus: ClientCpus = None,
        stream: Stream = False,
    ) -> SweepSettings:
        run_options = RunOptions(
            batch_sizes=parse_ints(batch_size, "--batch-size"),
            concurrency=parse_ints(concurrency, "--concurrency"),
            duration_s=duration,
            warmup_s=warmup,
            processes=processes,
            max_rows_in_flight=max_rows_in_flight,
            data=data,
            baseline=baseline,
            baseline_seconds=baseline_seconds,
            baseline_repeats=baseline_repeats,
            rounds=rounds,
            client_cpus=None if client_cpus is None else parse_cpus(client_cpus),
            stream=stream,
        )
        return SweepSettings(run_options, out, raw, title)

    return build


@app.command()
@shared_options(settings=_sweep_options("1", Path("reports/loadtest")))
def sweep(
    settings: SweepSettings,
    model: Model[list[str]],
    protocol: Protocol[list[str] | None] = None,
    url: Url[list[str] | None] = None,
    repository: Repository[Path | None] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help=f"What generates the load: {' or '.join(ENGINES)}, or both comma-separated (their steps "
            "interleaved on the same server, and compared in the report). perf_analyzer is Triton's own "
            "load tool, the reference (installed by make setup). Default: locust; with --request-rate, "
            "driver (the open loop)."
        ),
    ] = None,
    request_rate: RequestRates = None,
    arrival: Arrival = "poisson",
    connections: Connections = 64,
    p99_budget: P99Budget[float | None] = None,
) -> None:
    """Sweep concurrency with locust or perf_analyzer, step by step: CSV, JSON, PNG curves, report.md;
    or, with --request-rate, open-loop steps at those rates: rates.md, rates.json, rates.png.

    Without --url, a local tritonserver serves --repository; its model files also give the
    in-process baseline (of the concurrency steps)."""
    protocols = _check_protocols(protocol or ["grpc"])
    if request_rate is not None:
        _rate_sweep(settings, model, protocols, url or [], repository, engine, request_rate, arrival,
                    connections, p99_budget)  # fmt: skip
        return
    engines = tuple(name.strip() for name in (engine or "locust").split(",") if name.strip())
    _, paths = sweep_run(
        models=model,
        protocols=protocols,
        urls=url or [],
        repository=repository,
        options=replace(settings.run, engines=engines),
        out=settings.out,
        title=settings.title or f"Load test: {', '.join(model)} over {', '.join(protocols)}",
        command=command_line("loadtest"),
        raw=settings.raw,
    )
    print(f"report: {paths['markdown']}")


def _rate_sweep(
    settings: SweepSettings,
    models: list[str],
    protocols: list[str],
    urls: list[str],
    repository: Path | None,
    engine: str | None,
    request_rate: str,
    arrival: str,
    connections: int,
    budget_ms: float | None,
) -> None:
    """The open-loop steps of ``sweep --request-rate``."""
    from loadtest.sweeps.rates import RateLoad, parse_rates, rate_run

    engines = tuple(name.strip() for name in (engine or "driver").split(",") if name.strip())
    options = settings.run
    if options.stream:
        raise ConfigError("--request-rate cycles a pool of rows: drop --stream")
    _, paths = rate_run(
        models, protocols, urls, repository, options.batch_sizes, parse_rates(request_rate), settings.out,
        settings.title or f"Open-loop load: {', '.join(models)} over {', '.join(protocols)}",
        command_line("loadtest"),
        RateLoad(arrival, connections, options.duration_s, options.warmup_s, options.request_timeout_s,
                 options.client_cpus),
        data=options.data, budget_ms=budget_ms, raw=settings.raw, engines=engines, rounds=options.rounds,
    )  # fmt: skip
    print(f"report: {paths['markdown']}")


@app.command()
@shared_options(settings=_sweep_options("1,64,1024", Path("reports/peers")))
def compare(
    settings: SweepSettings,
    repository: Repository[Path],
    model: Model[str] = "dlrm_onnx",
    protocol: Protocol[str] = "grpc",
    peer: Annotated[
        list[str] | None, typer.Option(help="pytriton and/or fastapi (repeatable; default both).")
    ] = None,
) -> None:
    """The same model and sweep against the local Triton, PyTriton + ONNX Runtime, FastAPI + ONNX Runtime
    (--protocol is Triton's and PyTriton's; FastAPI speaks HTTP)."""
    _check_protocols([protocol])
    _, paths = compare_run(
        repository=repository,
        model=model,
        protocol=protocol,
        options=settings.run,
        out=settings.out,
        title=settings.title or f"Peer comparison: {model}, local Triton vs {', '.join(peer or PEERS)}",
        command=command_line("loadtest"),
        peers=peer or PEERS,
        raw=settings.raw,
    )
    print(f"report: {paths['markdown']}")


@app.command("baseline")
def baseline_command(
    model_file: ModelFile,
    batch_size: BatchSizes = "1,64,1024",
    repeats: TimedRepeats = 5,
    seconds: RepeatSeconds = 1.0,
    threads: InProcessThreads = None,
    data: Data = None,
    out: JsonOut = None,
) -> None:
    """In-process ONNX Runtime throughput and latency of a model file, per batch size."""
    from loadtest.engine.baseline import BaselineConfig, run_baseline
    from loadtest.engine.payload import MAX_POOL_ROWS, build_pool

    config = BaselineConfig(model_file, parse_ints(batch_size, "--batch-size"), repeats, seconds, threads)
    results = run_baseline(config, build_pool(1, data=data, batches=MAX_POOL_ROWS))
    table = Table(title=f"in-process ONNX Runtime: {model_file}")
    for column in ("batch", "threads", "samples/s (median)", "calls/s", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.batch_size),
            str(r.threads or "default"),
            f"{r.samples_per_s:,.0f}",
            f"{r.calls_per_s:,.1f}",
            f"{r.p50_ms:.3f}",
            f"{r.p99_ms:.3f}",
        )
    Console().print(table)
    if out is not None:
        _write_results(out, [r.as_dict() for r in results])


@app.command()
def report(
    json_file: Annotated[
        Path,
        typer.Argument(
            help="A report.json written by sweep or compare, or a rates.json of request-rate steps."
        ),
    ],
    out: ReportOut[Path | None] = None,
) -> None:
    """Rewrite steps.csv, the PNG curves and report.md from a report.json, or rates.md and rates.png
    from a rates.json (beside it, unless --out)."""
    from loadtest.sweeps.rates import rate_document, rewrite_rate_report
    from loadtest.sweeps.report import Report, write_report

    document = rate_document(json_file)
    if document is not None:
        paths = rewrite_rate_report(json_file, out or json_file.parent, document)
    else:
        paths = write_report(Report.load(json_file), out or json_file.parent)
    print(f"report: {paths['markdown']}")


@app.command()
def roofline(
    model_file: ModelFile,
    model: Model[str | None] = None,
    url: Url[str | None] = None,
    protocol: Protocol[str] = "grpc",
    batch_size: RowsPerCall[int] = 1024,
    concurrency: Concurrency = "1,2,4",
    seconds: RepeatSeconds = 3.0,
    repeats: TimedRepeats = 5,
    threads: InProcessThreads = None,
    gemm_size: GemmSize = 4096,
    data: Data = None,
    out: JsonOut = None,
) -> None:
    """FP32 sgemm ceiling, the model's FLOPs per sample, and its in-process (and, with --url and
    --model, served) samples/s as fractions of the ceiling, measured in one run."""
    from loadtest.roofline import RooflineOptions, report_lines, run_roofline

    _check_protocols([protocol])
    options = RooflineOptions(
        model_file=model_file,
        model=model,
        url=url,
        protocol=protocol,
        batch_size=batch_size,
        concurrency=parse_ints(concurrency, "--concurrency"),
        seconds=seconds,
        repeats=repeats,
        threads=threads,
        gemm_size=gemm_size,
        data=data,
    )
    with Console().status("measuring the ceiling, then in-process, then served throughput"):
        result = run_roofline(options, command_line("loadtest"))
    for line in report_lines(result):
        print(line)
    if out is not None:
        _write_results(out, result)


perf_analyzer_app = new_app("perf_analyzer, Triton's own load tool, the reference of every load test here.")
app.add_typer(perf_analyzer_app, name="perf-analyzer")


@perf_analyzer_app.command("install")
def perf_analyzer_install(optional: OptionalInstall = False) -> None:
    """Download the pinned perf_analyzer and its libraries (requirements-perf-analyzer.txt) into the venv."""
    from bundle.errors import BundleError
    from loadtest.sweeps.perf_analyzer_install import install

    try:
        wrapper = install(progress=lambda line: print(f"perf_analyzer: {line}"))
    except BundleError as exc:
        if not optional:
            raise
        print(f"perf_analyzer not installed: {exc}; the tests that drive it will skip")
        return
    print(f"perf_analyzer: {wrapper}")


@perf_analyzer_app.command("where")
def perf_analyzer_where() -> None:
    """The perf_analyzer the load tests use, or why there is none (exit 1)."""
    from loadtest.sweeps.perf_analyzer_install import require

    print(require())


@app.command()
def capacity(
    model: Model[str],
    p99_budget_ms: P99Budget[float],
    repository: Repository[Path | None] = None,
    url: Url[str | None] = None,
    protocol: Protocol[str] = "grpc",
    batch_size: RowsPerCall[int] = 1,
    start_rate: StartRate = 50.0,
    resolution: Resolution = 0.05,
    max_rate: MaxRate = 100_000.0,
    min_requests: MinRequests = 1000,
    connections: Connections = 64,
    duration: Duration = 10.0,
    warmup: Warmup = 2.0,
    data: Data = None,
    client_cpus: ClientCpus = None,
    out: ReportOut[Path] = Path("reports/capacity"),
    title: Title = None,
) -> None:
    """The highest Poisson request rate whose p99, from each request's scheduled time, holds
    --p99-budget-ms: doubling, then halving the interval to --resolution; capacity.md, .json, .png."""
    from loadtest.sweeps.capacity import capacity_run
    from loadtest.sweeps.rates import RateLoad

    _check_protocols([protocol])
    result, paths = capacity_run(
        model, protocol, url, repository, batch_size, p99_budget_ms, out,
        title or f"Capacity of {model} at p99 {p99_budget_ms:g} ms", command_line("loadtest"),
        start=start_rate, resolution=resolution, max_rate=max_rate, data=data,
        load=RateLoad(connections=connections, duration_s=duration, warmup_s=warmup,
                      client_cpus=None if client_cpus is None else parse_cpus(client_cpus),
                      min_requests=min_requests),
    )  # fmt: skip
    print(result.statement())
    print(f"report: {paths['markdown']}")


@app.command()
def mlperf(
    model: Model[str],
    scenario: Annotated[
        list[str] | None,
        typer.Option(help="LoadGen's scenario: server or offline (repeatable; default server)."),
    ] = None,
    target_qps: Annotated[
        float,
        typer.Option(help="Server: the Poisson arrival rate; Offline: the expected throughput (queries/s)."),
    ] = 100.0,
    latency_bound_ms: Annotated[
        float, typer.Option(help="Server: the latency bound at LoadGen's percentile (99 %).")
    ] = 10.0,
    repository: Repository[Path | None] = None,
    url: Url[str | None] = None,
    protocol: Protocol[str] = "grpc",
    pairs: Annotated[
        str,
        typer.Option(
            help="User-item pairs (rows) in each query sample: N, MIN:MAX (uniform), or a file of "
            "MLPerf's quantile format (dlrm-v2's --samples-to-aggregate-quantile-file)."
        ),
    ] = "1",
    batch_size: Annotated[
        int, typer.Option("--samples-per-request", help="Offline: query samples per request.")
    ] = 64,
    duration: Annotated[
        float, typer.Option("--min-duration", help="LoadGen's minimum duration, seconds.")
    ] = 60.0,
    min_queries: Annotated[int, typer.Option(help="LoadGen's minimum query count.")] = 1024,
    connections: Connections = 8,
    data: Data = None,
    out: ReportOut[Path] = Path("reports/mlperf"),
) -> None:
    """MLPerf Inference's Server and Offline scenarios through the official LoadGen
    (mlcommons-loadgen): LoadGen's verdict (VALID or INVALID), its latency percentiles, its logs."""
    from loadtest.sweeps.mlperf import PairsPerQuery, mlperf_run

    _check_protocols([protocol])
    per_query = PairsPerQuery.parse(pairs)
    print(f"query samples: {per_query.describe()}")
    runs = mlperf_run(
        model, protocol, url, repository, scenario or ["server"], out, target_qps=target_qps,
        latency_bound_ms=latency_bound_ms, pairs=per_query, batch_size=batch_size, duration_s=duration,
        min_queries=min_queries, connections=connections, data=data,
    )  # fmt: skip
    for done in runs:
        print("\n".join(done.lines()))


@app.command()
def tune(
    repository: Repository[Path],
    model: Family[str],
    p99_budget_ms: P99Budget[float],
    batch_sizes: ClientBatchSizes = "64,256,1024",
    concurrency: Concurrency = "1,2,4,8",
    variants: Annotated[str, typer.Option(help="Variants to try: fp32, fp16, int8 (comma-separated).")] = (
        "fp32,fp16,int8"
    ),
    instances: InstanceCounts = "1,2",
    threads: ThreadCounts = "0,1",
    queue_delay_us: QueueDelays = "100,2000",
    preferred: Annotated[
        str, typer.Option(help="Preferred batch size sets, ';'-separated, 'none' for none: e.g. 'none;2048'.")
    ] = "none",
    window: Annotated[float, typer.Option(help="Seconds per measurement window.")] = 0.5,
    warmup: Warmup = 0.5,
    min_windows: Annotated[int, typer.Option(help="Windows before a step may stop early.")] = 3,
    max_windows: Annotated[
        int, typer.Option(help="Windows of an undecided step (every step of --brute-force).")
    ] = 8,
    precision_: Annotated[
        float,
        typer.Option("--precision", help="A step is decided once its samples/s CI is this tight (relative)."),
    ] = 0.10,
    confirm_rounds: Annotated[int, typer.Option(help="Rounds of finalists vs default, side by side.")] = 3,
    finalists: Annotated[int, typer.Option(help="Best configs re-measured beside the default.")] = 3,
    top: Annotated[int, typer.Option(help="Configurations listed with their config.pbtxt diffs.")] = 5,
    brute_force: Annotated[
        bool, typer.Option("--brute-force", help="Measure every grid point for max-windows (no pruning).")
    ] = False,
    apply: Annotated[
        bool, typer.Option("--apply", help="Write the winner's config into --repository.")
    ] = False,
    data: Data = None,
    raw: RawRequests = False,
    objective: Annotated[
        str,
        typer.Option(
            help="throughput: the most samples/s of closed-loop users within the budget; capacity: the "
            "highest Poisson request rate whose p99 holds it (open loop; --concurrency is not used)."
        ),
    ] = "throughput",
    start_rate: StartRate = 50.0,
    resolution: Resolution = 0.05,
    max_rate: MaxRate = 100_000.0,
    min_requests: MinRequests = 1000,
    connections: Connections = 64,
    rate_window: Annotated[
        float, typer.Option(help="With --objective capacity: seconds measured per rate step (at least).")
    ] = 10.0,
    out: ReportOut[Path] = Path("reports/tune"),
) -> None:
    """Search serving configs and client loads for the most samples/s within a p99 budget
    (with --raw, of each variant's raw-row model; the config searched is the variant's), or with
    --objective capacity for the highest Poisson rate whose p99 holds it."""
    from dataclasses import replace as with_changes

    from loadtest.tune.search import Policy, TuneOptions, apply_winner
    from loadtest.tune.space import Space, parse_preferred

    if objective not in ("throughput", "capacity"):
        raise ConfigError(f"--objective must be throughput or capacity, got {objective!r}")

    space = Space(
        family=model,
        variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
        instances=parse_ints(instances, "--instances"),
        threads=tuple(int(t) for t in threads.split(",") if t.strip()),
        queue_delays_us=tuple(int(d) for d in queue_delay_us.split(",") if d.strip()),
        preferred=parse_preferred(preferred),
        batch_sizes=parse_ints(batch_sizes, "--batch-sizes"),
        concurrency=parse_ints(concurrency, "--concurrency"),
    )
    policy = Policy(
        budget_ms=p99_budget_ms,
        window_s=window,
        warmup_s=warmup,
        min_windows=min_windows,
        max_windows=max_windows,
        precision=precision_,
        confirm_rounds=confirm_rounds,
        finalists=finalists,
    )
    if brute_force:
        policy = with_changes(policy, adaptive=False)
    options = TuneOptions(repository, space, policy, data, top, raw=raw)
    if objective == "capacity":
        from loadtest.sweeps.rates import RateLoad
        from loadtest.tune.capacity import CapacityPolicy

        capacity = CapacityPolicy(
            p99_budget_ms, RateLoad(connections=connections, duration_s=rate_window, warmup_s=warmup,
                                    min_requests=min_requests),
            start_rate, resolution, max_rate, rounds=confirm_rounds, finalists=finalists,
            step_downs=policy.step_downs,
        )  # fmt: skip
        document = _tune_capacity(options, capacity, out)
    else:
        document = _tune_throughput(options, out)
    if apply:
        path, diff = apply_winner(repository, document)
        print(f"applied: {path}")
        print(diff or "(no change)", end="" if diff else "\n")


def _tune_throughput(options: TuneOptions, out: Path) -> dict[str, Any]:
    """The closed-loop tune: search, confirm, report (report.md); its document."""
    from loadtest.tune.report import write_tune
    from loadtest.tune.search import run_tune

    p99_budget_ms = options.policy.budget_ms
    document = run_tune(options, command_line("loadtest"))
    paths = write_tune(document, out)
    winner = document["winner"]
    if winner is None:
        print(
            f"no configuration kept p99 within {p99_budget_ms:g} ms side by side; report: {paths['markdown']}"
        )
    else:
        confirmed = winner.get("confirmed") or winner
        print(
            f"winner: {winner['model']} {winner['server_label']} at B={winner['client']['batch_size']} "
            f"c={winner['client']['concurrency']}: {confirmed['samples_per_s']:,.0f} samples/s, "
            f"p99 {confirmed['p99_ms']:.2f} ms; report: {paths['markdown']}"
        )
        if confirmed.get("client_bound") or winner.get("client_bound"):
            print(
                "client-bound: the load generator limited every step that held the budget; the server "
                "can do more than this (larger batches, or --client-cpus to keep the client off its cores)"
            )
    return document


def _tune_capacity(options: TuneOptions, policy: CapacityPolicy, out: Path) -> dict[str, Any]:
    """``tune --objective capacity``: search, confirm, report (capacity.md); its document."""
    from rich.progress import Progress

    from loadtest.tune.capacity import run_capacity_tune, write_capacity_tune
    from loadtest.tune.search import ServedProbe

    with Progress(console=Console(stderr=True, soft_wrap=True), transient=True) as progress:
        task = progress.add_task("starting the local tritonserver and loading the models", total=None)
        document = run_capacity_tune(
            options, policy,
            lambda pools: ServedProbe(options.repository, options.space.family, pools, options.log_file,
                                      options.raw),
            command_line("loadtest"), lambda line: progress.update(task, description=line),
        )  # fmt: skip
    paths = write_capacity_tune(document, out)
    winner = document["winner"]
    if winner is None:
        print(f"no configuration held p99 {policy.budget_ms:g} ms side by side; report: {paths['markdown']}")
    else:
        print(
            f"winner: {winner['model']} {winner['server_label']} at B={winner['batch_size']}: "
            f"{winner['rate']:g} requests/s ({winner['samples_per_s']:,.0f} samples/s), median p99 "
            f"{winner['confirmed_p99_ms']:.2f} ms; report: {paths['markdown']}"
        )
    return document


if __name__ == "__main__":
    run(app)
