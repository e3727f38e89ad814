"""``python -m export``: trained models -> ONNX (FP32, FP16) -> Triton model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bundle.cli import new_app, run
from export.pipeline import ExportedModel, ExportOptions, export_family
from export.repository import ServingConfig

app = new_app("Export trained DLRM and Wide & Deep models into a Triton model repository.")

Repository = Annotated[Path, typer.Option(help="Triton model repository to write into.")]
ProfileOpt = Annotated[str, typer.Option(help="Serving profile: cpu.")]
Opset = Annotated[int, typer.Option(help="ONNX opset.")]
Fp16 = Annotated[bool, typer.Option("--fp16/--no-fp16", help="Also write the FP16 variant.")]
CheckData = Annotated[
    Path | None, typer.Option(help="Labeled Criteo TSV for the checks (default: synthetic rows).")
]
CheckRows = Annotated[int, typer.Option(help="Rows compared against the framework (>= 1024).")]
AucTolerance = Annotated[float, typer.Option(help="Max |AUC(FP16) - AUC(FP32)|.")]
MaxBatch = Annotated[int, typer.Option(help="max_batch_size in config.pbtxt.")]
Instances = Annotated[int, typer.Option(help="Model instances per model.")]
QueueDelay = Annotated[int, typer.Option(help="Dynamic batcher max queue delay (us).")]
Threads = Annotated[int, typer.Option(help="ONNX Runtime intra-op threads per instance (0: default).")]


def _options(
    repository: Path,
    profile: str,
    opset: int,
    fp16: bool,
    check_data: Path | None,
    check_rows: int,
    fp16_auc_tolerance: float,
    max_batch_size: int,
    instances: int,
    max_queue_delay_us: int,
    threads: int,
) -> ExportOptions:
    serving = ServingConfig(
        profile=profile,  # type: ignore[arg-type]  # validated by ServingConfig
        max_batch_size=max_batch_size,
        instances=instances,
        max_queue_delay_us=max_queue_delay_us,
        intra_op_threads=threads,
    )
    return ExportOptions(
        repository=repository,
        serving=serving,
        opset=opset,
        fp16=fp16,
        check_data=check_data,
        check_rows=check_rows,
        fp16_auc_tolerance=fp16_auc_tolerance,
    )


def _print(results: list[ExportedModel]) -> None:
    table = Table(title="exported models")
    for column in ("model", "checked against", "rows", "max abs diff", "AUC", "AUC delta", "seconds"):
        table.add_column(column)
    for r in results:
        p = r.parity
        table.add_row(
            r.name,
            r.reference,
            str(p.rows),
            f"{p.max_abs_diff:.2e}",
            "-" if p.auc is None else f"{p.auc:.4f}",
            "-" if p.auc_delta is None else f"{p.auc_delta:+.1e}",
            f"{r.seconds:.1f}",
        )
    Console(width=max(Console().width, 120)).print(table)


@app.command()
def dlrm(
    checkpoint: Annotated[Path, typer.Option(help="Directory written by `models train dlrm`.")],
    repository: Repository = Path("model_repository"),
    profile: ProfileOpt = "cpu",
    opset: Opset = 17,
    fp16: Fp16 = True,
    check_data: CheckData = None,
    check_rows: CheckRows = 4096,
    fp16_auc_tolerance: AucTolerance = 1e-3,
    max_batch_size: MaxBatch = 4096,
    instances: Instances = 1,
    max_queue_delay_us: QueueDelay = 100,
    threads: Threads = 0,
) -> None:
    """Export a PyTorch DLRM checkpoint (torch.onnx) as dlrm_onnx and dlrm_onnx_fp16."""
    options = _options(
        repository, profile, opset, fp16, check_data, check_rows,
        fp16_auc_tolerance, max_batch_size, instances, max_queue_delay_us, threads,
    )  # fmt: skip
    from export.onnx_dlrm import DLRMExporter

    _print(export_family(DLRMExporter(checkpoint), options))


@app.command("wide-deep")
def wide_deep(
    saved_model: Annotated[Path, typer.Option(help="Directory written by `models train wide-deep`.")],
    repository: Repository = Path("model_repository"),
    profile: ProfileOpt = "cpu",
    opset: Opset = 17,
    fp16: Fp16 = True,
    check_data: CheckData = None,
    check_rows: CheckRows = 4096,
    fp16_auc_tolerance: AucTolerance = 1e-3,
    max_batch_size: MaxBatch = 4096,
    instances: Instances = 1,
    max_queue_delay_us: QueueDelay = 100,
    threads: Threads = 0,
) -> None:
    """Export a Keras Wide & Deep SavedModel (tf2onnx) as wide_deep_onnx and wide_deep_onnx_fp16."""
    options = _options(
        repository, profile, opset, fp16, check_data, check_rows,
        fp16_auc_tolerance, max_batch_size, instances, max_queue_delay_us, threads,
    )  # fmt: skip
    from export.onnx_wide_deep import WideDeepExporter

    _print(export_family(WideDeepExporter(saved_model), options))


if __name__ == "__main__":
    run(app)
