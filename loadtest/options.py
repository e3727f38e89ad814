"""The options that several ``python -m loadtest`` commands take, each declared once; the
``python -m lab`` commands that measure load take them from here too.

An alias here holds an option's flag, type and help; each command gives its own default
where the commands differ in it (``--batch-size``, ``--seconds``, ...). An alias with a type
parameter (``Protocol[str]``) leaves the type to the command as well, as in
:mod:`bundle.options`, which holds the options of several stages (``--repository``,
``--model``, ``--out``). The options that ``sweep`` and ``compare`` share all come with their
defaults from one builder (``loadtest.__main__``'s ``_sweep_options``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

_T = TypeVar("_T")

# ------------------------------------------------------------------ the request rows
Data = Annotated[
    Path | None,
    typer.Option(
        help="Criteo TSV file for the request rows (default: synthetic rows); for a multi-hot model, "
        "a file of the multi-hot text format is sent with its own bags."
    ),
]
Stream = Annotated[
    bool,
    typer.Option(
        "--stream/--cycle",
        help="--stream: send the --data file's rows in order, each once over the run (rows no cache or "
        "cold tier has seen); --cycle: cycle a pool of at most 32,768 rows.",
    ),
]
BatchSizes = Annotated[
    str, typer.Option("--batch-size", help="Rows per request; comma-separated for several.")
]
RowsPerCall = Annotated[
    _T, typer.Option("--batch-size", help="Rows per call: one request, or one in-process run.")
]

# ------------------------------------------------------------------ the load
Protocol = Annotated[_T, typer.Option("--protocol", help="Wire protocol: grpc or http (default grpc).")]
Url = Annotated[
    _T,
    typer.Option("--url", help="host:port of a running server's endpoint (one per --protocol, in order)."),
]
Concurrency = Annotated[str, typer.Option(help="Requests in flight per step, comma-separated.")]
Duration = Annotated[float, typer.Option(help="Seconds measured per step.")]
Warmup = Annotated[float, typer.Option(help="Seconds of load before each measurement starts.")]
Processes = Annotated[
    int,
    typer.Option(
        help="Client processes per step, at most: the requests in flight are spread over them (0, for "
        "locust: one per 8 users, at most one per core)."
    ),
]
ClientCpus = Annotated[
    str | None,
    typer.Option(
        help="Cores the load generator may run on, e.g. 1 or 2-3 (default: any); keep it off the "
        "server's cores to measure the server, not their contest."
    ),
]
MaxRows = Annotated[
    int,
    typer.Option(help="Skip steps with more than this many rows in flight (concurrency x batch; 0: no cap)."),
]

# ------------------------------------------------------------------ in-process timing
BaselineFlag = Annotated[
    bool, typer.Option("--baseline/--no-baseline", help="Time each model in-process first (needs its file).")
]
BaselineSeconds = Annotated[float, typer.Option(help="Seconds per timed repeat of the in-process baseline.")]
BaselineRepeats = Annotated[int, typer.Option(help="Timed repeats per batch size of the baseline (median).")]
RepeatSeconds = Annotated[float, typer.Option("--seconds", help="Seconds per timed repeat.")]
TimedRepeats = Annotated[
    int, typer.Option("--repeats", help="Timed repeats of each measurement (the median is reported).")
]
GemmSize = Annotated[int, typer.Option(help="N of the N x N x N sgemm that measures the compute ceiling.")]
InProcessThreads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="In-process intra-op threads (default: the model's config.pbtxt, else ORT's default).",
    ),
]

ModelFile = Annotated[
    Path, typer.Option("--model-file", help="The model.onnx, run in-process by ONNX Runtime.")
]

# ------------------------------------------------------------------ the benchmarks
Rounds = Annotated[
    int,
    typer.Option(
        "--rounds",
        help="Turns each measured case takes (a step, a variant, a way of reading), the cases "
        "interleaved; a case's figures are the median of its turns.",
    ),
]
Seconds = Annotated[float, typer.Option(help="Seconds per measured window.")]

# ------------------------------------------------------------------ the search space of tune
Family = Annotated[_T, typer.Option("--model", help="Model family: dlrm or wide_deep.")]
P99Budget = Annotated[_T, typer.Option("--p99-budget-ms", help="p99 latency budget in ms.")]
StartRate = Annotated[
    float, typer.Option("--start-rate", help="The capacity search's first rate, requests/s.")
]
MaxRate = Annotated[float, typer.Option("--max-rate", help="The capacity search's highest rate, requests/s.")]
MinRequests = Annotated[
    int,
    typer.Option(
        "--min-requests",
        help="Requests each rate step holds at least: its window is lengthened at low rates (a p99 "
        "from fewer than 1,000 requests rests on fewer than 10 latencies above it).",
    ),
]
Resolution = Annotated[
    float,
    typer.Option("--resolution", help="Stop when the failing rate is within this share of the passing one."),
]
RequestRates = Annotated[
    str | None,
    typer.Option(
        "--request-rate",
        help="Requests per second, comma-separated: one open-loop step per rate (sent on schedule "
        "whatever the answers do, latency from each request's scheduled time) instead of the "
        "concurrency steps.",
    ),
]
Arrival = Annotated[
    str, typer.Option(help="With --request-rate: poisson (exponential gaps) or constant arrivals.")
]
Connections = Annotated[
    int,
    typer.Option(
        help="With --request-rate: connections, so requests in flight at most (one waits for a free one)."
    ),
]
ClientBatchSizes = Annotated[str, typer.Option("--batch-sizes", help="Client batch sizes, comma-separated.")]
InstanceCounts = Annotated[str, typer.Option("--instances", help="Model instances, comma-separated.")]
ThreadCounts = Annotated[
    str,
    typer.Option("--threads", help="ONNX Runtime threads per instance, comma-separated (0: its default)."),
]
QueueDelays = Annotated[
    str, typer.Option("--queue-delay-us", help="Max queue delays in us, comma-separated.")
]

# ------------------------------------------------------------------ where results go
JsonOut = Annotated[Path | None, typer.Option("--out", help="Also write the results as JSON here.")]
Raw = Annotated[
    Path | None,
    typer.Option(help="Folder for the payload, each step's raw latencies and logs (default: OUT/raw)."),
]
Title = Annotated[str | None, typer.Option(help="Heading of the report.")]
