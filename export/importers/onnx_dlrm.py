"""PyTorch DLRM -> ONNX, the :class:`export.framework.FrameworkExporter` for ``dlrm``.

Uses torch.onnx's TorchScript exporter (``dynamo=False``). torch 2.13 still
ships it (with a DeprecationWarning); the dynamo exporter needs ``onnxscript``,
which this environment does not have, and the TorchScript exporter already
gives the graph wanted here: ``Mod`` (``fmod=0``) + ``Add`` + one ``Gather``
for the 26 lookups, ``Gemm`` for the MLPs, ``MatMul`` for the interaction, a
dynamic batch dimension, and node names that carry the module path
(``/interaction/MatMul``), which the FP16 block list keys on. Below opset 11
it writes the modulo as a 13-node Div/Floor/Sub chain instead of ``Mod``,
hence :data:`export.importers.torch_onnx.MIN_OPSET`.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from bundle.errors import ConfigError, ExportError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.multihot import expand
from criteo.tables import table_offsets
from criteo.tsv import Batch
from export.framework import EXAMPLE_ROWS, TorchServing, own_model_source, small_table_sizes
from export.importers.torch_onnx import export_module, load_mapped, python_command
from models.config import DLRMConfig, load_config

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: The DLRM's interaction submodule (kept FP32 in the reduced-precision variants).
INTERACTION_MODULE = "interaction"
#: Substring of the names of the interaction's nodes (the ``interaction`` submodule).
INTERACTION_SCOPE = f"/{INTERACTION_MODULE}/"


def _repro_command(checkpoint: Path, out: Path, opset: int) -> str:
    """A shell command that repeats one export, for the log when it fails."""
    return python_command(
        "from pathlib import Path; from export.importers.onnx_dlrm import DLRMExporter; "
        f"DLRMExporter(Path({str(checkpoint)!r})).to_onnx(Path({str(out)!r}), {opset})"
    )


class DLRMExporter:
    """A trained DLRM loaded from ``config.json`` and ``model.pt``, ready to convert.

    Args:
        checkpoint: the directory that :func:`models.train_dlrm.train_dlrm` wrote.

    Attributes:
        family: ``"dlrm"``.
        config: the architecture saved beside the weights.

    Raises:
        ConfigError: ``config.json`` is missing, malformed or not a DLRM's.
        ExportError: ``model.pt`` is missing, corrupt or does not fit the config.
    """

    family = "dlrm"

    def __init__(self, checkpoint: Path) -> None:
        from models.dlrm import DLRM, WEIGHTS_FILE

        self.checkpoint = Path(checkpoint)
        config = load_config(self.checkpoint)
        if not isinstance(config, DLRMConfig):
            raise ConfigError(f"{self.checkpoint}: config.json describes a {config.kind!r} model, not 'dlrm'")
        self.config: DLRMConfig = config
        weights = self.checkpoint / WEIGHTS_FILE
        if not weights.is_file():
            raise ExportError(f"{weights} not found: is {self.checkpoint} a DLRM training output?")
        try:
            state = load_mapped(weights)  # tables larger than memory stay in the file's pages
        except (
            RuntimeError,
            OSError,
            EOFError,
            ValueError,
            pickle.UnpicklingError,
            zipfile.BadZipFile,
        ) as exc:
            raise ExportError(f"{weights}: not a readable PyTorch state dict ({exc})") from None
        if not isinstance(state, dict):
            raise ExportError(f"{weights}: expected a state dict, got {type(state).__name__}")
        try:
            model = DLRM.from_state(config, state)
        except RuntimeError as exc:
            raise ExportError(
                f"{weights}: weights do not match {self.checkpoint / 'config.json'} ({exc})"
            ) from None
        self.model = model.eval()
        #: A multi-hot model's ids per table (its ids are ``B x H``); None: one id per table.
        self.hotness = config.hotness

    @property
    def table_sizes(self) -> tuple[int, ...]:
        """Rows of the 26 tables; the model reduces ids into them itself."""
        return self.config.table_sizes

    @property
    def source(self) -> dict[str, Any]:
        """The export report's record of what was exported."""
        source = own_model_source(
            "bundle DLRM checkpoint (config.json + model.pt)", self.checkpoint, self.table_sizes
        )
        if self.hotness is not None:
            source["hotness"] = list(self.hotness)
        return source

    def _example_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A traced batch of ``EXAMPLE_ROWS`` rows, ids across the whole int64 range."""
        import torch

        generator = torch.Generator().manual_seed(0)
        dense = torch.rand(EXAMPLE_ROWS, NUM_DENSE, generator=generator)
        width = sum(self.hotness) if self.hotness is not None else NUM_CATEGORICAL
        ids = torch.randint(-(2**62), 2**62, (EXAMPLE_ROWS, width), generator=generator)
        return dense, ids

    def model_rows(self, batch: Batch) -> Batch:
        """``batch`` as the model takes it: a multi-hot model's bags made from each row's ids
        (:func:`criteo.multihot.expand`) when the rows have one id per table."""
        if self.hotness is None or batch.categorical.shape[1] == sum(self.hotness):
            return batch
        return Batch(batch.dense, expand(batch.categorical, self.hotness), batch.labels)

    def to_onnx(self, out: Path, opset: int) -> None:
        """Write the FP32 ONNX graph to ``out`` (external data beside it when over 2 GB).

        Inputs ``dense_features`` ``B x 13`` float32 and ``categorical_ids``
        ``B x 26`` int64, output ``click_probability`` ``B x 1`` float32, with
        a dynamic batch dimension; ids are reduced into the table (``Mod``)
        before the ``Gather``.

        Args:
            out: the ``.onnx`` file to write.
            opset: the ONNX opset to export with.

        Raises:
            ConfigError: ``opset`` is below :data:`export.importers.torch_onnx.MIN_OPSET`.
            ExportError: torch.onnx failed, or the graph failed ``onnx.checker``;
                the log holds a command that reproduces it.
        """
        export_module(
            self.model,
            self._example_inputs(),
            Path(out),
            opset,
            str(self.checkpoint),
            reproduce=_repro_command(self.checkpoint, Path(out), opset),
            doc=f"DLRM {self.config} exported from {self.checkpoint}",
            hotness=self.hotness,
        )

    @property
    def embedding_dim(self) -> int:
        """``D`` of the tables (:class:`export.framework.StreamedTables`)."""
        return self.config.embedding_dim

    def table_rows(self, column: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of table ``C<column + 1>`` (a view of the memory-mapped weights)."""
        offset = table_offsets(self.config.table_sizes)[column]
        return self.model.embedding.weight.detach()[offset + start : offset + stop].numpy()

    def placeholder_onnx(self, out: Path, opset: int, small_rows: int) -> None:
        """The same layers with tables of at most ``small_rows`` rows (zeros), as an ONNX graph."""
        from models.dlrm import DLRM

        small = dataclasses.replace(
            self.config, table_sizes=small_table_sizes(self.config.table_sizes, small_rows)
        )
        module = DLRM(small)
        layers = {k: v for k, v in self.model.state_dict().items() if k != "embedding.weight"}
        module.load_state_dict({**layers, "embedding.weight": module.embedding.weight.detach().zero_()})
        export_module(
            module.eval(),
            self._example_inputs(),
            Path(out),
            opset,
            str(self.checkpoint),
            reproduce=_repro_command(self.checkpoint, Path(out), opset),
            doc=f"DLRM {small} (placeholder tables) with the layers of {self.checkpoint}",
            hotness=self.hotness,
        )

    def predict(self, batch: Batch) -> np.ndarray:
        """PyTorch's probabilities for ``batch``: ``B x 1`` float32 (eval mode, no grad)."""
        from models.dlrm import predict_probabilities

        return predict_probabilities(self.model, batch)

    def torch_serving(self) -> TorchServing:
        """The DLRM's logits for the TorchScript variant: the dot interaction stays FP32 there,
        the sigmoid is applied in FP32, and the model reduces ids itself."""
        from export.engines.torchscript import Logits

        return TorchServing(Logits(self.model), True, (f"model.{INTERACTION_MODULE}",), None, self.hotness)

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """Nodes of the FP32 graph that stay FP32 in the FP16 variant.

        The interaction (every node under ``/interaction/``): its dot products
        are sums of ``D`` products whose size grows with ``D`` and the
        embeddings' norms, and they feed the top MLP unscaled, so FP32 keeps
        them from FP16's coarse rounding and 65504 ceiling. The final
        ``Sigmoid``: the served probability stays FP32. With those two in FP32
        the FP16 variant's AUC change on held-out rows stays far inside its gate
        (each export report holds its model's figures); also keeping the last
        ``Gemm`` in FP32 barely moved the max abs difference.

        DLRM-DCNv2's cross net (``x0 * (W (V x) + b) + x``, under ``/interaction/`` too)
        stays FP32 as well: it multiplies activations by activations like the dot
        products, and static INT8 of its ``MatMul`` failed the INT8 gate where the
        MLPs alone passed (``dcnv2-tiny`` trained on synthetic rows; FP16 passed
        either way). The variants as exported, and their AUC deltas, are measured in
        benchmarks/dcnv2/precision.md.

        Note: onnxconverter-common 1.16's ``convert_float_to_float16`` with
        ``keep_io_types=True`` gives an FP16 graph output when the node that
        produces it (here the Sigmoid) is blocked: it appends a Cast to FP16
        and retypes the output. The FP16 step must drop that trailing Cast
        and retype the output to FP32.

        Args:
            model: the FP32 graph written by :meth:`to_onnx`.

        Returns:
            Node names, in graph order.

        Raises:
            ExportError: the graph has no interaction or no output sigmoid
                (not a graph of this exporter).
        """
        outputs = {o.name for o in model.graph.output}
        names = [n.name for n in model.graph.node if INTERACTION_SCOPE in n.name]
        sigmoids = [n.name for n in model.graph.node if n.op_type == "Sigmoid" and outputs & set(n.output)]
        if not names or not sigmoids:
            raise ExportError(
                "the graph has no interaction nodes or no output Sigmoid: "
                "fp32_nodes expects a graph written by DLRMExporter.to_onnx"
            )
        return names + sigmoids
