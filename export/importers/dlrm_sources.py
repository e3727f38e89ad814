"""Bring your own PyTorch DLRM: what ``python -m export dlrm --checkpoint PATH`` accepts.

:func:`open_dlrm_source` turns what a user brought into one
:class:`export.framework.FrameworkExporter`, the format detected from the file:

- a directory with ``config.json``: the bundle's own training output
  (:class:`export.importers.onnx_dlrm.DLRMExporter`);
- a TorchScript file (``torch.jit.save``), a ``torch.export`` program
  (``torch.export.save``, ``.pt2``), or any module through ``--factory
  package.module:function``: exported as it is (:mod:`export.importers.torch_module`);
- a ``torch.save`` file: a facebookresearch/dlrm checkpoint (what
  ``dlrm_s_pytorch.py --save-model`` writes: a dict whose ``state_dict`` holds the
  weights) or its bare state dict, or a TorchRec ``DLRM`` or ``DLRM_DCN`` state dict: the model is
  rebuilt from the weight shapes (:mod:`export.importers.dlrm_layouts`, :mod:`export.importers.dlrm_rebuild`);
- a ``torch.distributed.checkpoint`` folder (``.metadata`` and ``.distcp`` shards) of such a
  state dict, as TorchRec training runs save it (:mod:`export.importers.distributed_checkpoint`).

A TorchScript archive holds ``constants.pkl`` and ``code/``, a ``torch.export``
archive ``archive_format``, a ``torch.save`` archive ``data.pkl``: the zip's
members tell the three apart before any loader runs (each loader fails noisily
on the others' files). Weights are loaded with ``weights_only=True``: a file
is never allowed to run code while it is read.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnx

from bundle.errors import ConfigError, ExportError
from bundle.schema import BAG_INPUTS, NUM_CATEGORICAL, VARIABLE_HOTNESS
from criteo.multihot import BagBatch, draw_bags, expand
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tsv import Batch
from export.framework import FrameworkExporter, TorchServing, example_inputs
from export.importers.sources import SourceOptions
from export.importers.torch_onnx import (
    export_module,
    load_mapped,
    loop_nodes,
    output_sigmoids,
    python_command,
)

if TYPE_CHECKING:
    import torch

    from export.importers.dlrm_rebuild import GatherDLRM

log = logging.getLogger(__name__)

FileFormat = Literal["torchscript", "torch_export", "torch_save"]
#: What ``--checkpoint`` may be, for the error line when it is none of them.
EXPECTED_FORMS = (
    "a facebookresearch/dlrm checkpoint or state dict, a TorchRec DLRM or DLRM_DCN state dict or "
    "torch.distributed.checkpoint folder, a TorchScript file "
    "(torch.jit.save), a torch.export program (torch.export.save, .pt2), or the bundle's training "
    "directory (config.json, model.pt); any other nn.Module through --factory package.module:function"
)
#: Keys of a checkpoint dict that hold the model's state dict.
STATE_DICT_KEYS = ("state_dict", "model_state_dict")
#: Substring of the names of the rebuilt module's interaction nodes.
INTERACTION_SCOPE = "/interaction/"
#: Rows per reference forward pass in :meth:`CheckpointExporter.predict`.
PREDICT_CHUNK = 65536
#: Bags of any size are summed by ScatterElements with ``reduction="add"`` (opset 16).
BAGS_MIN_OPSET = 16


def _describe(path: Path) -> str:
    """What a file that is no model looks like, in a few words."""
    with open(path, "rb") as file:
        head = file.read(512)
    if not head:
        return "an empty file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"{path.stat().st_size} bytes of binary data"
    return "a text file" if text.isprintable() or "\n" in text else "a file that is no model"


def detect_format(path: Path) -> FileFormat:
    """Tell a TorchScript, ``torch.export`` or ``torch.save`` file apart by its archive members.

    A file that is not a zip archive is taken for a legacy (pre-1.6) ``torch.save``
    pickle; :func:`load_state` then says when it is none.

    Raises:
        ConfigError: ``path`` does not exist.
        ExportError: a zip archive of none of the three kinds.
    """
    if not path.exists():
        raise ConfigError(f"--checkpoint {path} not found")
    if not zipfile.is_zipfile(path):
        return "torch_save"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    tails = {name.split("/", 1)[-1] for name in names}
    if "constants.pkl" in tails and any(tail.startswith("code/") for tail in tails):
        return "torchscript"
    if "archive_format" in tails:
        return "torch_export"
    if "data.pkl" in tails:
        return "torch_save"
    raise ExportError(
        f"{path}: a zip archive of {len(names)} files that is no PyTorch model; expected {EXPECTED_FORMS}"
    )


def _safe_globals() -> list[Any]:
    """numpy scalars and dtypes: facebookresearch's checkpoint stores its accuracies as numpy floats."""
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")  # numpy >= 2
    except ImportError:
        multiarray = importlib.import_module("numpy.core.multiarray")
    scalar = multiarray.scalar
    kinds = (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_)
    return [scalar, np.dtype, *(type(np.dtype(kind)) for kind in kinds)]


