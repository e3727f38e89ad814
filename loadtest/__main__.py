"""``python -m loadtest``: concurrency sweeps, in-process baselines, peer comparison.

Commands:

- ``sweep``: locust headless, step by step, against Triton; CSV, JSON, PNG curves, report.md.
- ``baseline``: in-process ONNX Runtime throughput and latency of a model file.
- ``compare``: the same sweep against the local Triton, PyTriton and a FastAPI server.
- ``report``: rewrite the CSV, PNGs and report.md of a report.json.
- ``roofline``: this machine's sgemm ceiling, a model's FLOPs per sample, and its in-process and
  served throughput as fractions of that ceiling, in one run.
- ``soak``, ``client-cost``, ``precision``, ``serving-defaults``, ``faults``: the benchmarks whose committed
  results live under ``benchmarks/`` (see :mod:`loadtest.commands`).
- ``tune``: search serving configs and client loads within a p99 budget (:mod:`loadtest.tune`).
- ``demo``: the whole path on this machine, data to load test (``make demo``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bundle.cli import new_app, run
from bundle.errors import ConfigError
from bundle.records import command_line
from loadtest import commands
from loadtest.engine.writer import write_json
from loadtest.sweeps.runs import PEERS, RunOptions, compare_run, sweep_run
from loadtest.sweeps.sweep import parse_ints

app = new_app(
    "Load tests and benchmarks of the served models: sweeps, latency curves, baselines, peer comparison, "
    "roofline, soak, client cost, CPU precision and serving defaults; and the demo."
)

BatchSizes = Annotated[
    str, typer.Option("--batch-size", help="Rows per request; comma-separated for several.")
]
Concurrency = Annotated[str, typer.Option(help="Requests in flight per step, comma-separated.")]
Duration = Annotated[float, typer.Option(help="Seconds measured per step.")]
Warmup = Annotated[float, typer.Option(help="Seconds run before each step's measurement.")]
Processes = Annotated[
    int, typer.Option(help="locust processes per step (0: one per 8 users, at most one per core).")
]
MaxRows = Annotated[
    int,
    typer.Option(help="Skip steps with more than this many rows in flight (concurrency x batch; 0: no cap)."),
]
Data = Annotated[
    Path | None, typer.Option(help="Criteo TSV file for the request rows (default: synthetic rows).")
]
Out = Annotated[Path, typer.Option(help="Report folder.")]
Raw = Annotated[
    Path | None,
    typer.Option(help="Folder for the payload, each step's raw latencies and logs (default: OUT/raw)."),
]
BaselineFlag = Annotated[
    bool, typer.Option("--baseline/--no-baseline", help="Time each model in-process first (needs its file).")
]
BaselineSeconds = Annotated[float, typer.Option(help="Seconds per timed repeat of the in-process baseline.")]
BaselineRepeats = Annotated[int, typer.Option(help="Timed repeats per batch size of the baseline (median).")]
Title = Annotated[str | None, typer.Option(help="Heading of the report.")]


def _check_protocols(protocols: list[str]) -> list[str]:
    """``protocols``, each checked to be ``grpc`` or ``http`` (before anything is measured)."""
    for name in protocols:
        if name not in ("grpc", "http"):
            raise ConfigError(f"--protocol must be grpc or http, got {name!r}")
    return protocols


def _write_results(out: Path, results: Any) -> None:
    """``results`` as indented strict JSON in ``out`` (its folder created), and say where."""
    print(f"results: {write_json(out, results)}")


def _options(
    batch_size: str,
    concurrency: str,
    duration: float,
    warmup: float,
    processes: int,
    max_rows_in_flight: int,
    data: Path | None,
    baseline: bool,
    baseline_seconds: float,
    baseline_repeats: int,
) -> RunOptions:
    return RunOptions(
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
    )


@app.command()
def sweep(
    model: Annotated[list[str], typer.Option(help="Model to load (repeatable).")],
    protocol: Annotated[
        list[str] | None, typer.Option(help="grpc or http (repeatable; default grpc).")
    ] = None,
    url: Annotated[
        list[str] | None,
        typer.Option(help="host:port of a running server's endpoint, one per --protocol in the same order."),
    ] = None,
    repository: Annotated[
        Path | None,
        typer.Option(
            help="Model repository: model files for the baseline; served by a local tritonserver "
            "when no --url is given."
        ),
    ] = None,
    batch_size: BatchSizes = "1",
    concurrency: Concurrency = "1,2,4,8",
    duration: Duration = 10.0,
    warmup: Warmup = 2.0,
    processes: Processes = 0,
    max_rows_in_flight: MaxRows = 0,
    data: Data = None,
    out: Out = Path("reports/loadtest"),
    raw: Raw = None,
    baseline: BaselineFlag = True,
    baseline_seconds: BaselineSeconds = 1.0,
    baseline_repeats: BaselineRepeats = 5,
    title: Title = None,
) -> None:
    """Sweep concurrency with locust (headless, step by step); write CSV, JSON, PNG curves and report.md."""
    protocols = _check_protocols(protocol or ["grpc"])
    options = _options(
        batch_size, concurrency, duration, warmup, processes, max_rows_in_flight,
        data, baseline, baseline_seconds, baseline_repeats,
    )  # fmt: skip
    _, paths = sweep_run(
        models=model,
        protocols=protocols,
        urls=url or [],
        repository=repository,
        options=options,
        out=out,
        title=title or f"Load test: {', '.join(model)} over {', '.join(protocols)}",
        command=command_line("loadtest"),
        raw=raw,
    )
    print(f"report: {paths['markdown']}")


@app.command()
def compare(
    repository: Annotated[Path, typer.Option(help="Model repository holding <model>/1/model.onnx.")],
    model: Annotated[str, typer.Option(help="Model to serve by all three.")] = "dlrm_onnx",
    protocol: Annotated[str, typer.Option(help="grpc or http for Triton and PyTriton.")] = "grpc",
    peer: Annotated[
        list[str] | None, typer.Option(help="pytriton and/or fastapi (repeatable; default both).")
    ] = None,
    batch_size: BatchSizes = "1,64,1024",
    concurrency: Concurrency = "1,2,4,8",
    duration: Duration = 10.0,
    warmup: Warmup = 2.0,
    processes: Processes = 0,
    max_rows_in_flight: MaxRows = 0,
    data: Data = None,
    out: Out = Path("reports/peers"),
    raw: Raw = None,
    baseline: BaselineFlag = True,
    baseline_seconds: BaselineSeconds = 1.0,
    baseline_repeats: BaselineRepeats = 5,
    title: Title = None,
    rounds: Annotated[
        int,
        typer.Option(
            help="Times each batch/concurrency level runs (servers interleaved); each server's "
            "rates and percentiles are the median of its rounds."
        ),
    ] = 1,
) -> None:
    """The same model and sweep against the local Triton, PyTriton + ONNX Runtime, FastAPI + ONNX Runtime."""
    _check_protocols([protocol])
    options = _options(
        batch_size, concurrency, duration, warmup, processes, max_rows_in_flight,
        data, baseline, baseline_seconds, baseline_repeats,
    )  # fmt: skip
    _, paths = compare_run(
        repository=repository,
        model=model,
        protocol=protocol,
        options=options,
        out=out,
        title=title or f"Peer comparison: {model}, local Triton vs {', '.join(peer or PEERS)}",
        command=command_line("loadtest"),
        peers=peer or PEERS,
        raw=raw,
        rounds=rounds,
    )
    print(f"report: {paths['markdown']}")


@app.command("baseline")
def baseline_command(
    model_file: Annotated[Path, typer.Option(help="The model.onnx to time.")],
    batch_size: BatchSizes = "1,64,1024",
    repeats: Annotated[int, typer.Option(help="Timed repeats per batch size (median reported).")] = 5,
    seconds: Annotated[float, typer.Option(help="Seconds per repeat.")] = 1.0,
    threads: Annotated[
        int | None,
        typer.Option(help="Intra-op threads (default: the model's config.pbtxt, else ORT's default)."),
    ] = None,
    data: Data = None,
    out: Annotated[Path | None, typer.Option(help="Also write the results as JSON here.")] = None,
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
    json_file: Annotated[Path, typer.Argument(help="A report.json written by sweep or compare.")],
    out: Annotated[Path | None, typer.Option(help="Folder to write into (default: beside the JSON).")] = None,
) -> None:
    """Rewrite steps.csv, the PNG curves and report.md from a report.json."""
    from loadtest.sweeps.report import Report, write_report

    paths = write_report(Report.load(json_file), out or json_file.parent)
    print(f"report: {paths['markdown']}")


@app.command()
def roofline(
    model_file: Annotated[Path, typer.Option(help="The model.onnx to count and time in-process.")],
    model: Annotated[str | None, typer.Option(help="Served model name (with --url).")] = None,
    url: Annotated[
        str | None, typer.Option(help="HOST:PORT of the server (gRPC or HTTP, see --protocol).")
    ] = None,
    protocol: Annotated[str, typer.Option(help="grpc or http.")] = "grpc",
    batch_size: Annotated[int, typer.Option(help="Rows per call.")] = 1024,
    concurrency: Concurrency = "1,2,4",
    seconds: Annotated[float, typer.Option(help="Seconds per timed repeat.")] = 3.0,
    repeats: Annotated[int, typer.Option(help="Timed repeats (medians reported).")] = 5,
    threads: Annotated[
        int | None,
        typer.Option(help="In-process intra-op threads (default: the model's config.pbtxt, else ORT's)."),
    ] = None,
    gemm_size: Annotated[
        int, typer.Option(help="N of the N x N x N sgemm that measures the ceiling.")
    ] = 4096,
    data: Data = None,
    out: Annotated[Path | None, typer.Option(help="Also write the results as JSON here.")] = None,
) -> None:
    """FP32 sgemm ceiling, the model's FLOPs per sample, and its in-process (and served)
    samples/s as fractions of the ceiling, measured in one run."""
    from loadtest.benchmarks.roofline import RooflineOptions, report_lines, run_roofline

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


app.command()(commands.soak)
app.command("client-cost")(commands.client_cost)
app.command()(commands.precision)
app.command("serving-defaults")(commands.serving_defaults)
app.command()(commands.gpu)
app.command()(commands.kernels)
app.command()(commands.tune)
app.command()(commands.faults)
app.command()(commands.demo)


if __name__ == "__main__":
    run(app)
