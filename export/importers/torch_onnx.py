"""torch.onnx for every PyTorch source: one export call, one-id embedding bags as ``Gather``.

Every PyTorch exporter (:mod:`export.importers.onnx_dlrm` for the bundle's own DLRM,
:mod:`export.importers.dlrm_sources` for the models users bring) writes its graph through
:func:`export_module`: torch.onnx's TorchScript exporter (``dynamo=False``;
the dynamo exporter needs ``onnxscript``, which this environment does not
have), the bundle's tensor names, a dynamic batch dimension, ``onnx.checker``,
and a logged command that reproduces a failure.

``nn.EmbeddingBag`` (``aten::embedding_bag``) exports to an ONNX ``Loop`` over
the bags: slow in ONNX Runtime (26 of them made a large batch many times slower
than the same lookups as ``Gather``) and rejected by TensorRT. Criteo DLRMs look
up one id per bag (``offsets = arange(B)``), where a bag is a plain row lookup:
:func:`single_id_bags` runs the module once and records every embedding-bag call;
when each has one id per bag,
:func:`gather_embedding_bags` makes the export write each as one ``Gather``
(scaled by ``per_sample_weights`` where given). This covers TorchScript files
and ``torch.export`` programs too, whose submodules cannot be swapped. The
export's parity check against the user's own module catches a model whose bags
vary with the data.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from bundle.errors import ConfigError, ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, OUTPUT, VALUES_INPUT
from export.graphs.ids import set_graph_hotness
from export.graphs.onnx_io import save_model

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: Name of the dynamic batch dimension in the exported graph.
BATCH_DIM = "batch"
#: The symbolic length of a variable-bag model's values (every id of a request).
BAG_VALUES_DIM = "ids"
#: Lowest opset accepted: torch writes ``torch.remainder`` as one ``Mod`` from opset 11 on.
MIN_OPSET = 11
#: The aten operator behind ``nn.EmbeddingBag`` and ``F.embedding_bag``.
EMBEDDING_BAG_OP = "aten::embedding_bag"
#: Weights of at least this many bytes are left out of torch.onnx's graph-wide shape inference.
SHAPE_INFERENCE_MAX_BYTES = 64 * 2**20


@contextlib.contextmanager
def lean_shape_inference() -> Iterator[None]:
    """Keep the embedding tables out of torch.onnx's graph-wide ONNX shape inference.

    The TorchScript exporter runs ONNX shape inference over the whole graph twice
    (``_jit_pass_onnx_graph_shape_type_inference``), and hands it every weight's value:
    each pass serialises them all into a temporary ONNX model, two copies of every table
    at once: an export's anonymous memory peaked at twice its tables' bytes that way. No
    table's value sets a shape (its type and shape, which the pass keeps, do), so weights of
    :data:`SHAPE_INFERENCE_MAX_BYTES` or more are left out; the graph written is the same,
    and the peak comes down to about the tables' bytes (measured in
    benchmarks/in_graph_export/summary.md).
    """
    import torch

    original = torch._C._jit_pass_onnx_graph_shape_type_inference

    def lean(graph: torch._C.Graph, params_dict: dict[str, Any], opset: int) -> None:
        small = {
            k: v for k, v in params_dict.items() if v.numel() * v.element_size() < SHAPE_INFERENCE_MAX_BYTES
        }
        original(graph, small, opset)

    torch._C._jit_pass_onnx_graph_shape_type_inference = lean  # type: ignore[assignment]
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = original


def load_mapped(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` with the tensors memory-mapped from the file.

    A checkpoint's tables then stay in the file's pages (page cache) until rows are
    read, so tables larger than memory can be exported (``--stream-tables``). PyTorch
    maps privately (copy-on-write) by default, and Linux refuses a private writable
    mapping larger than its commit limit (RAM + swap, ``vm.overcommit_memory`` 0):
    then the file is mapped shared, which commits nothing. Nothing in the export writes
    to a loaded tensor; a shared mapping would write such a change into the file.

    Raises:
        Exception: whatever ``torch.load`` raises for a file it cannot read (the callers turn
            it into one error line); ``torch.save`` files older than the zip format cannot be
            mapped and are loaded into memory instead.
    """
    import mmap
    import zipfile

    import torch

    if not zipfile.is_zipfile(path):
        return torch.load(path, map_location="cpu", weights_only=True)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "Cannot allocate memory" not in str(exc):
            raise
        log.info("%s: larger than a private mapping may be here (%s); mapping it shared", path, exc)
    with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


@dataclass(frozen=True)
class BagCall:
    """One embedding-bag call seen while the module ran: its ids and bags."""

    ids: int
    bags: int
    arange_offsets: bool
    padding_idx: int

    @property
    def single_id(self) -> bool:
        """One id in every bag, no padding index: a plain row lookup."""
        return self.ids == self.bags and self.arange_offsets and self.padding_idx < 0


