"""The command-line option of a model's preset, which ``python -m models`` and ``python -m export
synthetic-hot-cold`` share, declared once (as :mod:`bundle.options` declares the others): here
because its help names the presets of :mod:`models.config`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from models.config import DCN_PRESETS, PRESETS

Preset = Annotated[
    str,
    typer.Option(
        "--preset",
        help=f"Architecture preset (layers and table sizes): {', '.join(PRESETS)}; DLRM-DCNv2 (dlrm "
        f"only): {', '.join(DCN_PRESETS)}.",
    ),
]

#: A DLRMv3 model's config file (``python -m models random-dlrmv3``, ``python -m export dlrmv3``).
Dlrmv3ConfigFile = Annotated[
    Path,
    typer.Option(
        "--config",
        help="The DLRMv3 model's config: JSON of hstu_config, tables and multitask_configs, the "
        "reference's field names.",
    ),
]
Dlrmv3Checkpoint = Annotated[
    Path,
    typer.Option(
        "--checkpoint",
        help="A DLRMv3 checkpoint: a torch.save of the model's state_dict, the reference's key names "
        "(`models random-dlrmv3` writes one).",
    ),
]
