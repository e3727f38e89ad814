"""``python -m benchmarks.soak run``: the local tritonserver under steady load; writes the result files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from benchmarks.soak.soak import MAX_RSS_GROWTH, SoakConfig, run_soak, write_result
from bundle.cli import new_app, run
from bundle.errors import BundleError

app = new_app("Soak: the local tritonserver under steady load; requests, errors and RSS growth.")


class SoakFailed(BundleError):
    """The soak missed a target (errors, wrong answers or RSS growth)."""


@app.command("run")
def run_command(
    repository: Annotated[Path, typer.Option("--repository", "-r", help="Model repository to serve.")] = Path(
        "model_repository"
    ),
    model: Annotated[
        list[str] | None, typer.Option(help="Model to load and load-test (repeatable); default: all.")
    ] = None,
    duration: Annotated[float, typer.Option(help="Seconds of load, warm-up included.")] = 600.0,
    warmup: Annotated[float, typer.Option(help="Seconds before the RSS baseline is taken.")] = 60.0,
    rate: Annotated[float, typer.Option(help="Requests per second over all client threads.")] = 100.0,
    threads: Annotated[int, typer.Option(help="Client threads (alternating gRPC and HTTP).")] = 2,
    batch_size: Annotated[
        list[int] | None, typer.Option(help="Request batch size (repeatable); default 1, 8, 64, 256.")
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="Criteo TSV to take rows from; default synthetic.")
    ] = None,
    sample_interval: Annotated[float, typer.Option(help="Seconds between RSS samples.")] = 5.0,
    log_file: Annotated[Path, typer.Option(help="tritonserver's log.")] = Path("logs/soak-tritonserver.log"),
    out: Annotated[Path, typer.Option(help="Folder for result.json and result.md.")] = Path(
        "benchmarks/soak"
    ),
) -> None:
    """Serve the repository, keep it under load, print the summary, write the result files."""
    config = SoakConfig(
        repository=repository,
        models=tuple(model or ()),
        duration_s=duration,
        warmup_s=warmup,
        rate=rate,
        threads=threads,
        batch_sizes=tuple(batch_size or (1, 8, 64, 256)),
        sample_interval_s=sample_interval,
        data=data,
        log_file=log_file,
    )
    result = run_soak(config)
    json_path, md_path = write_result(result, out)
    summary = result.as_dict()["summary"]
    print(
        f"{summary['requests']} requests, {summary['errors']} errors, {summary['wrong']} wrong answers, "
        f"RSS growth after warm-up {result.rss_growth:+.2%}; wrote {json_path} and {md_path}"
    )
    if not result.passed:
        raise SoakFailed(
            f"soak missed its targets (0 errors, RSS growth < {MAX_RSS_GROWTH:.0%}, whole run): see {md_path}"
        )


if __name__ == "__main__":
    run(app)
