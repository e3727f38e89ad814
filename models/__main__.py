"""``python -m models train dlrm|wide-deep``: train a reference architecture on Criteo TSV;
``python -m models random-dlrm``: an untrained DLRM checkpoint of any size;
``python -m models random-dlrmv3``: a DLRMv3 (HSTU) of any config with seeded random weights."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from bundle.cli import new_app, run
from bundle.errors import ConfigError
from bundle.options import Seed, TableSize
from criteo.multihot import parse_hotness
from criteo.options import CriteoFile, Hotness, MaxRows, TableSizes
from criteo.tables import parse_table_sizes
from models.config import DLRMConfig, TrainConfig, WideDeepConfig
from models.options import Dlrmv3ConfigFile, Preset

app = new_app("Train DLRM (PyTorch) or Wide & Deep (Keras) on Criteo-format data.")

# ``--out``, ``--batch-size`` and ``--max-rows`` mean other things in other commands.
ModelOut = Annotated[
    Path,
    typer.Option(
        "--out", help="Output directory: the model (a PyTorch checkpoint or a SavedModel), its config.json."
    ),
]
StateDictOut = Annotated[Path, typer.Option("--out", help="The state dict file to write.")]
StepRows = Annotated[int, typer.Option("--batch-size", help="Rows per training step.")]
MaxTableRows = Annotated[
    int, typer.Option("--max-rows", help="Rows of each table at most (MLPerf's sizes capped).")
]


class Architecture(StrEnum):
    dlrm = "dlrm"
    wide_deep = "wide-deep"


@app.command()
def train(
    architecture: Annotated[Architecture, typer.Argument(help="dlrm or wide-deep.")],
    data: CriteoFile,
    out: ModelOut,
    preset: Preset = "small",
    table_size: TableSize[int | None] = None,
    table_sizes: TableSizes[str | None] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the training rows.")] = 1,
    batch_size: StepRows = 1024,
    learning_rate: Annotated[float, typer.Option(help="Learning rate.")] = 1e-3,
    valid: Annotated[
        Path | None, typer.Option(help="Validation file (default: hold out the last rows).")
    ] = None,
    valid_fraction: Annotated[float, typer.Option(help="Share of rows held out when no --valid.")] = 0.1,
    max_rows: MaxRows = None,
    seed: Seed = 0,
    hotness: Hotness = "1",
) -> None:
    """Train a model on a labeled Criteo TSV (--data); print its validation AUC and logloss. --seed
    draws the initial weights and the shuffling; --hotness is for dlrm (a multi-hot model)."""
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
    out: ModelOut,
    preset: Preset = "small",
    table_size: TableSize[int | None] = None,
    table_sizes: TableSizes[str | None] = None,
    seed: Seed = 0,
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


@app.command("random-dlrmv3")
def random_dlrmv3(
    config: Dlrmv3ConfigFile,
    out: ModelOut,
    seed: Seed = 0,
    scale: Annotated[float, typer.Option(help="Weights uniform in +-scale.")] = 0.1,
) -> None:
    """A DLRMv3 (HSTU) of any config with seeded random weights: config.json and model.pt, the
    reference's state_dict key names, as a user's checkpoint of that config holds them."""
    from models.dlrmv3 import Dlrmv3, Dlrmv3Config, parameter_count, write_random_dlrmv3

    path = write_random_dlrmv3(config, out, seed, scale)
    count = parameter_count(Dlrmv3(Dlrmv3Config.load(config)))
    print(
        f"dlrmv3: random weights (seed {seed}), {count:,} parameters; "
        f"{path} ({path.stat().st_size / 1e6:.1f} MB)"
    )


UsersOut = Annotated[
    Path, typer.Option("--out", help="The users file to write (JSON Lines).", dir_okay=False)
]
#: ``--users`` here: the count of users to write (``criteo synth`` takes it as its distinct users).
UsersToWrite = Annotated[int, typer.Option("--users", help="Users to write.")]


@app.command("dlrmv3-users")
def dlrmv3_users(
    config: Dlrmv3ConfigFile,
    out: UsersOut,
    users: UsersToWrite = 1000,
    seed: Seed = 0,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--labels-from",
            help="A DLRMv3 checkpoint of the config whose own probabilities draw the labels "
            "(default: a fixed rate).",
        ),
    ] = None,
) -> None:
    """Synthetic users for a DLRMv3 config, one a line (JSON Lines): a Zipf-like item popularity,
    categories, increasing timestamps, action bitmasks, histories of 0 to the model's limit and
    1 to its most candidates, each candidate's label per task; what `clients infer` and
    `clients evaluate` send a DLRMv3 model."""
    from models.dlrmv3 import Dlrmv3, Dlrmv3Config, load_state, write_users

    loaded = Dlrmv3Config.load(config)
    model = None
    if checkpoint is not None:
        model = Dlrmv3(loaded)
        load_state(model, checkpoint)
    rates = write_users(loaded, out, users, seed, model)
    shown = ", ".join(f"{task} {rate:.3f}" for task, rate in rates.items())
    print(f"{out}: {users} users; positive rate per task: {shown}")


@app.command("torchrec-dcn")
def torchrec_dcn(
    out: StateDictOut,
    max_rows: MaxTableRows = 200_000,
    seed: Seed = 0,
) -> None:
    """MLPerf's DLRM-DCNv2 built with TorchRec (DLRMTrain(DLRM_DCN)), untrained, as a TorchRec user's
    state dict: MLPerf's layers, its table sizes capped at --max-rows (needs torchrec)."""
    from models.torchrec_dcn import write_mlperf_dcn

    sizes = write_mlperf_dcn(out, max_rows, seed)
    print(f"{out}: DLRM_DCN, tables {','.join(map(str, sizes))} ({sum(sizes):,} rows)")


if __name__ == "__main__":
    run(app)
