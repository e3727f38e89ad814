"""The command-line options that several ``python -m export`` commands share, each declared once
(as :mod:`bundle.options` declares the cross-stage ones): the dlrm and wide-deep exports,
``synthetic-hot-cold`` and ``rollout-hot-set`` take them. Each command gives its own default.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

import typer

from export.stage.hot_cold_lookup import STORE_DTYPES

_T = TypeVar("_T")

Opset = Annotated[int, typer.Option("--opset", help="ONNX opset.")]
# ------------------------------------------------------------------ what to export
DlrmCheckpoint = Annotated[
    _T,
    typer.Option(
        "--checkpoint",
        help="What to export: a directory written by `models train dlrm`, a facebookresearch/dlrm "
        "checkpoint (--save-model) or its state dict, a TorchRec DLRM or DLRM_DCN state dict or "
        "torch.distributed.checkpoint folder, a TorchScript file, or a torch.export program (.pt2); "
        "the format is detected from the file.",
    ),
]
Instances = Annotated[
    int,
    typer.Option(
        "--instances",
        help="Model instances per model (per GPU in the gpu profile); 0: 1 on CPU, 4 per GPU.",
    ),
]

# ------------------------------------------------------------------ hot/cold models
HotBudget = Annotated[
    _T,
    typer.Option(
        "--hot-budget",
        help="Bytes of hot embedding rows the dense model keeps (512M, 2G; binary units). An export "
        "with it splits tables larger than that hot/cold; a rollout without it keeps the serving "
        "version's budget.",
    ),
]
ProfileData = Annotated[
    _T,
    typer.Option(
        "--profile-data",
        help="Lookups that choose the hot rows: a Criteo TSV (profiled here), or a folder `python -m "
        "criteo profile` wrote. An export without it profiles --calibration-data, else --check-data.",
    ),
]
StoreDtype = Annotated[
    str, typer.Option("--store-dtype", help=f"Values of the hot/cold row store: {' or '.join(STORE_DTYPES)}.")
]
StageInstances = Annotated[
    int,
    typer.Option(
        "--stage-instances",
        help="Instances of the hot/cold embedding stage (each a stub mapping the same store).",
    ),
]