def single_id_bags(module: Any, inputs: tuple[torch.Tensor, ...]) -> list[BagCall]:
    """Run ``module(*inputs)`` once and record every embedding-bag call it makes.

    Works for Python modules, TorchScript modules and ``torch.export`` graphs
    alike: the calls are seen at the dispatcher, below all of them.

    Returns:
        One :class:`BagCall` per call, in call order.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[BagCall] = []

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if "_embedding_bag" in func.__name__ and "backward" not in func.__name__:
                named = {a.name: a.default_value for a in func._schema.arguments}
                named.update(zip((a.name for a in func._schema.arguments), args, strict=False))
                named.update(kwargs)
                indices, offsets = named["indices"], named["offsets"]
                bags = int(offsets.shape[0]) - (1 if named.get("include_last_offset") else 0)
                expected = torch.arange(int(offsets.shape[0]), dtype=offsets.dtype)
                padding = named.get("padding_idx")
                calls.append(
                    BagCall(
                        ids=int(indices.numel()),
                        bags=bags,
                        arange_offsets=indices.dim() == 1 and bool(torch.equal(offsets, expected)),
                        padding_idx=-1 if padding is None else int(padding),
                    )
                )
            return func(*args, **kwargs)

    with torch.no_grad(), _Recorder():
        module(*inputs)
    return calls


def _gather_bag(
    g: Any,
    weight: Any,
    indices: Any,
    offsets: Any,
    scale_grad_by_freq: Any,
    mode: Any,
    sparse: Any,
    per_sample_weights: Any,
    include_last_offset: Any,
    padding_idx: Any,
) -> tuple[Any, None, None, None]:
    """ONNX for a one-id-per-bag ``aten::embedding_bag``: ``Gather(weight, ids)`` (``N x D``)."""
    from torch.onnx import symbolic_helper

    rows = g.op("Gather", weight, indices, axis_i=0)
    if not symbolic_helper._is_none(per_sample_weights):
        scale = symbolic_helper._unsqueeze_helper(g, per_sample_weights, [1])
        rows = g.op("Mul", rows, scale)
    return rows, None, None, None


@contextlib.contextmanager
def gather_embedding_bags(opset: int) -> Iterator[None]:
    """Within the block, torch.onnx writes ``aten::embedding_bag`` as one ``Gather``.

    Only for modules whose every bag holds one id (:func:`single_id_bags`);
    the override is removed on exit, so other exports keep torch's own ``Loop``.
    """
    import torch

    torch.onnx.register_custom_op_symbolic(EMBEDDING_BAG_OP, _gather_bag, opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic(EMBEDDING_BAG_OP, opset)


def loop_nodes(model: onnx.ModelProto) -> list[str]:
    """Names (or op types, if unnamed) of the ``Loop`` nodes of ``model``'s main graph."""
    return [node.name or node.op_type for node in model.graph.node if node.op_type == "Loop"]


