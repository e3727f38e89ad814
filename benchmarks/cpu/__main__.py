"""``python -m benchmarks.cpu precision|serving``: the CPU serving benchmarks (see ``run.sh``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bundle.cli import new_app, run
from loadtest.sweep import parse_ints

app = new_app("CPU serving benchmarks: precision variants vs the FP32 ceiling, and serving defaults.")

Repository = Annotated[Path, typer.Option(help="Exported cpu-profile model repository.")]
Out = Annotated[Path, typer.Option(help="Folder for the result files.")]
Data = Annotated[Path | None, typer.Option(help="Criteo TSV for the request rows (default: synthetic).")]
Rounds = Annotated[int, typer.Option(help="Turns over the variants or candidates (medians reported).")]
Seconds = Annotated[float, typer.Option(help="Seconds per measured window.")]


@app.command()
def precision(
    repository: Repository,
    dynamic_repository: Annotated[
        Path | None,
        typer.Option(
            help="Repository exported with --int8-method dynamic (served as <family>_onnx_int8_dynamic)."
        ),
    ] = None,
    out: Out = Path("benchmarks/cpu"),
    data: Data = None,
    batch_size: Annotated[int, typer.Option(help="Rows per request.")] = 1024,
    concurrency: Annotated[str, typer.Option(help="Requests in flight, comma-separated.")] = "1,2,4",
    rounds: Rounds = 5,
    seconds: Seconds = 2.0,
) -> None:
    """Served and in-process samples/s of FP32, FP16 and INT8 as fractions of the sgemm ceiling."""
    from benchmarks.cpu.common import run_record
    from benchmarks.cpu.precision import PrecisionOptions, run_precision, write_precision

    options = PrecisionOptions(
        repository=repository,
        out=out,
        dynamic_repository=dynamic_repository,
        data=data,
        batch_size=batch_size,
        concurrency=parse_ints(concurrency, "--concurrency"),
        rounds=rounds,
        seconds=seconds,
    )
    paths = write_precision(run_precision(options, run_record()), out)
    print(f"report: {paths['markdown']}")


@app.command()
def serving(
    repository: Repository,
    model: Annotated[list[str], typer.Option(help="Model whose settings are tried (repeatable).")],
    out: Out = Path("benchmarks/cpu"),
    data: Data = None,
    candidate: Annotated[
        list[str] | None, typer.Option(help="Candidate settings by name (repeatable; default: all).")
    ] = None,
    step: Annotated[
        list[str] | None,
        typer.Option(
            help="A measured step BATCHxCONCURRENCY, e.g. 1024x4 (repeatable; default: "
            "1024x1, 1024x4, 1x1, 1x16)."
        ),
    ] = None,
    rounds: Rounds = 2,
    seconds: Seconds = 3.0,
    name: Annotated[str, typer.Option(help="File stem of the results in --out.")] = "serving_defaults",
) -> None:
    """Throughput and latency of candidate serving settings (threads, instances, batcher)."""
    from benchmarks.cpu.common import run_record
    from benchmarks.cpu.serving import STEPS, ServingOptions, parse_step, run_serving, write_serving

    options = ServingOptions(
        repository=repository,
        models=tuple(model),
        out=out,
        data=data,
        candidates=tuple(candidate or ()),
        steps=tuple(parse_step(text) for text in step) if step else STEPS,
        rounds=rounds,
        seconds=seconds,
    )
    paths = write_serving(run_serving(options, run_record()), out, name)
    print(f"report: {paths['markdown']}")


if __name__ == "__main__":
    run(app)
