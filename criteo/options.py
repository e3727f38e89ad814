"""The command-line options about Criteo data that the criteo, models, export and clients commands
share, each declared once (as :mod:`bundle.options` declares the others): here, below every stage
that reads Criteo data, because their help names the data's presets and formats."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

from bundle.schema import VARIABLE_HOTNESS
from criteo.tables import TABLE_SIZE_PRESETS

_T = TypeVar("_T")

CriteoFile = Annotated[Path, typer.Option("--data", help="Criteo TSV file to read (.gz too).")]
MaxRows = Annotated[int | None, typer.Option("--max-rows", help="Read only the first N rows of the file.")]
TableSizes = Annotated[
    _T,
    typer.Option(
        "--table-sizes",
        help=f"Rows of the 26 tables behind C1..C26 (ids are reduced into them, id mod size): "
        f"{' or '.join(TABLE_SIZE_PRESETS)}, one size for all, or 26 comma-separated sizes.",
    ),
]
Hotness = Annotated[
    str,
    typer.Option(
        "--hotness",
        help="Ids per table and row: 1 (Criteo's one-hot format), mlperf (MLPerf dlrm-v2's 214 per row), "
        f"one count for all 26, or 26 comma-separated counts; where offered, {VARIABLE_HOTNESS} (bags of "
        "any size, empty ones included). With bags, each table sums its bag, and the data is of the "
        "multi-hot text format (each field's hex ids comma-separated, as `python -m criteo synth "
        "--hotness` writes it); a model's categorical_ids is then B x (the counts' sum), C1's ids first, "
        f"and {VARIABLE_HOTNESS} bags travel as categorical_values (every id, row after row) and "
        "categorical_lengths (B x 26 bag sizes).",
    ),
]