def export_module(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    out: Path,
    opset: int,
    what: str,
    reproduce: str | None = None,
    bags_as_gather: bool = False,
    doc: str | None = None,
    input_names: tuple[str, ...] | None = None,
    hotness: Sequence[int] | None = None,
) -> onnx.ModelProto:
    """Write ``module`` as the bundle's ONNX graph to ``out`` (external data beside it when over 2 GB).

    Args:
        module: ``forward(dense B x 13 float32, ids B x 26 int64) -> B x 1`` float32
            probabilities, in eval mode.
        inputs: the example batch to trace (more than one row).
        out: the ``.onnx`` file to write.
        opset: the ONNX opset.
        what: the source, for messages (``exporting {what} ... failed``).
        reproduce: a shell command that repeats the export, logged when it fails.
        bags_as_gather: write each ``aten::embedding_bag`` as one ``Gather``
            (:func:`gather_embedding_bags`; only for one-id bags).
        doc: the graph's doc string (default: ``exported from {what}``).
        input_names: the graph's inputs, one per tensor of ``inputs`` (None: the schema's
            two); :data:`bundle.schema.BAG_INPUTS`' names for bags of any size, whose values'
            length ``N`` is a dimension of its own.
        hotness: a multi-hot module's ids per bag of C1..C26 (its ids ``B x H``): recorded in
            the graph (:func:`export.graphs.ids.set_graph_hotness`), which the hot/cold split reads.

    Returns:
        The checked graph as written.

    Raises:
        ConfigError: ``opset`` is below :data:`MIN_OPSET`.
        ExportError: torch.onnx failed, or the graph failed ``onnx.checker``.
    """
    import torch

    input_names = input_names or (DENSE_INPUT, CATEGORICAL_INPUT)
    if opset < MIN_OPSET:
        raise ConfigError(f"DLRM export needs ONNX opset >= {MIN_OPSET} (for Mod), got {opset}")
    out = Path(out)
    try:
        with tempfile.TemporaryDirectory(prefix="torch-onnx-") as tmp:
            # Exported to a file, not a buffer: a graph over 2 GB then gets external data.
            traced = Path(tmp) / "model.onnx"
            overrides = gather_embedding_bags(opset) if bags_as_gather else contextlib.nullcontext()
            with warnings.catch_warnings(), overrides, lean_shape_inference():
                # torch.onnx's TorchScript exporter is deprecated; the tracer warns about
                # Python values it records as constants (the module's fixed layout).
                warnings.filterwarnings("ignore", category=DeprecationWarning)
                warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
                # A traced module has no Python signature; advanced indexing (DLRM's constant pair
                # lists) warns about negative indices. The parity check runs the graph on real rows.
                warnings.filterwarnings("ignore", message="no signature found for", category=UserWarning)
                warnings.filterwarnings(
                    "ignore", message="Exporting aten::index operator", category=UserWarning
                )
                scripted = (m for m in module.modules() if isinstance(m, torch.jit.ScriptModule))
                if not isinstance(module, torch.jit.ScriptModule) and next(scripted, None) is not None:
                    # torch.onnx's own trace refuses a TorchScript submodule ("not part of the
                    # active trace"); torch.jit.trace takes it, and torch.onnx exports its result.
                    module = torch.jit.trace(module, inputs, check_trace=False)
                torch.onnx.export(
                    module,
                    inputs,
                    str(traced),
                    dynamo=False,
                    input_names=list(input_names),
                    output_names=[OUTPUT],
                    dynamic_axes={
                        name: {0: BAG_VALUES_DIM if name == VALUES_INPUT else BATCH_DIM}
                        for name in (*input_names, OUTPUT)
                    },
                    opset_version=opset,
                    do_constant_folding=True,
                )
            # The checker takes the path so that graphs over 2 GB are checked too.
            onnx.checker.check_model(str(traced), full_check=True)
            # Over 2 GB, torch.onnx wrote each weight to a file of its own: they are copied into
            # one aligned data file in chunks, never loaded whole.
            model = onnx.load(str(traced), load_external_data=False)
            model.doc_string = doc if doc is not None else f"exported from {what}"
            set_graph_hotness(model, hotness)
            files = save_model(model, out, source_dir=traced.parent)
    except (
        RuntimeError,
        ValueError,
        TypeError,
        IndexError,
        NotImplementedError,
        onnx.checker.ValidationError,
        torch.onnx.OnnxExporterError,
    ) as exc:
        if reproduce:
            log.error("ONNX export failed; reproduce with:\n  %s", reproduce)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"exporting {what} to ONNX opset {opset} failed: {first}") from exc
    log.info("wrote %s", ", ".join(str(f) for f in files))
    return model


def python_command(code: str) -> str:
    """A shell command that runs Python ``code`` in this checkout, for a failure's log."""
    return f"PYTHONPATH={shlex.quote(str(Path.cwd()))} {shlex.quote(sys.executable)} -c {shlex.quote(code)}"


#: Ops that move or select values without computing new ones (between the interaction and the top MLP).
_DATA_MOVEMENT = frozenset(
    {
        "Cast", "Concat", "Expand", "Flatten", "Gather", "GatherElements", "GatherND", "Identity",
        "Reshape", "Slice", "Split", "Squeeze", "Transpose", "Unsqueeze",
    }
)  # fmt: skip
#: Ops between the output and a sigmoid that leave its values alone.
_SHAPE_ONLY = frozenset({"Cast", "Flatten", "Identity", "Reshape", "Squeeze", "Unsqueeze"})


def _constants(model: onnx.ModelProto) -> set[str]:
    """Names of the tensors that are weights: initializers and Constant outputs."""
    names = {t.name for t in model.graph.initializer}
    names.update(out for node in model.graph.node if node.op_type == "Constant" for out in node.output)
    return names


def output_sigmoids(model: onnx.ModelProto) -> list[str]:
    """The ``Sigmoid`` nodes that give the graph's outputs (through reshapes and casts only)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    found: list[str] = []
    for output in model.graph.output:
        node = producers.get(output.name)
        while node is not None and node.op_type in _SHAPE_ONLY:
            node = producers.get(node.input[0])
        if node is not None and node.op_type == "Sigmoid" and node.name:
            found.append(node.name)
    return found


def interaction_nodes(model: onnx.ModelProto) -> list[str]:
    """A graph's feature interaction, found without knowing its module names.

    Every ``MatMul`` whose two inputs are activations (neither a weight nor a
    constant: DLRM's ``V V^T``), and the data-movement nodes that carry its
    products on (pair selection, reshapes, the ``Concat`` with the dense
    vector) up to the next computing node (the top MLP's first layer).

    Returns:
        Node names in graph order; empty for a graph without such a product.
    """
    weights = _constants(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    keep = {
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and node.name and not (set(node.input[:2]) & weights)
    }
    frontier = [out for node in model.graph.node if node.name in keep for out in node.output]
    while frontier:
        for node in consumers.get(frontier.pop(), []):
            if node.op_type in _DATA_MOVEMENT and node.name and node.name not in keep:
                keep.add(node.name)
                frontier.extend(node.output)
    return [node.name for node in model.graph.node if node.name in keep]
