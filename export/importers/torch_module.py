"""Any PyTorch module with the serving contract -> ONNX: TorchScript files, ``torch.export``
programs and ``--factory`` modules.

The user's module takes ``(dense_features B x 13 float32, categorical_ids B x 26
int64)`` and returns ``B x 1`` or ``B`` probabilities (logits with
``--logits``). The export wraps it (:class:`ServingModule`: ``B x 1`` float32,
the sigmoid where it gives logits), writes it with torch.onnx
(:func:`export.importers.torch_onnx.export_module`, one-id embedding bags as one
``Gather``), then makes the graph safe for any int64 id
(:func:`export.graphs.ids.ensure_id_reduction`). The parity check runs the user's own
loaded module, on ids reduced into the tables where the export added the
reduction.

Imports torch at the top: import this module inside the functions that need it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import operator
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import onnx
import torch
from torch import nn

from bundle.errors import ConfigError, ExportError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.tsv import Batch
from export.framework import TorchServing, example_inputs
from export.graphs.ids import IdReduction, ensure_id_reduction
from export.importers.sources import SourceOptions
from export.importers.torch_onnx import (
    export_module,
    interaction_nodes,
    loop_nodes,
    output_sigmoids,
    python_command,
    single_id_bags,
)

log = logging.getLogger(__name__)

ModuleFormat = Literal["torchscript", "torch_export", "factory"]
#: Rows per forward pass of the user's module in :meth:`TorchModuleExporter.predict`.
PREDICT_CHUNK = 65536
#: What the user's module must compute, for messages.
CONTRACT = (
    f"forward(dense_features B x {NUM_DENSE} float32, categorical_ids B x {NUM_CATEGORICAL} int64) "
    "-> B x 1 or B probabilities (logits with --logits)"
)
TABLE_SIZES_HINT = "if ids fell outside a table, give the tables' sizes with --table-sizes (C1..C26)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _no_train(module: nn.Module) -> nn.Module:
    """``module`` with ``train()``/``eval()`` as no-ops (a ``torch.export`` module refuses them,
    and torch.onnx calls ``train(False)`` on everything it exports)."""
    module.__dict__["train"] = types.MethodType(lambda self, mode=True: self, module)
    return module


class ServingModule(nn.Module):
    """The user's module with the served output: ``B x 1`` float32 probabilities.

    Args:
        model: the user's module, ``forward(dense, ids)``.
        logits: ``model`` returns logits; a sigmoid is appended.

    Shapes:
        dense ``B x 13`` float32, ids ``B x 26`` int64 -> ``B x 1`` float32.
    """

    def __init__(self, model: nn.Module, logits: bool) -> None:
        super().__init__()
        self.model = model
        self.logits = logits

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(dense, ids)
        if not isinstance(out, torch.Tensor):
            raise ExportError(f"the model returned {type(out).__name__}, not a tensor; expected {CONTRACT}")
        if out.dim() == 1:
            out = out.unsqueeze(1)
        if out.dim() != 2 or out.shape[1] != 1 or out.shape[0] != dense.shape[0]:
            raise ExportError(f"the model returned shape {tuple(out.shape)}; expected {CONTRACT}")
        if out.dtype != torch.float32:
            out = out.float()
        return torch.sigmoid(out) if self.logits else out


# aten operators of a torch.export graph that take a batch size, and the Python-level
# call the TorchScript tracer records as dynamic.
def _size(x: torch.Tensor, dim: int) -> Any:
    return x.size(dim)


def _arange(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.arange(*args, dtype=kwargs.get("dtype"), device=kwargs.get("device"))


def _reshape(x: torch.Tensor, shape: list[Any]) -> torch.Tensor:
    return x.reshape(shape)


def _expand(x: torch.Tensor, shape: list[Any], implicit: bool = False) -> torch.Tensor:
    return x.expand(shape)


def _sized(fill: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def call(size: list[Any], *args: Any, **kwargs: Any) -> torch.Tensor:
        keep = {k: v for k, v in kwargs.items() if k in ("dtype", "device")}
        return fill(size, *args, **keep)

    return call


_SIZED_OPS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.arange.default: _arange,
    torch.ops.aten.arange.start: _arange,
    torch.ops.aten.arange.start_step: _arange,
    torch.ops.aten.view.default: _reshape,
    torch.ops.aten.reshape.default: _reshape,
    torch.ops.aten._unsafe_view.default: _reshape,
    torch.ops.aten.expand.default: _expand,
    torch.ops.aten.zeros.default: _sized(torch.zeros),
    torch.ops.aten.ones.default: _sized(torch.ones),
    torch.ops.aten.full.default: _sized(torch.full),
    torch.ops.aten.empty.memory_format: _sized(torch.zeros),
}
_SIZE_ARITHMETIC = frozenset(
    {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg}
)


def program_module(program: torch.export.ExportedProgram, where: str) -> nn.Module:
    """The module of a ``torch.export`` program, made traceable with a dynamic batch.

    torch.onnx's TorchScript exporter traces the program's graph; the graph
    reads the batch size with ``aten.sym_size``, which the tracer would record
    as a constant. Each such read becomes ``x.size(d)`` and each operator taking
    it the Python call the tracer records as dynamic (arange, view, expand, ...).

    Raises:
        ExportError: the program does not take two inputs, was exported with a
            fixed batch size, or passes the batch size to an operator not handled here.
    """
    inputs = [
        node
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in program.graph_signature.user_inputs
    ]
    if len(inputs) != 2:
        raise ExportError(f"{where}: the program takes {len(inputs)} inputs; expected {CONTRACT}")
    # A dynamic batch is a SymInt in the traced example's shape; a fixed one a plain int.
    static = [
        n.meta["val"].shape[0]
        for n in inputs
        if isinstance(n.meta.get("val"), torch.Tensor) and isinstance(n.meta["val"].shape[0], int)
    ]
    if static:
        raise ExportError(
            f"{where}: the program was exported for a fixed batch of {static[0]} rows; export it again with "
            "dynamic_shapes=({0: torch.export.Dim('batch')}, {0: torch.export.Dim('batch')})"
        )
    module = cast(torch.fx.GraphModule, program.module())
    sizes: set[torch.fx.Node] = set()
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.sym_size.int:
            node.target = _size
            sizes.add(node)
            continue
        uses: set[torch.fx.Node] = set()
        torch.fx.node.map_arg((node.args, node.kwargs), uses.add)
        if not uses & sizes:
            continue
        if node.target in _SIZE_ARITHMETIC:
            sizes.add(node)
        elif node.target in _SIZED_OPS:
            node.target = _SIZED_OPS[node.target]
        else:
            raise ExportError(
                f"{where}: the program passes its batch size to {node.target}, which this export cannot "
                "trace with a dynamic batch; save the model as TorchScript or pass --factory"
            )
    module.recompile()
    return _no_train(module)


def load_torchscript(path: Path) -> nn.Module:
    """A TorchScript file (``torch.jit.save``), on CPU, in eval mode.

    Raises:
        ExportError: torch cannot load it.
    """
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except (RuntimeError, ValueError, OSError) as exc:
        raise ExportError(f"{path}: a TorchScript archive torch cannot load ({_first_line(exc)})") from None
    return cast(nn.Module, module.eval())


def load_program(path: Path) -> nn.Module:
    """A ``torch.export`` program (``torch.export.save``), as a traceable module (:func:`program_module`).

    Raises:
        ExportError: torch cannot load it, or its module cannot be traced with a dynamic batch.
    """
    try:
        with open(path, "rb") as file:  # a file object: torch.export.load wants a .pt2 name otherwise
            program = torch.export.load(file)
    except (RuntimeError, ValueError, OSError, KeyError) as exc:
        raise ExportError(f"{path}: a torch.export archive torch cannot load ({_first_line(exc)})") from None
    return program_module(program, str(path))


def load_factory(spec: str, checkpoint: Path | None) -> tuple[nn.Module, ModuleFormat]:
    """Call ``--factory package.module:function`` for the user's module.

    The function is called with ``checkpoint`` when one is given and it takes
    an argument, else with none; it returns the module with its weights loaded
    (or a ``torch.export`` program).

    Raises:
        ConfigError: the module or function cannot be found.
        ExportError: the function raised, or returned something else than a module.
    """
    module_name, _, function_name = spec.partition(":")
    try:
        imported = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--factory {spec}: cannot import {module_name} ({_first_line(exc)})") from None
    function = getattr(imported, function_name, None)
    if not callable(function):
        raise ConfigError(f"--factory {spec}: {module_name} has no function {function_name}")
    try:
        takes_argument = bool(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        takes_argument = False
    if checkpoint is not None and not takes_argument:
        log.warning("--checkpoint %s is not used: %s takes no arguments", checkpoint, spec)
    try:
        result = function(checkpoint) if checkpoint is not None and takes_argument else function()
    except Exception as exc:  # the user's own code: any error it raises is reported in one line
        raise ExportError(f"--factory {spec} raised {_first_line(exc)}") from exc
    if isinstance(result, torch.export.ExportedProgram):
        return program_module(result, f"--factory {spec}"), "torch_export"
    if not isinstance(result, nn.Module):
        raise ExportError(
            f"--factory {spec} returned {type(result).__name__}; expected an nn.Module ({CONTRACT})"
        )
    return result.eval(), "factory"


class TorchModuleExporter:
    """The user's own PyTorch module, exported as it is (the ``dlrm`` family).

    Args:
        module: the loaded module (TorchScript, a ``torch.export`` program's module,
            or the ``--factory`` result), ``forward(dense, ids)``.
        kind: ``torchscript``, ``torch_export`` or ``factory``, for the report.
        options: table sizes, logits.
        path: the file it came from (None for a factory without one).
        reproduce: Python code that rebuilds this exporter, for a failure's log.
    """

    family = "dlrm"

    def __init__(
        self,
        module: nn.Module,
        kind: ModuleFormat,
        options: SourceOptions,
        path: Path | None,
        reproduce: str,
    ) -> None:
        self.module = module
        self.kind = kind
        self.options = options
        self.path = path
        self.reproduce = reproduce
        self.reduction: IdReduction | None = None
        self.bags: str = "not exported yet"

    @property
    def what(self) -> str:
        """The source, for messages."""
        if self.kind == "factory" or self.path is None:
            return f"--factory {self.options.factory}"
        return f"{self.path} ({self.kind})"

    @property
    def table_sizes(self) -> tuple[int, ...] | None:
        """Rows of the tables behind C1..C26 (known once :meth:`to_onnx` has run)."""
        if self.reduction is not None:
            return self.reduction.table_sizes
        return self.options.table_sizes

    @property
    def source(self) -> dict[str, Any]:
        """The report's ``source``: format, path, table sizes and their origin, the id reduction."""
        reduction = self.reduction
        return {
            "format": self.kind,
            "path": None if self.path is None else str(self.path),
            "factory": self.options.factory,
            "table_sizes": None if self.table_sizes is None else list(self.table_sizes),
            "table_sizes_from": reduction.origin if reduction is not None else "not known before the export",
            "id_reduction_added": reduction.added if reduction is not None else None,
            "interaction": "the module's own",
            "logits": self.options.logits,
            "embedding_bags": self.bags,
        }

    def to_onnx(self, out: Path, opset: int) -> None:
        """Write the user's module as the FP32 ONNX graph, then make it safe for any int64 id.

        Raises:
            ExportError: the module fails on the example batch or does not give
                the served output, torch.onnx failed, or the id reduction could
                not be added (e.g. table sizes neither given nor readable).
        """
        serving = ServingModule(self.module, self.options.logits)
        inputs = example_inputs(self.options.table_sizes)
        try:
            calls = single_id_bags(serving, inputs)
        except ExportError as exc:
            raise ExportError(f"{self.what}: {exc}") from None
        except (RuntimeError, IndexError, ValueError, TypeError) as exc:
            hint = f"; {TABLE_SIZES_HINT}" if self.options.table_sizes is not None else ""
            raise ExportError(
                f"{self.what} failed on an example batch ({_first_line(exc)}); expected {CONTRACT}{hint}"
            ) from None
        gather = bool(calls) and all(call.single_id for call in calls)
        code = f"{self.reproduce}.to_onnx(Path({str(out)!r}), {opset})"
        model = export_module(
            serving, inputs, out, opset, self.what, reproduce=python_command(code), bags_as_gather=gather
        )
        loops = loop_nodes(model)
        multi = sum(not call.single_id for call in calls)
        self.bags = "none" if not calls else ("one Gather each" if gather and not loops else "Loop")
        if loops:
            why = (
                f"{multi} of its {len(calls)} embedding-bag calls have bags of several ids or a padding index"
                if multi
                else "it loops over values itself"
            )
            log.warning(
                "%s exports with %d ONNX Loop node(s) (%s): ONNX Runtime runs them about 14x slower at "
                "batch 1024 and TensorRT rejects them. Look ids up one per bag (nn.EmbeddingBag with "
                "offsets=arange(B), or nn.Embedding), and for a module whose code you have, pass --factory "
                "package.module:function so the export can trace it",
                self.what, len(loops), why,
            )  # fmt: skip
        self.reduction = ensure_id_reduction(out, self.options.table_sizes)
        log.info(
            "ids: %s (table sizes from %s)",
            "reduced into the tables by the export"
            if self.reduction.added
            else "the model keeps them in range",
            self.reduction.origin,
        )

    def predict(self, batch: Batch) -> np.ndarray:
        """The user's own module on ``batch``: ``B x 1`` float32 probabilities.

        Ids are reduced into the tables first where the export added the reduction.

        Raises:
            ExportError: the module raised (most often: ids outside a table, when
                the table sizes were wrong), or gave the wrong shape.
        """
        ids = batch.categorical
        if self.reduction is not None:
            ids = self.reduction.reduce(ids)
        elif self.options.table_sizes is not None:
            ids = np.mod(ids, np.asarray(self.options.table_sizes, dtype=np.int64)[None, :])
        serving = ServingModule(self.module, self.options.logits)
        outputs: list[np.ndarray] = []
        try:
            with torch.no_grad():
                for start in range(0, len(batch), PREDICT_CHUNK):
                    dense = torch.from_numpy(np.ascontiguousarray(batch.dense[start : start + PREDICT_CHUNK]))
                    rows = torch.from_numpy(
                        np.ascontiguousarray(ids[start : start + PREDICT_CHUNK], dtype=np.int64)
                    )
                    outputs.append(serving(dense.float(), rows).numpy())
        except ExportError as exc:
            raise ExportError(f"{self.what}: {exc}") from None
        except (RuntimeError, IndexError, ValueError, TypeError) as exc:
            raise ExportError(
                f"{self.what} failed on the check rows ({_first_line(exc)}); {TABLE_SIZES_HINT}"
            ) from None
        if not outputs:
            return np.empty((0, 1), dtype=np.float32)
        return np.concatenate(outputs).astype(np.float32, copy=False)

    def torch_serving(self) -> TorchServing:
        """The user's module for the TorchScript variant, its ids reduced as the ONNX graph reduces them.

        Its structure is unknown, so the whole module runs in the variant's precision; the
        output stays FP32 (and the sigmoid, with ``--logits``), and the AUC gate decides.

        Raises:
            ExportError: called before :meth:`to_onnx` (which finds the table sizes).
        """
        if self.reduction is None:
            raise ExportError(f"{self.what}: the TorchScript variant is built after to_onnx")
        sizes = self.reduction.table_sizes if self.reduction.added else None
        return TorchServing(self.module, self.options.logits, (), sizes)

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """Nodes that stay FP32 in the FP16 variant: the interaction and the output sigmoid.

        The module's own names are unknown, so the interaction is found by its
        shape in the graph (:func:`export.importers.torch_onnx.interaction_nodes`: products
        of two activations and what carries them to the top MLP). A model
        without one (e.g. a DLRM with ``cat`` interaction) keeps only its output sigmoid.
        """
        return interaction_nodes(model) + output_sigmoids(model)
