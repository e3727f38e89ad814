"""DLRM state dicts of facebookresearch/dlrm and TorchRec: the architecture read from the weights.

Neither checkpoint carries its code: :func:`read_layout` tells the two apart by
their keys and reads tables, widths and interaction from the weight shapes into a
:class:`DLRMLayout`, from which :mod:`export.importers.dlrm_rebuild` builds the module the
export writes and the codebase's own forward for the parity check.

facebookresearch/dlrm (``dlrm_s_pytorch.py``): ``emb_l.<k>.weight`` tables,
``bot_l``/``top_l`` ``nn.Sequential`` with Linear at even indices, ReLU between
and after the bottom MLP, Sigmoid after the last top layer; interaction ``dot``
(``T = [x, e_1..e_26]``, ``Z = T T^T``, pairs ``(i, j)`` for ``i`` in ``0..26``, ``j``
in ``0..i-1``, or ``0..i`` with ``--arch-interaction-itself``; ``R = [x, Z_pairs]``)
or ``cat`` (``R = [x, e_1..e_26]``). TorchRec ``DLRM``: ``dense_arch`` MLP (ReLU
after every layer), ``sparse_arch.embedding_bag_collection`` tables, the upper
triangle ``triu_indices(27, 27, 1)`` of the dot products (row-major) after the
dense vector, ``over_arch`` MLP then a final Linear, logits out. TorchRec
``DLRM_DCN`` (DLRM-DCNv2, MLPerf's ``dlrm-v2``): the same arches, and
``inter_arch.crossnet``, a ``LowRankCrossNet`` over ``x0 = [x, e_1..e_26]``
(``27 D`` wide): each layer ``l`` computes ``x = x0 * (W_l (V_l x) + b_l) + x``
from ``W_kernels.l`` (``27D x r``), ``V_kernels.l`` (``r x 27D``) and ``bias.l``
(``27D``, or ``27D x 1`` in TorchRec before December 2022), and the over arch reads ``x``.

Imports torch at the top: import this module inside the functions that need it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from bundle.errors import ConfigError, ExportError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.schema import CATEGORICAL_COLUMNS

Codebase = Literal["facebookresearch", "torchrec"]

#: Key prefixes that wrappers add: DataParallel (``module.``), TorchRec's DLRMTrain (``model.``).
WRAPPER_PREFIXES = ("module.", "model.")
_FB_PARAM = re.compile(r"^(?P<part>emb_l|bot_l|top_l|v_W_l)\.(?P<index>\d+)\.?(?P<name>.*)$")
TORCHREC_TABLES = "sparse_arch.embedding_bag_collection.embedding_bags."
_TR_DENSE = re.compile(r"^dense_arch\.model\._mlp\.(?P<index>\d+)\._linear\.(?P<name>weight|bias)$")
_TR_OVER = re.compile(r"^over_arch\.model\.0\._mlp\.(?P<index>\d+)\._linear\.(?P<name>weight|bias)$")
_TR_FINAL = re.compile(r"^over_arch\.model\.1\.(?P<name>weight|bias)$")
_TR_CROSS = re.compile(r"^inter_arch\.crossnet\.(?P<name>W_kernels|V_kernels|bias)\.(?P<index>\d+)$")
FACEBOOK_KEYS = "emb_l.<k>.weight, bot_l.<n>.weight/bias, top_l.<n>.weight/bias"
TORCHREC_KEYS = (
    f"{TORCHREC_TABLES}<table>.weight, dense_arch.model._mlp.<i>._linear.*, "
    "over_arch.model.0._mlp.<i>._linear.*, over_arch.model.1.*, "
    "and for DLRM_DCN inter_arch.crossnet.{W_kernels,V_kernels,bias}.<l>"
)
#: The interactions a DLRM layout can have.
Interaction = Literal["dot", "cat", "dcn"]


@dataclass(frozen=True)
class DLRMLayout:
    """The architecture a DLRM state dict holds, read from its weight shapes.

    Args:
        codebase: ``facebookresearch`` or ``torchrec``.
        tables: the tables' keys in interaction order (``emb_l.0`` .., or TorchRec table names).
        rows: rows of each table, in that order.
        dim: ``D``, the embeddings' width.
        bottom: widths of the bottom (dense) MLP's layers.
        top: widths of the top (over) MLP's layers, the last 1.
        interaction: ``dot``, ``cat`` or ``dcn`` (TorchRec ``DLRM_DCN``'s low-rank cross net).
        self_interaction: ``dot`` keeps the diagonal (facebookresearch ``--arch-interaction-itself``).
        columns: for each table, the Criteo column (0 = C1) whose ids it looks up.
        cross_layers: ``dcn``: the cross net's layers (0 otherwise).
        cross_rank: ``dcn``: its low-rank dimension ``r``.
        cross_bias_column: ``dcn``: its biases are ``27D x 1`` (TorchRec before December 2022).
    """

    codebase: Codebase
    tables: tuple[str, ...]
    rows: tuple[int, ...]
    dim: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    interaction: Interaction
    self_interaction: bool
    columns: tuple[int, ...]
    cross_layers: int = 0
    cross_rank: int = 0
    cross_bias_column: bool = False

    def __post_init__(self) -> None:
        if sorted(self.columns) != list(range(NUM_CATEGORICAL)) or len(self.tables) != NUM_CATEGORICAL:
            raise ConfigError(f"a DLRM layout maps {NUM_CATEGORICAL} tables to C1..C26, got {self.columns}")

    @property
    def logits(self) -> bool:
        """The source's forward returns logits (TorchRec), not probabilities."""
        return self.codebase == "torchrec"

    @property
    def source_model(self) -> str:
        """The source's model class, for the report and messages."""
        if self.codebase == "facebookresearch":
            return "DLRM_Net"
        return "DLRM_DCN" if self.interaction == "dcn" else "DLRM"

    @property
    def interaction_width(self) -> int:
        """Features the interaction gives the top MLP."""
        if self.interaction == "dot":
            return self.bottom[-1] + len(self.pairs())
        return self.bottom[-1] + NUM_CATEGORICAL * self.dim

    @property
    def column_rows(self) -> tuple[int, ...]:
        """Rows of the table behind each of C1..C26."""
        rows = [0] * NUM_CATEGORICAL
        for table, column in enumerate(self.columns):
            rows[column] = self.rows[table]
        return tuple(rows)

    @property
    def description(self) -> str:
        """The interaction, for the export report."""
        if self.interaction == "cat":
            return "cat: [x, e_1..e_26]"
        if self.interaction == "dcn":
            return (
                f"dcn: {self.cross_layers} low-rank cross layers (rank {self.cross_rank}), "
                "x = x0 * (W (V x) + b) + x over x0 = [x, e_1..e_26]"
            )
        triangle = "upper triangle, row-major" if self.codebase == "torchrec" else "lower triangle, row-major"
        diagonal = " with the diagonal" if self.self_interaction else ""
        return f"dot: [x, {triangle}{diagonal} of [x, e_1..e_26] [x, e_1..e_26]^T]"

    def pairs(self) -> list[tuple[int, int]]:
        """The ``(i, j)`` entries of ``Z`` the interaction keeps, in the source's order."""
        vectors = NUM_CATEGORICAL + 1
        if self.codebase == "torchrec":
            rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        else:
            rows, cols = torch.tril_indices(vectors, vectors, offset=0 if self.self_interaction else -1)
        return list(zip(rows.tolist(), cols.tolist(), strict=True))


def strip_wrappers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the prefixes every key shares from DataParallel or DLRMTrain."""
    keys = dict(state)
    for prefix in WRAPPER_PREFIXES:
        if keys and all(key.startswith(prefix) for key in keys):
            keys = {key[len(prefix) :]: value for key, value in keys.items()}
    return keys


def _mlp(layers: dict[int, dict[str, torch.Tensor]], step: int, width_in: int, what: str) -> tuple[int, ...]:
    """Widths of Linear layers at indices ``0, step, 2 step, ..`` chained from ``width_in``."""
    expected = [i * step for i in range(len(layers))]
    if sorted(layers) != expected:
        raise ExportError(f"{what}: Linear layers at indices {sorted(layers)}; expected {expected}")
    widths = []
    for index in expected:
        params = layers[index]
        if set(params) != {"weight", "bias"}:
            raise ExportError(f"{what}.{index}: has {sorted(params)}; expected a Linear's weight and bias")
        weight, bias = params["weight"], params["bias"]
        if weight.dim() != 2 or tuple(bias.shape) != (weight.shape[0],):
            raise ExportError(f"{what}.{index}: weight {tuple(weight.shape)}, bias {tuple(bias.shape)}")
        if weight.shape[1] != width_in:
            raise ExportError(
                f"{what}.{index} takes {weight.shape[1]} inputs; the layer before gives {width_in}"
            )
        width_in = int(weight.shape[0])
        widths.append(width_in)
    return tuple(widths)


def _interaction(width: int, bottom_out: int, dim: int, where: str) -> tuple[Interaction, bool]:
    """The interaction whose output is ``width`` wide: ``dot`` (with or without the diagonal) or ``cat``."""
    vectors = NUM_CATEGORICAL + 1
    options: dict[int, tuple[Interaction, bool]] = {bottom_out + NUM_CATEGORICAL * dim: ("cat", False)}
    if bottom_out == dim:
        options[dim + vectors * (vectors - 1) // 2] = ("dot", False)
        options[dim + vectors * (vectors + 1) // 2] = ("dot", True)
    if width not in options:
        expected = ", ".join(
            f"{w} ({kind}{' with the diagonal' if diag else ''})" for w, (kind, diag) in options.items()
        )
        raise ExportError(
            f"{where}: the top MLP takes {width} inputs; a DLRM with these tables takes {expected}"
        )
    return options[width]


def _table_indices_message(found: Sequence[int]) -> str:
    """``emb_l.0..emb_l.24 (25 tables)`` and what is missing, for the error line."""
    spans: list[str] = []
    start = previous = None
    for k in sorted(found):
        if start is None:
            start = previous = k
        elif previous is not None and k == previous + 1:
            previous = k
        else:
            spans.append(f"emb_l.{start}" if start == previous else f"emb_l.{start}..emb_l.{previous}")
            start = previous = k
    if start is not None:
        spans.append(f"emb_l.{start}" if start == previous else f"emb_l.{start}..emb_l.{previous}")
    missing = sorted(set(range(max(NUM_CATEGORICAL, max(found, default=0) + 1))) - set(found))
    gap = f", missing {', '.join(f'emb_l.{k}' for k in missing[:5])}" if missing else ""
    return f"tables {', '.join(spans) or 'none'} ({len(found)}){gap}"


def facebook_layout(state: Mapping[str, torch.Tensor], where: str) -> DLRMLayout:
    """Read a facebookresearch/dlrm ``DLRM_Net`` state dict (keys without wrapper prefixes).

    Raises:
        ExportError: a part the export does not support (QR or mixed-dimension
            embeddings, weighted pooling), not 26 tables, a missing table, or
            shapes that do not chain; the line says what was found and what is expected.
    """
    tables: dict[int, dict[str, torch.Tensor]] = {}
    mlps: dict[str, dict[int, dict[str, torch.Tensor]]] = {"bot_l": {}, "top_l": {}}
    unknown: list[str] = []
    for key, value in state.items():
        match = _FB_PARAM.match(key)
        if match is None:
            unknown.append(key)
            continue
        part, index, name = match["part"], int(match["index"]), match["name"]
        if part == "v_W_l":
            raise ExportError(
                f"{where}: {key} is a learned pooling weight (--weighted-pooling); the export supports "
                "sum-pooled tables (emb_l.<k>.weight) only"
            )
        if part == "emb_l":
            if name in ("weight_q", "weight_r"):
                raise ExportError(
                    f"{where}: {key} is a quotient-remainder embedding (--qr-flag); the export supports "
                    "plain tables emb_l.<k>.weight only"
                )
            if name.startswith(("embs.", "projs.")):
                raise ExportError(
                    f"{where}: {key} is a mixed-dimension embedding (--md-flag); the export supports "
                    "plain tables emb_l.<k>.weight only"
                )
            if name != "weight":
                unknown.append(key)
                continue
            tables.setdefault(index, {})[name] = value
        else:
            mlps[part].setdefault(index, {})[name] = value
    if unknown:
        raise ExportError(
            f"{where}: keys {', '.join(unknown[:4])} are not part of a facebookresearch DLRM_Net "
            f"({FACEBOOK_KEYS})"
        )
    if sorted(tables) != list(range(NUM_CATEGORICAL)):
        raise ExportError(
            f"{where}: found {_table_indices_message(list(tables))}; expected emb_l.0..emb_l.25 "
            f"({NUM_CATEGORICAL}, one per Criteo categorical column)"
        )
    weights = [tables[k]["weight"] for k in range(NUM_CATEGORICAL)]
    dims = {int(w.shape[1]) for w in weights if w.dim() == 2}
    if any(w.dim() != 2 for w in weights) or len(dims) != 1:
        shapes = sorted({tuple(w.shape) for w in weights})[:4]
        raise ExportError(f"{where}: emb_l tables of shapes {shapes}; expected rows x D with one D for all")
    dim = dims.pop()
    if not mlps["bot_l"] or not mlps["top_l"]:
        raise ExportError(f"{where}: no {'bot_l' if not mlps['bot_l'] else 'top_l'} layers ({FACEBOOK_KEYS})")
    bottom = _mlp(mlps["bot_l"], 2, NUM_DENSE, f"{where}: bot_l")
    width_in = int(mlps["top_l"][min(mlps["top_l"])]["weight"].shape[-1])
    interaction, itself = _interaction(width_in, bottom[-1], dim, where)
    top = _mlp(mlps["top_l"], 2, width_in, f"{where}: top_l")
    if top[-1] != 1:
        raise ExportError(
            f"{where}: the last top_l layer gives {top[-1]} outputs; expected 1 (the click probability)"
        )
    return DLRMLayout(
        codebase="facebookresearch",
        tables=tuple(f"emb_l.{k}" for k in range(NUM_CATEGORICAL)),
        rows=tuple(int(w.shape[0]) for w in weights),
        dim=dim,
        bottom=bottom,
        top=top,
        interaction=interaction,
        self_interaction=itself,
        columns=tuple(range(NUM_CATEGORICAL)),
    )


def torchrec_layout(
    state: Mapping[str, torch.Tensor], where: str, feature_order: Sequence[str] | None = None
) -> DLRMLayout:
    """Read a TorchRec ``DLRM`` or ``DLRM_DCN`` state dict (keys without wrapper prefixes).

    Args:
        state: the state dict.
        where: the file, for messages.
        feature_order: the 26 table names in C1..C26 order (None: the state dict's order).

    Raises:
        ExportError: a DLRM variant the export does not support (``DLRM_Projection``),
            not 26 tables, or shapes that do not chain (the line names the first
            unknown or missing key).
        ConfigError: ``feature_order`` names a table the state dict does not hold.
    """
    inter = [key for key in state if key.startswith("inter_arch.") and not _TR_CROSS.match(key)]
    if inter and inter[0].startswith("inter_arch.crossnet."):
        raise ExportError(
            f"{where}: {inter[0]} is not a parameter of DLRM_DCN's LowRankCrossNet "
            "(inter_arch.crossnet.{W_kernels,V_kernels,bias}.<l>)"
        )
    if inter:
        variant = "DLRM_Projection" if any("interaction_branch" in k for k in inter) else ""
        raise ExportError(
            f"{where}: {inter[0]} belongs to {variant or 'a DLRM with another learned interaction'}; the "
            "export supports TorchRec's DLRM (dot interaction) and DLRM_DCN (inter_arch.crossnet) only"
        )
    tables: dict[str, torch.Tensor] = {}
    dense: dict[int, dict[str, torch.Tensor]] = {}
    over: dict[int, dict[str, torch.Tensor]] = {}
    final: dict[str, torch.Tensor] = {}
    cross: dict[int, dict[str, torch.Tensor]] = {}
    unknown: list[str] = []
    for key, value in state.items():
        if match := _TR_CROSS.match(key):
            cross.setdefault(int(match["index"]), {})[match["name"]] = value
        elif key.startswith(TORCHREC_TABLES) and key.endswith(".weight"):
            tables[key[len(TORCHREC_TABLES) : -len(".weight")]] = value
        elif match := _TR_DENSE.match(key):
            dense.setdefault(int(match["index"]), {})[match["name"]] = value
        elif match := _TR_OVER.match(key):
            over.setdefault(int(match["index"]), {})[match["name"]] = value
        elif match := _TR_FINAL.match(key):
            final[match["name"]] = value
        else:
            unknown.append(key)
    if unknown:
        raise ExportError(
            f"{where}: key {unknown[0]} is not part of a TorchRec DLRM or DLRM_DCN ({TORCHREC_KEYS})"
        )
    names = tuple(tables)
    if len(names) != NUM_CATEGORICAL or any("." in name for name in names):
        raise ExportError(
            f"{where}: found {len(names)} tables ({', '.join(names[:4])}{', ...' * (len(names) > 4)}), "
            f"expected {NUM_CATEGORICAL}, one per Criteo categorical column"
        )
    dims = {int(w.shape[1]) for w in tables.values() if w.dim() == 2}
    if any(w.dim() != 2 for w in tables.values()) or len(dims) != 1:
        raise ExportError(
            f"{where}: embedding tables of different widths {sorted(dims)}; TorchRec's DLRM needs one"
        )
    dim = dims.pop()
    if not dense or set(final) != {"weight", "bias"}:
        raise ExportError(f"{where}: no dense_arch layers or no over_arch.model.1 ({TORCHREC_KEYS})")
    bottom = _mlp(dense, 1, NUM_DENSE, f"{where}: dense_arch.model._mlp")
    vectors = NUM_CATEGORICAL + 1
    width_in = dim + vectors * (vectors - 1) // 2
    if bottom[-1] != dim:
        raise ExportError(f"{where}: dense_arch gives {bottom[-1]} features; the tables are {dim} wide")
    layers, rank, column = _cross_net(cross, vectors * dim, where) if cross else (0, 0, False)
    if cross:
        width_in = vectors * dim
    hidden = _mlp(over, 1, width_in, f"{where}: over_arch.model.0._mlp") if over else ()
    top = (*hidden, *_mlp({0: final}, 1, hidden[-1] if hidden else width_in, f"{where}: over_arch.model.1"))
    if top[-1] != 1:
        raise ExportError(f"{where}: over_arch.model.1 gives {top[-1]} outputs; expected 1 (the logit)")
    if feature_order is None:
        columns = tuple(range(NUM_CATEGORICAL))
    else:
        absent = [name for name in feature_order if name not in tables]
        if absent:
            raise ConfigError(
                f"--feature-order names {', '.join(absent[:3])}, not a table of {where} "
                f"(its tables: {', '.join(names[:5])}, ...)"
            )
        columns = tuple(list(feature_order).index(name) for name in names)
    return DLRMLayout(
        codebase="torchrec",
        tables=names,
        rows=tuple(int(tables[name].shape[0]) for name in names),
        dim=dim,
        bottom=bottom,
        top=top,
        interaction="dcn" if cross else "dot",
        self_interaction=False,
        columns=columns,
        cross_layers=layers,
        cross_rank=rank,
        cross_bias_column=column,
    )


def _cross_net(layers: dict[int, dict[str, torch.Tensor]], width: int, where: str) -> tuple[int, int, bool]:
    """Layers, rank and bias form (``27D x 1`` or not) of a ``LowRankCrossNet`` over ``width`` features."""
    prefix = f"{where}: inter_arch.crossnet"
    if sorted(layers) != list(range(len(layers))):
        raise ExportError(f"{prefix}: layers {sorted(layers)}; expected 0..{len(layers) - 1}")
    ranks: set[int] = set()
    columns: set[bool] = set()
    for index in range(len(layers)):
        params = layers[index]
        absent = sorted({"W_kernels", "V_kernels", "bias"} - set(params))
        if absent:
            raise ExportError(f"{prefix}.{absent[0]}.{index} is missing (layer {index} has {sorted(params)})")
        w, v, b = params["W_kernels"], params["V_kernels"], params["bias"]
        rank = int(v.shape[0]) if v.dim() == 2 else -1
        if tuple(w.shape) != (width, rank) or tuple(v.shape) != (rank, width):
            raise ExportError(
                f"{prefix} layer {index}: W_kernels {tuple(w.shape)}, V_kernels {tuple(v.shape)}; expected "
                f"({width}, r) and (r, {width}) over x0 = [x, e_1..e_26] ({width} wide)"
            )
        if tuple(b.shape) not in ((width,), (width, 1)):
            raise ExportError(
                f"{prefix}.bias.{index} is {tuple(b.shape)}; expected ({width},) or ({width}, 1)"
            )
        ranks.add(rank)
        columns.add(b.dim() == 2)
    if len(ranks) != 1 or len(columns) != 1:
        raise ExportError(f"{prefix}: layers of different ranks {sorted(ranks)} or bias shapes")
    return len(layers), ranks.pop(), columns.pop()


def read_layout(
    state: Mapping[str, torch.Tensor], where: str, feature_order: Sequence[str] | None = None
) -> tuple[DLRMLayout, dict[str, torch.Tensor]]:
    """The layout of a facebookresearch or TorchRec DLRM state dict, told apart by its keys.

    Returns:
        The layout, and the state dict without wrapper prefixes.

    Raises:
        ExportError: the keys are neither codebase's (the line lists both layouts).
        ConfigError: ``feature_order`` given for a facebookresearch state dict.
    """
    keys = strip_wrappers(state)
    if any(_FB_PARAM.match(key) for key in keys):
        if feature_order is not None:
            raise ConfigError(
                "--feature-order names TorchRec tables; a facebookresearch DLRM looks up C<k> in emb_l.<k-1>"
            )
        return facebook_layout(keys, where), keys
    if any(key.startswith(("sparse_arch.", "dense_arch.", "over_arch.", "inter_arch.")) for key in keys):
        return torchrec_layout(keys, where, feature_order), keys
    hint = ""
    if "embedding.weight" in keys and any(k.startswith("bottom_mlp.") for k in keys):
        hint = (
            " (this is the bundle's own model.pt: pass the training directory that holds it and config.json)"
        )
    shown = ", ".join(list(keys)[:3])
    raise ExportError(
        f"{where}: a state dict of {len(keys)} tensors ({shown}, ...) that is neither a facebookresearch "
        f"DLRM ({FACEBOOK_KEYS}) nor a TorchRec DLRM ({TORCHREC_KEYS}){hint}"
    )


def column_names(layout: DLRMLayout) -> dict[str, str]:
    """Criteo column -> the table it reads (C1..C26 in order), for the export report."""
    tables = {column: layout.tables[table] for table, column in enumerate(layout.columns)}
    return {CATEGORICAL_COLUMNS[column]: tables[column] for column in range(NUM_CATEGORICAL)}