def load_state(path: Path) -> tuple[dict[str, torch.Tensor], Literal["checkpoint", "state_dict"]]:
    """The state dict in a ``torch.save`` file: a checkpoint dict's ``state_dict``, or the file itself.

    Returns:
        The state dict (its order kept: TorchRec's table order is the interaction's)
        and what held it.

    Raises:
        ExportError: not readable by ``torch.load(weights_only=True)`` (no model, or
            pickled Python objects), or no state dict inside.
    """
    import torch

    try:
        with torch.serialization.safe_globals(_safe_globals()):
            loaded = load_mapped(path)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found is None:
            raise ExportError(f"{path}: {_describe(path)}, not a model; expected {EXPECTED_FORMS}") from None
        raise ExportError(
            f"{path}: pickles Python objects ({found[1]}) that loading would have to run as code; save the "
            "model's state_dict(), TorchScript or a torch.export program instead, or pass --factory"
        ) from None
    except Exception as exc:  # the unpickler fails on bytes that are no pickle with any error (KeyError, ...)
        raise ExportError(f"{path}: {_describe(path)}, not a model; expected {EXPECTED_FORMS}") from exc
    if not isinstance(loaded, dict):
        raise ExportError(
            f"{path}: holds {type(loaded).__name__}, not a state dict; expected {EXPECTED_FORMS}"
        )
    for key in STATE_DICT_KEYS:
        if isinstance(loaded.get(key), dict):
            state = loaded[key]
            container: Literal["checkpoint", "state_dict"] = "checkpoint"
            break
    else:
        state, container = loaded, "state_dict"
    tensors = {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        keys = ", ".join(map(str, list(loaded)[:5]))
        raise ExportError(
            f"{path}: a dict ({keys}) without a state dict of tensors; expected {EXPECTED_FORMS}"
        )
    return tensors, container


class CheckpointExporter:
    """A facebookresearch/dlrm or TorchRec DLRM state dict, rebuilt from its weights (the ``dlrm`` family).

    The export writes :class:`export.importers.dlrm_rebuild.GatherDLRM`; :meth:`predict` runs
    the codebase's own forward (:func:`export.importers.dlrm_rebuild.reference_module`), on ids
    reduced into the tables as the graph reduces them.

    Args:
        path: the file.
        state: its state dict.
        container: ``checkpoint`` (a dict with ``state_dict``), ``state_dict`` or
            ``distributed_checkpoint`` (a ``torch.distributed.checkpoint`` folder).
        options: ``feature_order`` (TorchRec), ``table_sizes`` (at most each table's rows).

    Raises:
        ExportError: an unsupported layout (see :func:`export.importers.dlrm_layouts.read_layout`).
        ConfigError: options that do not fit the checkpoint.
    """

    family = "dlrm"

    def __init__(
        self,
        path: Path,
        state: dict[str, torch.Tensor],
        container: Literal["checkpoint", "state_dict", "distributed_checkpoint"],
        options: SourceOptions,
    ) -> None:
        from export.importers.dlrm_layouts import read_layout
        from export.importers.dlrm_rebuild import reference_module

        self.path = path
        self.options = options
        self.layout, state = read_layout(state, str(path), options.feature_order)
        if options.logits and not self.layout.logits:
            raise ConfigError("--logits: a facebookresearch DLRM ends in its own Sigmoid; drop --logits")
        rows = self.layout.column_rows
        sizes = options.table_sizes if options.table_sizes is not None else rows
        larger = [f"{CATEGORICAL_COLUMNS[c]}={s} > {rows[c]}" for c, s in enumerate(sizes) if s > rows[c]]
        if larger:
            raise ConfigError(f"--table-sizes exceed the checkpoint's tables: {', '.join(larger[:4])}")
        self.sizes: tuple[int, ...] = tuple(sizes)
        #: Ids per bag of C1..C26 (None: one id per table, or bags of any size).
        self.hotness = options.hotness
        #: Bags of any size: the model takes values and lengths (:data:`bundle.schema.BAG_INPUTS`).
        self.variable_bags = options.variable_bags
        model = "dlrm_dcn" if self.layout.interaction == "dcn" else "dlrm"
        self.format = f"{self.layout.codebase}_{model}_{container}"
        self.state = state
        self._module: GatherDLRM | None = None
        self.reference = reference_module(self.layout, state)

    @property
    def module(self) -> GatherDLRM:
        """The rebuilt module the export writes (built on first use: it stacks every table in memory)."""
        from export.importers.dlrm_rebuild import GatherDLRM

        if self._module is None:
            in_table_order = [self.sizes[column] for column in self.layout.columns]
            self._module = GatherDLRM(self.layout, self.state, in_table_order, self.hotness).eval()
        return self._module

    @property
    def embedding_dim(self) -> int:
        """``D`` of the tables (:class:`export.framework.StreamedTables`)."""
        return self.layout.dim

    def table_rows(self, column: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the table C<column + 1> looks up (from the memory-mapped state dict)."""
        from export.importers.dlrm_rebuild import table_key

        table = self.layout.tables[self.layout.columns.index(column)]
        return self.state[table_key(self.layout, table)].detach()[start:stop].float().numpy()

    def placeholder_onnx(self, out: Path, opset: int, small_rows: int) -> None:
        """The rebuilt module with tables of at most ``small_rows`` rows (zeros), as an ONNX graph."""
        import dataclasses

        if self.variable_bags:
            raise ConfigError(
                "a model of bags of any size is not placed hot/cold yet: give a fixed --hotness, or drop "
                "--hot-budget"
            )

        import torch

        from export.framework import small_table_sizes
        from export.importers.dlrm_rebuild import GatherDLRM, table_key

        rows = small_table_sizes(self.layout.rows, small_rows)
        sizes = small_table_sizes([self.sizes[column] for column in self.layout.columns], small_rows)
        layout = dataclasses.replace(self.layout, rows=rows)
        state = dict(self.state)
        for table, count in zip(self.layout.tables, rows, strict=True):
            state[table_key(self.layout, table)] = torch.zeros(count, self.layout.dim)
        module = GatherDLRM(layout, state, sizes, self.hotness).eval()
        dense, ids = example_inputs(small_table_sizes(self.sizes, small_rows))
        if self.hotness is not None:
            ids = torch.from_numpy(expand(ids.numpy(), self.hotness))
        export_module(
            module,
            (dense, ids),
            out,
            opset,
            f"{self.path} ({self.format}, placeholder tables)",
            reproduce=python_command(
                "from pathlib import Path; from export.importers.dlrm_sources import open_dlrm_source; "
                "from export.importers.sources import SourceOptions; "
                f"open_dlrm_source(Path({str(self.path)!r}), {self.options!r})"
                f".placeholder_onnx(Path({str(out)!r}), {opset}, {small_rows})"
            ),
            doc=f"DLRM rebuilt from {self.path} ({self.format}) with placeholder tables",
            hotness=self.hotness,
        )

    @property
    def table_sizes(self) -> tuple[int, ...]:
        """Rows the graph reduces the ids of C1..C26 into."""
        return self.sizes

    @property
    def source(self) -> dict[str, Any]:
        """The report's ``source``: format, path, table sizes, interaction, feature order."""
        from export.importers.dlrm_layouts import column_names

        source: dict[str, Any] = {
            "format": self.format,
            "path": str(self.path),
            "table_sizes": list(self.sizes),
            "table_sizes_from": "--table-sizes"
            if self.options.table_sizes is not None
            else "the checkpoint's table rows",
            "id_reduction_added": True,
            "interaction": self.layout.description,
            "embedding_dim": self.layout.dim,
            "bottom_mlp": list(self.layout.bottom),
            "top_mlp": list(self.layout.top),
            "hotness": list(self.hotness)
            if self.hotness is not None
            else VARIABLE_HOTNESS
            if self.variable_bags
            else "one id per table",
        }
        if self.layout.codebase == "torchrec":
            source["model"] = self.layout.source_model
            source["feature_order"] = column_names(self.layout)
            source["logits"] = f"sigmoid appended (TorchRec's {self.layout.source_model} returns logits)"
        if self.layout.interaction == "dcn":
            source["cross_layers"] = self.layout.cross_layers
            source["cross_rank"] = self.layout.cross_rank
        return source

    def to_onnx(self, out: Path, opset: int) -> None:
        """Write the rebuilt module as the FP32 ONNX graph (ids reduced by ``Mod`` before one ``Gather``).

        Raises:
            ConfigError: ``opset`` below 11.
            ExportError: torch.onnx failed or the graph failed ``onnx.checker``.
        """
        code = (
            "from pathlib import Path; from export.importers.dlrm_sources import open_dlrm_source; "
            f"from export.importers.sources import SourceOptions; open_dlrm_source(Path({str(self.path)!r}), "
            f"{self.options!r}).to_onnx(Path({str(out)!r}), {opset})"
        )
        if self.variable_bags and opset < BAGS_MIN_OPSET:
            raise ConfigError(
                f"bags of any size sum with ScatterElements' add, ONNX opset >= {BAGS_MIN_OPSET}; got {opset}"
            )
        model = export_module(
            self.module,
            self.example_inputs(),
            out,
            opset,
            f"{self.path} ({self.format})",
            reproduce=python_command(code),
            doc=f"DLRM rebuilt from {self.path} ({self.format}); {self.layout.description}",
            input_names=tuple(spec.name for spec in BAG_INPUTS) if self.variable_bags else None,
            hotness=self.hotness,
        )
        if loop_nodes(model):  # the rebuilt module has no EmbeddingBag: a Loop here is a bug
            raise ExportError(f"exporting {self.path} wrote a Loop node; the rebuilt DLRM should have none")

    def predict(self, batch: Batch) -> np.ndarray:
        """The source codebase's own forward on ``batch`` (ids reduced into the tables): ``B x 1`` float32."""
        import torch

        from export.importers.dlrm_rebuild import reference_probabilities

        if isinstance(batch, BagBatch):
            return self._predict_bags(batch)
        counts = self.hotness if self.hotness is not None else (1,) * NUM_CATEGORICAL
        ids = np.mod(batch.categorical, np.repeat(np.asarray(self.sizes, dtype=np.int64), counts)[None, :])
        outputs = []
        for start in range(0, len(batch), PREDICT_CHUNK):
            dense = torch.from_numpy(
                np.ascontiguousarray(batch.dense[start : start + PREDICT_CHUNK], dtype=np.float32)
            )
            rows = torch.from_numpy(np.ascontiguousarray(ids[start : start + PREDICT_CHUNK]))
            outputs.append(
                reference_probabilities(self.layout, self.reference, dense, rows, self.hotness).numpy()
            )
        if not outputs:
            return np.empty((0, 1), dtype=np.float32)
        return np.concatenate(outputs).astype(np.float32, copy=False)

    def _predict_bags(self, batch: BagBatch) -> np.ndarray:
        """The source's own forward on bags of any size (ids reduced into the tables)."""
        import torch

        from export.importers.dlrm_rebuild import reference_bag_probabilities

        columns = batch.value_columns()
        reduced = batch.with_values(np.mod(batch.values, np.asarray(self.sizes, dtype=np.int64)[columns]))
        outputs = []
        for start in range(0, len(batch), PREDICT_CHUNK):
            part = reduced.slice(start, start + PREDICT_CHUNK)
            outputs.append(
                reference_bag_probabilities(
                    self.layout,
                    self.reference,
                    torch.from_numpy(np.ascontiguousarray(part.dense, dtype=np.float32)),
                    torch.from_numpy(np.ascontiguousarray(part.values)),
                    torch.from_numpy(np.ascontiguousarray(part.lengths)),
                ).numpy()
            )
        if not outputs:
            return np.empty((0, 1), dtype=np.float32)
        return np.concatenate(outputs).astype(np.float32, copy=False)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """The traced batch: ``B x 13`` dense and ids inside the tables (``B x H`` multi-hot;
        values and lengths, empty bags among them, for bags of any size)."""
        import torch

        dense, ids = example_inputs(self.sizes)
        if self.variable_bags:
            bags = draw_bags(Batch(dense.numpy(), ids.numpy(), None))
            return dense, torch.from_numpy(bags.values), torch.from_numpy(bags.lengths)
        if self.hotness is None:
            return dense, ids
        return dense, torch.from_numpy(expand(ids.numpy(), self.hotness))

    def model_rows(self, batch: Batch) -> Batch:
        """``batch`` as the model takes it: each table's bag made from its single id
        (:func:`criteo.multihot.expand`, fixed seed) when the model is multi-hot, or bags of
        drawn sizes (:func:`criteo.multihot.draw_bags`, empty ones included) for bags of any size."""
        if isinstance(batch, BagBatch) or (self.hotness is None and not self.variable_bags):
            return batch  # already bags (a multi-hot text file's), or a single-hot model's rows
        if self.variable_bags:
            return draw_bags(batch)
        assert self.hotness is not None
        if batch.categorical.shape[1] == sum(self.hotness):
            return batch
        return Batch(batch.dense, expand(batch.categorical, self.hotness), batch.labels)

    def torch_serving(self) -> TorchServing:
        """The rebuilt DLRM's logits for the TorchScript variant: a ``dot`` or ``dcn`` interaction
        stays FP32 there (a ``cat`` only moves values), the sigmoid is FP32, and the module reduces
        ids itself."""
        from export.engines.torchscript import Logits

        if self.variable_bags:
            raise ExportError(
                "the TorchScript variant takes categorical_ids; "
                "bags of any size are served by the ONNX models"
            )
        keep = ("model.interaction",) if self.layout.interaction != "cat" else ()
        return TorchServing(Logits(self.module), True, keep, None, self.hotness)

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """The interaction (every node under ``/interaction/``, for ``dot`` and ``dcn``), the sums
        of bags of any size, and the output sigmoid.

        The dot products are sums of ``D`` products that feed the top MLP unscaled, and the
        cross net multiplies activations by activations (see
        :meth:`export.importers.onnx_dlrm.DLRMExporter.fp32_nodes`); a ``cat`` interaction
        only moves values and stays FP16.
        """
        names = (
            [n.name for n in model.graph.node if INTERACTION_SCOPE in n.name]
            if self.layout.interaction != "cat"
            else []
        )
        # Bags of any size are summed by ScatterElements' add, which ONNX Runtime's CPU provider
        # runs in FP32 only (and a long bag sums better in FP32).
        bag_sums = [n.name for n in model.graph.node if n.op_type == "ScatterElements"]
        return names + bag_sums + output_sigmoids(model)


def _module_exporter(
    checkpoint: Path | None, options: SourceOptions, kind: FileFormat | None
) -> FrameworkExporter:
    """The exporter of a TorchScript or torch.export file, or of --factory's module."""
    from export.importers.torch_module import (
        TorchModuleExporter,
        load_factory,
        load_program,
        load_torchscript,
    )

    reproduce = (
        "from pathlib import Path; from export.importers.dlrm_sources import open_dlrm_source; "
        "from export.importers.sources import SourceOptions; "
        f"open_dlrm_source({None if checkpoint is None else f'Path({str(checkpoint)!r})'}, {options!r})"
    )
    if options.factory is not None:
        module, made = load_factory(options.factory, checkpoint)
        return TorchModuleExporter(module, made, options, checkpoint, reproduce)
    if checkpoint is None or kind is None or kind == "torch_save":
        raise ConfigError("internal: no module file to load")
    module = load_torchscript(checkpoint) if kind == "torchscript" else load_program(checkpoint)
    return TorchModuleExporter(module, kind, options, checkpoint, reproduce)


def _refuse_hotness(options: SourceOptions) -> None:
    """A module is exported as its forward takes its ids: ``--hotness`` is for rebuilt state dicts."""
    if options.hotness is not None or options.variable_bags:
        raise ConfigError(
            "--hotness applies to TorchRec and facebookresearch state dicts, whose tables are rebuilt "
            "as bags; a module takes the ids its own forward takes"
        )


def open_dlrm_source(checkpoint: Path | None, options: SourceOptions) -> FrameworkExporter:
    """The exporter for what a user brought as a DLRM, its format detected from the file.

    Args:
        checkpoint: the bundle's training directory (``config.json``), a facebookresearch
            or TorchRec checkpoint / state dict, a TorchScript file or a ``torch.export``
            program; with ``options.factory``, an optional argument for the factory.
        options: what the file cannot say (table sizes, TorchRec feature order,
            ``--factory``, logits).

    Returns:
        A :class:`export.framework.FrameworkExporter` of family ``dlrm``.

    Raises:
        ConfigError: no checkpoint and no factory, a missing path, or options that
            do not apply to the source.
        ExportError: a file that is no model, or a model the export does not
            support; one line naming what was found and what is expected.
    """
    from models.config import CONFIG_FILE

    if options.input_map:
        raise ConfigError(
            "--input-map applies to Keras models; a PyTorch DLRM takes (dense_features, categorical_ids)"
        )
    if options.factory is not None:
        _refuse_hotness(options)
        return _module_exporter(checkpoint, options, None)
    if checkpoint is None:
        raise ConfigError(f"give --checkpoint ({EXPECTED_FORMS})")
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir() and not (checkpoint / CONFIG_FILE).is_file():
        from export.importers.distributed_checkpoint import (
            is_distributed_checkpoint,
            load_distributed_checkpoint,
        )

        if is_distributed_checkpoint(checkpoint):
            exporter = CheckpointExporter(
                checkpoint, load_distributed_checkpoint(checkpoint), "distributed_checkpoint", options
            )
            log.info("%s: %s, %s", checkpoint, exporter.format, exporter.layout.description)
            return exporter
    if checkpoint.is_dir():
        if not (checkpoint / CONFIG_FILE).is_file():
            raise ConfigError(
                f"--checkpoint {checkpoint} is a directory without {CONFIG_FILE}; expected {EXPECTED_FORMS}"
            )
        given = [
            flag
            for flag, value in (
                ("--table-sizes", options.table_sizes),
                ("--feature-order", options.feature_order),
                ("--logits", options.logits or None),
                ("--hotness", options.hotness),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: the bundle's training output describes itself in {CONFIG_FILE}; "
                "drop them"
            )
        from export.importers.onnx_dlrm import DLRMExporter

        return DLRMExporter(checkpoint)
    kind = detect_format(checkpoint)
    log.debug("%s: detected %s", checkpoint, kind)
    if kind != "torch_save":
        _refuse_hotness(options)
        if options.feature_order is not None:
            raise ConfigError(
                "--feature-order applies to TorchRec state dicts; a module takes C1..C26 in order"
            )
        return _module_exporter(checkpoint, options, kind)
    state, container = load_state(checkpoint)
    exporter = CheckpointExporter(checkpoint, state, container, options)
    log.info(
        "%s: %s, %d tables of %d..%d rows, D=%d, %s",
        checkpoint, exporter.format, NUM_CATEGORICAL, min(exporter.layout.rows), max(exporter.layout.rows),
        exporter.layout.dim, exporter.layout.description,
    )  # fmt: skip
    return exporter
