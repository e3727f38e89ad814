"""The command-line options that the commands of several stages take, each declared once.

An alias holds an option's flags and help; each command gives its own default. An alias with a
type parameter (``Repository[Path]``, ``Model[list[str] | None]``) is one option that commands take
as one value, a repeated one or an optional one: the command gives the type as well, and the
declaration stays one. A flag that means two things gets one alias per meaning (``--repository``
to read and to write into).

Options of one stage live in that stage (:mod:`loadtest.options` holds the load tests', which
the lab shares); options whose help names a stage's constants live in the lowest stage that
holds them (:mod:`criteo.options`, :mod:`models.options`). ``tests/unit/test_cli_options.py``
fails when a flag that two commands take is declared inline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

from bundle.admin import ADMIN_KEY_ENV

_T = TypeVar("_T")

# ------------------------------------------------------------------ model repositories and models
Repository = Annotated[
    _T, typer.Option("--repository", help="Model repository that `python -m export` wrote.")
]
RepositoryOut = Annotated[
    Path, typer.Option("--repository", help="Model repository to write the models into.")
]
Model = Annotated[
    _T, typer.Option("--model", help="Model name, as the server serves it (its folder in the repository).")
]
TableSize = Annotated[_T, typer.Option("--table-size", help="Rows of every one of the 26 tables.")]
UserFeatures = Annotated[
    _T,
    typer.Option(
        "--user-features",
        help="The user's features in a ranking request (one user and its candidates), by the data "
        "contract's column names, ranges within one kind: e.g. I1,I2,C1,C3-C9.",
    ),
]
SyntheticRows = Annotated[int, typer.Option("--rows", help="Rows of synthetic Criteo data to write.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed: the same seed, the same values.")]

# ------------------------------------------------------------------ serving
MaxBatchSize = Annotated[
    int,
    typer.Option(
        "--max-batch-size", help="max_batch_size of the model: the largest batch Triton forms or accepts."
    ),
]
MaxQueueDelay = Annotated[
    _T, typer.Option("--max-queue-delay-us", help="Dynamic batcher max queue delay (us).")
]
OrtThreads = Annotated[
    int,
    typer.Option("--threads", help="ONNX Runtime intra-op threads of each model instance (0: its default)."),
]
HttpPort = Annotated[int, typer.Option("--http-port", help="HTTP/REST port.")]
GrpcPort = Annotated[int, typer.Option("--grpc-port", help="gRPC port.")]
MetricsPort = Annotated[int, typer.Option("--metrics-port", help="Prometheus metrics port.")]
TritonLog = Annotated[Path, typer.Option("--log-file", help="tritonserver's log (truncated at start).")]
AdminKey = Annotated[
    str | None,
    typer.Option(
        "--admin-key",
        envvar=ADMIN_KEY_ENV,
        show_envvar=True,
        show_default=False,
        help="The server's admin key, for the APIs a server restricts (model control, shared-memory "
        "registration; docker compose restricts them).",
    ),
]

# ------------------------------------------------------------------ requests
RowsPerRequest = Annotated[_T, typer.Option("--batch-size", "-b", help="Rows per request.")]
SharedMemory = Annotated[
    _T,
    typer.Option(
        "--shared-memory",
        help="Where request tensors travel: none (in the message), system (POSIX shared memory; client "
        "and server on one host) or, where offered, cuda (CUDA IPC memory; the gpu profile).",
    ),
]
RawRequests = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="Send each row's text as it is (a labeled file's label cut off) to a raw-row model "
        "(<model>_raw), which parses it in the server.",
    ),
]

# ------------------------------------------------------------------ where results go
ReportOut = Annotated[
    _T,
    typer.Option("--out", help="Folder for the report: its Markdown, JSON and figures.", file_okay=False),
]

# ------------------------------------------------------------------ tools fetched during set-up
OptionalInstall = Annotated[
    bool,
    typer.Option(
        "--optional",
        help="Where it cannot be had (no network, a hash that does not match, another platform), say why "
        "in one line and exit 0.",
    ),
]
