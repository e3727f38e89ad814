"""``python -m clients``: health, metadata, statistics, inference and evaluation through tritonserver.

Thin: each command builds a :class:`~clients.options.ClientOptions` (and the
command's own options) and calls the library. Every failure is one
``error: ...`` line and exit code 1; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import enum
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from bundle.cli import new_app, run
from bundle.errors import ClientError
from bundle.options import AdminKey, RawRequests, RowsPerRequest, SharedMemory
from clients.options import ClientOptions, default_url
from clients.retry import RetryPolicy
from criteo.options import MaxRows

if TYPE_CHECKING:
    from clients.predict import PredictOptions

logger = logging.getLogger(__name__)

app = new_app(
    "Clients of the served CTR models over HTTP or gRPC: health, metadata, statistics, "
    "inference of a Criteo TSV file, and AUC/logloss evaluation."
)


class ProtocolName(enum.StrEnum):
    HTTP = "http"
    GRPC = "grpc"


class SharedMemoryName(enum.StrEnum):
    NONE = "none"
    SYSTEM = "system"
    CUDA = "cuda"


class ModeName(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


_T = TypeVar("_T")

ProtocolOption = Annotated[ProtocolName, typer.Option("--protocol", "-p", help="Wire protocol.")]
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        "-u",
        help="host:port of the endpoint (default 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc).",
    ),
]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds per call.")]
TriesOption = Annotated[
    int, typer.Option("--tries", help="Attempts per call when the server is UNAVAILABLE (1 = no retry).")
]
ModelOption = Annotated[_T, typer.Option("--model", "-m", help="Model name in the repository.")]
InputOption = Annotated[
    Path,
    typer.Option(
        "--input",
        "-i",
        help="Criteo TSV file (labeled or not; .gz too); for a DLRMv3 model, a users file (JSON Lines).",
        dir_okay=False,
    ),
]
ModeOption = Annotated[ModeName, typer.Option("--mode", help="sync: one request in flight; async: asyncio.")]
InFlightOption = Annotated[int, typer.Option("--max-in-flight", help="Requests pending at once (async).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# A flag that lab soak takes with another meaning (MODEL=PATH pairs).
ReferenceOnnx = Annotated[
    Path | None,
    typer.Option(
        "--reference", help="ONNX file to run in-process (ONNX Runtime) on the same rows.", dir_okay=False
    ),
]


def _options(
    protocol: ProtocolName,
    url: str | None,
    timeout: float,
    tries: int,
    shared_memory: SharedMemoryName = SharedMemoryName.NONE,
    admin_key: str | None = None,
) -> ClientOptions:
    return ClientOptions(
        url=url or default_url(protocol.value),
        protocol=protocol.value,
        timeout_s=timeout,
        shared_memory=shared_memory.value,
        retry=RetryPolicy(max_tries=tries),
        admin_key=admin_key or None,
    )


def _predict_options(
    batch_size: int, mode: ModeName, max_in_flight: int, max_rows: int | None, raw: bool = False
) -> PredictOptions:
    from clients.predict import PredictOptions

    return PredictOptions(batch_size, mode.value, max_in_flight, max_rows, raw)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


#: The suffixes of a DLRMv3 users file (JSON Lines); any other input is Criteo rows.
USERS_SUFFIXES = (".jsonl", ".json")


def _dlrmv3(options: ClientOptions, model: str, input_file: Path) -> bool:
    """Whether ``input_file`` is a users file for DLRMv3 ``model``.

    Raises:
        ClientError: a users file for a model that takes rows, or rows for a DLRMv3 model.
    """
    if input_file.suffix.lower() not in USERS_SUFFIXES:
        return False
    from clients.dlrmv3 import is_dlrmv3
    from clients.triton import TritonClient

    with TritonClient.from_options(options) as probe:
        if not is_dlrmv3(probe.model_spec(model)):
            raise ClientError(
                f"{input_file} is a users file (JSON Lines) for a DLRMv3 model; {model!r} is not one"
            )
    return True


@app.command()
def health(
    protocol: ProtocolOption = ProtocolName.GRPC,
    url: UrlOption = None,
    model: ModelOption[list[str] | None] = None,
    timeout: TimeoutOption = 10.0,
    tries: TriesOption = 4,
) -> None:
    """Is the server live and ready, and which models are ready? Exit 1 when not, or when a model
    that --model names is not ready."""
    from clients.triton import TritonClient

    options = _options(protocol, url, timeout, tries)
    with TritonClient.from_options(options) as client:
        live = client.server_live()
        ready = client.server_ready()
        index = client.repository_index()
    print(
        f"tritonserver at {options.endpoint}: {'live' if live else 'not live'}, "
        f"{'ready' if ready else 'not ready'}"
    )
    rows = [[m.name, m.version or "-", m.state or "not loaded", m.reason] for m in index]
    if rows:
        print(_table(["model", "version", "state", "reason"], rows))
    states = {m.name: m for m in index}
    for name in model or []:
        entry = states.get(name)
        if entry is None:
            raise ClientError(f"unknown model {name!r} at {options.endpoint}")
        if not entry.ready:
            raise ClientError(
                f"model {name!r} at {options.endpoint} is not ready ({entry.state or 'not loaded'})"
            )
    if not (live and ready):
        not_ready = [m.name for m in index if not m.ready]
        raise ClientError(f"tritonserver at {options.endpoint} is not ready; models not ready: {not_ready}")


@app.command()
def metadata(
    protocol: ProtocolOption = ProtocolName.GRPC,
    url: UrlOption = None,
    model: ModelOption[str | None] = None,
    timeout: TimeoutOption = 10.0,
    tries: TriesOption = 4,
) -> None:
    """The server's name, version and extensions, or (with --model) a model's tensors and max batch
    size (JSON)."""
    from clients.triton import TritonClient

    with TritonClient.from_options(_options(protocol, url, timeout, tries)) as client:
        document = client.model_spec(model).summary() if model else client.server_metadata()
    print(json.dumps(document, indent=2))


@app.command()
def stats(
    protocol: ProtocolOption = ProtocolName.GRPC,
    url: UrlOption = None,
    model: ModelOption[str | None] = None,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 10.0,
    tries: TriesOption = 4,
) -> None:
    """Inference statistics per model (or only --model's): requests, rows, executions and mean times
    inside the server."""
    from clients.triton import TritonClient

    with TritonClient.from_options(_options(protocol, url, timeout, tries)) as client:
        entries = client.statistics(model or "")
    if as_json:
        print(json.dumps([entry.as_dict() for entry in entries], indent=2))
        return
    header = [
        "model",
        "version",
        "requests",
        "failed",
        "rows",
        "executions",
        "request ms",
        "queue ms",
        "infer ms",
    ]
    rows = [
        [
            e.name,
            e.version,
            str(e.success_count),
            str(e.fail_count),
            str(e.inference_count),
            str(e.execution_count),
            f"{e.mean_ms():.3f}",
            f"{e.mean_ms('queue'):.3f}",
            f"{e.mean_ms('compute_infer'):.3f}",
        ]
        for e in entries
    ]
    print(_table(header, rows))


@app.command()
def infer(
    model: ModelOption[str],
    input_file: InputOption,
    protocol: ProtocolOption = ProtocolName.GRPC,
    url: UrlOption = None,
    batch_size: RowsPerRequest[int] = 1024,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="CSV file (default: standard output).", dir_okay=False),
    ] = None,
    mode: ModeOption = ModeName.SYNC,
    max_in_flight: InFlightOption = 4,
    shared_memory: SharedMemory[SharedMemoryName] = SharedMemoryName.NONE,
    admin_key: AdminKey = None,
    max_rows: MaxRows = None,
    raw: RawRequests = False,
    timeout: TimeoutOption = 30.0,
    tries: TriesOption = 4,
) -> None:
    """Probability of a click for every row of a Criteo TSV file, one per line, in input order; for a
    DLRMv3 model, every user of a users file (JSON Lines), one request a user, a line of its scores
    per task out."""
    from clients.predict import predict_file

    options = _predict_options(batch_size, mode, max_in_flight, max_rows, raw)
    client = _options(protocol, url, timeout, tries, shared_memory, admin_key)
    if _dlrmv3(client, model, input_file):
        from clients.dlrmv3 import infer_file

        done = infer_file(client, model, input_file, output, max_rows, mode.value, max_in_flight)
        if output is not None:
            rate = done.users / max(done.seconds, 1e-9)
            print(
                f"wrote the scores of {done.users} users ({done.candidates} candidates) to {output} "
                f"({model} over {client.endpoint}, {done.seconds:.2f} s, {rate:,.0f} users/s)"
            )
        return
    summary = predict_file(client, model, input_file, options, output)
    if output is not None:
        print(
            f"wrote {summary.rows} probabilities to {output} ({model} over {client.endpoint}, "
            f"{summary.batches} requests, {summary.seconds:.2f} s, {summary.rows_per_s:,.0f} rows/s)"
        )


@app.command()
def evaluate(
    model: ModelOption[list[str]],
    input_file: InputOption,
    protocol: ProtocolOption = ProtocolName.GRPC,
    url: UrlOption = None,
    reference: ReferenceOnnx = None,
    batch_size: RowsPerRequest[int] = 1024,
    mode: ModeOption = ModeName.SYNC,
    max_in_flight: InFlightOption = 4,
    shared_memory: SharedMemory[SharedMemoryName] = SharedMemoryName.NONE,
    admin_key: AdminKey = None,
    max_rows: MaxRows = None,
    raw: RawRequests = False,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 30.0,
    tries: TriesOption = 4,
) -> None:
    """AUC and logloss of served predictions on a labeled file, side by side per model (and reference);
    for DLRMv3 models, AUC and normalized entropy per task over a users file's labeled candidates."""
    from clients.evaluate import evaluate as run_evaluation

    options = _predict_options(batch_size, mode, max_in_flight, max_rows, raw)
    client = _options(protocol, url, timeout, tries, shared_memory, admin_key)
    if model and _dlrmv3(client, model[0], input_file):
        from clients.dlrmv3 import evaluate_file
        from clients.triton import TritonClient

        with TritonClient.from_options(client) as connection:
            results = evaluate_file(connection, model, input_file, max_rows)
        if as_json:
            print(
                json.dumps(
                    {"input": str(input_file), "endpoint": client.endpoint, "scores": results}, indent=2
                )
            )
            return
        header = [
            "model",
            "task",
            "users",
            "candidates",
            "positive rate",
            "AUC",
            "normalized entropy",
            "seconds",
        ]
        rows = [
            [r["model"], r["task"], str(r["users"]), str(r["candidates"]), f"{r['positive_rate']:.4f}",
             f"{r['auc']:.6f}", f"{r['normalized_entropy']:.6f}", f"{r['seconds']:.2f}"]
            for r in results
        ]  # fmt: skip
        print(_table(header, rows))
        return
    result = run_evaluation(client, model, input_file, options, reference)
    if as_json:
        print(json.dumps(result.as_dict(), indent=2))
        return
    print(
        f"{result.rows} rows of {result.input} (positive rate {result.positive_rate:.4f}) "
        f"via {result.endpoint}"
    )
    header = ["model", "rows", "AUC", "logloss", "AUC - ref", "max |p - ref|", "seconds"]
    scores = ([result.reference] if result.reference else []) + list(result.scores)
    rows = [
        [
            s.name if s.name != "reference" else f"reference ({result.reference_file}, in-process)",
            str(s.rows),
            f"{s.auc:.6f}",
            f"{s.logloss:.6f}",
            "-" if s.auc_delta is None else f"{s.auc_delta:+.2e}",
            "-" if s.max_abs_diff is None else f"{s.max_abs_diff:.2e}",
            f"{s.seconds:.2f}",
        ]
        for s in scores
    ]
    print(_table(header, rows))


if __name__ == "__main__":
    run(app)
