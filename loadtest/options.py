"""The options that several ``python -m loadtest`` commands take, each declared once.

An alias here holds an option's flag, type and help; each command gives its own default
where the commands differ in it (``--out``, ``--batch-size``, ``--seconds``, ...). The
options that ``sweep`` and ``compare`` share all come with their defaults from one builder
(``loadtest.__main__``'s ``_sweep_options``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
RowsPerCall = Annotated[int, typer.Option("--batch-size", help="Rows per call.")]

# ------------------------------------------------------------------ the load
Protocol = Annotated[str, typer.Option(help="grpc or http.")]
Concurrency = Annotated[str, typer.Option(help="Requests in flight per step, comma-separated.")]
Duration = Annotated[float, typer.Option(help="Seconds measured per step.")]
Warmup = Annotated[float, typer.Option(help="Seconds run before each step's measurement.")]
Processes = Annotated[
    int, typer.Option(help="locust processes per step (0: one per 8 users, at most one per core).")
]
ClientCpus = Annotated[
    str | None,
    typer.Option(
        help="Cores the load generator may run on, e.g. 1 or 2-3 (default: any); keep it off the "
        "server's cores to measure the server, not their contest."
    ),
]
StepRounds = Annotated[
    int,
    typer.Option(
        "--rounds",
        help="Times each step runs (its targets interleaved); a step's figures are the median of its "
        "rounds and the report shows their spread.",
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
TimedRepeats = Annotated[int, typer.Option("--repeats", help="Timed repeats (medians reported).")]
InProcessThreads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="In-process intra-op threads (default: the model's config.pbtxt, else ORT's default).",
    ),
]

# ------------------------------------------------------------------ the benchmarks
Repository = Annotated[Path, typer.Option(help="Exported cpu-profile model repository.")]
Rounds = Annotated[int, typer.Option(help="Turns over the variants or candidates (medians reported).")]
Seconds = Annotated[float, typer.Option(help="Seconds per measured window.")]

# ------------------------------------------------------------------ where results go
Out = Annotated[Path, typer.Option(help="Report folder.")]
CpuOut = Annotated[Path, typer.Option(help="Folder for the result files.")]
JsonOut = Annotated[Path | None, typer.Option("--out", help="Also write the results as JSON here.")]
Raw = Annotated[
    Path | None,
    typer.Option(help="Folder for the payload, each step's raw latencies and logs (default: OUT/raw)."),
]
Title = Annotated[str | None, typer.Option(help="Heading of the report.")]
