"""``python -m models train dlrm|wide-deep``: train a reference architecture on Criteo TSV;
``python -m models random-dlrm``: an untrained DLRM checkpoint of any size."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from bundle.cli import new_app, run
from bundle.errors import ConfigError
from criteo.multihot import parse_hotness
from criteo.tables import TABLE_SIZE_PRESETS, parse_table_sizes
from models.config import DCN_PRESETS, PRESETS, DLRMConfig, TrainConfig, WideDeepConfig

app = new_app("Train DLRM (PyTorch) or Wide & Deep (Keras) on Criteo-format data.")


Preset = Annotated[
    str,
    typer.Option(
        help=f"Architecture preset: {', '.join(PRESETS)}; DLRM-DCNv2 (dlrm only): {', '.join(DCN_PRESETS)}."
    ),
]
TableSize = Annotated[int | None, typer.Option(help="Rows of every one of the 26 tables.")]
TableSizes = Annotated[
    str | None,
    typer.Option(
        help=f"Rows per table: {' or '.join(TABLE_SIZE_PRESETS)}, or 26 comma-separated sizes (C1..C26)."
    ),
]


class Architecture(StrEnum):
    dlrm = "dlrm"
    wide_deep = "wide-deep"


@app.command()
def train(
    architecture: Annotated[Architecture, typer.Argument(help="dlrm or wide-deep.")],
    data: Annotated[Path, typer.Option(help="Labeled Criteo TSV file.")],
    out: Annotated[Path, typer.Option(help="Output directory (checkpoint or SavedModel + config.json).")],
    preset: Preset = "small",
    table_size: TableSize = None,
    table_sizes: TableSizes = None,
    epochs: Annotated[int, typer.Option(help="Passes over the training rows.")] = 1,
    batch_size: Annotated[int, typer.Option(help="Rows per step.")] = 1024,
    learning_rate: Annotated[float, typer.Option(help="Learning rate.")] = 1e-3,
    valid: Annotated[
        Path | None, typer.Option(help="Validation file (default: hold out the last rows).")
    ] = None,
    valid_fraction: Annotated[float, typer.Option(help="Share of rows held out when no --valid.")] = 0.1,
    max_rows: Annotated[int | None, typer.Option(help="Read at most this many rows.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of initialisation and shuffling.")] = 0,
    hotness: Annotated[
        str,
        typer.Option(
            help="dlrm: ids per table of a multi-hot model, each table summing its bag: mlperf (MLPerf "
            "dlrm-v2's 214 per row), one count for all 26, or 26 comma-separated counts; the data is "
            "then in the multi-hot text format (python -m criteo synth --hotness)."
        ),
    ] = "1",
) -> None:
    """Train a model; print its validation AUC and logloss."""
    options = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        valid_fraction=valid_fraction,
        seed=seed,
        max_rows=max_rows,
    )
    sizes = None if table_sizes is None else parse_table_sizes(table_sizes)
    if architecture is Architecture.dlrm:
        from models.train_dlrm import train_dlrm

        dlrm = replace(DLRMConfig.preset(preset, table_size, sizes), hotness=parse_hotness(hotness))
        metrics = train_dlrm(data, out, dlrm, options, valid)
    else:
        if hotness != "1":
            raise ConfigError("--hotness is for dlrm (Wide & Deep takes one id per table)")
        from models.train_wide_deep import train_wide_deep

        wide_deep = WideDeepConfig.preset(preset, table_size, sizes)
        metrics = train_wide_deep(data, out, wide_deep, options, valid)
    print(
        f"{architecture.value}: validation AUC {metrics['auc']:.4f}, "
        f"logloss {metrics['logloss']:.4f} on {metrics['rows']} rows; saved to {out}"
    )


@app.command("random-dlrm")
def random_dlrm(
    out: Annotated[Path, typer.Option(help="Output directory (config.json + model.pt).")],
    preset: Preset = "small",
    table_size: TableSize = None,
    table_sizes: TableSizes = None,
    seed: Annotated[int, typer.Option(help="Seed of the tables and the layers.")] = 0,
) -> None:
    """An untrained DLRM checkpoint of the preset's size, as `train dlrm` writes one, written without
    holding its tables in memory (for trying tables larger than memory; twice their bytes of disk)."""
    from rich.progress import Progress

    from models.random_checkpoint import write_random_dlrm

    sizes = None if table_sizes is None else parse_table_sizes(table_sizes)
    config = DLRMConfig.preset(preset, table_size, sizes)
    with Progress() as progress:
        task = progress.add_task("tables", total=config.embedding_rows)
        path = write_random_dlrm(config, out, seed, on_rows=lambda n: progress.advance(task, n))
    rows, size = config.embedding_rows, path.stat().st_size / 1e9
    print(f"dlrm: untrained, {rows:,} table rows x D {config.embedding_dim}; {path} ({size:.2f} GB)")


@app.command("torchrec-dcn")
def torchrec_dcn(
    out: Annotated[Path, typer.Option(help="The state dict file to write.")],
    max_rows: Annotated[
        int, typer.Option(help="Rows of each table at most (MLPerf's sizes capped).")
    ] = 200_000,
    seed: Annotated[int, typer.Option(help="Seed of TorchRec's initialisation.")] = 0,
) -> None:
    """MLPerf's DLRM-DCNv2 built with TorchRec (DLRMTrain(DLRM_DCN)), untrained, as a TorchRec user's
    state dict: MLPerf's layers, its table sizes capped at --max-rows (needs torchrec)."""
    from models.torchrec_dcn import write_mlperf_dcn

    sizes = write_mlperf_dcn(out, max_rows, seed)
    print(f"{out}: DLRM_DCN, tables {','.join(map(str, sizes))} ({sum(sizes):,} rows)")


if __name__ == "__main__":
    run(app)
