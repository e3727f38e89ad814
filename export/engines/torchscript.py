"""A PyTorch DLRM -> ``<family>_torch``: TorchScript in FP16 (or BF16) for Triton's PyTorch backend.

What the NGC image's PyTorch (LibTorch) backend serves is a TorchScript file
(``platform: "pytorch_libtorch"``, ``model.pt``); the local server serves the
same file with the Python-based backend ``backends/pytorch/model.py``.
The module is traced (:func:`torch.jit.trace`) from a copy of the exporter's own
module (:class:`export.framework.TorchServing`), wrapped in
:class:`TorchScriptServing`:

- the inputs and the output keep the schema's dtypes and names: ``forward``'s
  arguments are named after :data:`bundle.schema.INPUTS`, which Triton's PyTorch
  backend (24.xx/25.xx) then maps by name; the one output is mapped by order;
- ids of any int64 value are reduced into their tables (``torch.remainder``) where
  the module does not do it itself, so no lookup ever reads out of range;
- weights and activations are FP16 (or BF16), the dense input is cast on entry,
  and the submodules the exporter names (DLRM's dot interaction) compute in FP32
  (:class:`Float32Island`), as the FP16 ONNX graph keeps them; the output is FP32,
  and so is the sigmoid where the module gives logits.

The trace of the bundle's own and rebuilt DLRMs records no device: every
constant their forward uses is a parameter or a buffer, which
``torch.jit.load(..., map_location=device)`` moves, so one file serves on CPU and
on any GPU. A user's module that creates tensors in ``forward`` (``torch.arange(B)``
offsets) is traced with those on the CPU: :func:`cpu_device_constants` finds them,
the export warns, and the check on a GPU (where there is one) decides.

Imports torch at the top: import this module inside the functions that need it.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bundle.errors import ConfigError, ExportError
from bundle.ngc import TORCHSCRIPT_PRODUCER_RECORD, read_torchscript_record
from bundle.schema import INPUTS
from criteo.tsv import Batch
from export.framework import TorchServing, example_inputs

log = logging.getLogger(__name__)

#: The precisions the variant may be written in (names as ``--torch-dtype`` takes them).
DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: Rows per forward pass in :func:`run_torchscript`.
RUN_CHUNK = 4096


class Float32Island(nn.Module):
    """A submodule that computes in FP32 inside a reduced-precision model.

    Its floating-point inputs are cast to FP32 and its output back to the model's
    dtype: DLRM's dot products are sums of ``D`` products that feed the top MLP
    unscaled (see :meth:`export.importers.onnx_dlrm.DLRMExporter.fp32_nodes`).

    Args:
        module: the submodule (its weights are made FP32).
        dtype: the dtype of the rest of the model.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module.float()
        self.dtype = dtype

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        cast = [x.float() if x.is_floating_point() else x for x in inputs]
        return self.module(*cast).to(self.dtype)


class Logits(nn.Module):
    """A DLRM's logits as ``forward``: ``model.logits(dense, ids)`` (``B x 1``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.model.logits(dense, ids)  # type: ignore[operator]


class TorchScriptServing(nn.Module):
    """The module the variant traces: the served contract around a reduced-precision model.

    Args:
        model: the model in ``dtype`` (islands in FP32), ``forward(dense, ids)``.
        dtype: the model's dtype; the dense input is cast to it.
        logits: ``model`` gives logits; the sigmoid is applied in FP32.
        table_sizes: the 26 sizes ids are reduced into first (None: ``model`` reduces them).

    Shapes:
        ``forward(dense_features B x 13 float32, categorical_ids B x 26 int64)``
        -> ``B x 1`` float32 probabilities.
    """

    table_sizes: torch.Tensor

    def __init__(
        self, model: nn.Module, dtype: torch.dtype, logits: bool, table_sizes: tuple[int, ...] | None
    ) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.logits = logits
        self.reduce = table_sizes is not None
        if table_sizes is not None:
            sizes = torch.tensor([list(table_sizes)], dtype=torch.int64)
            self.register_buffer("table_sizes", sizes, persistent=False)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.reduce:
            # remainder takes the divisor's sign: negative and huge ids land in [0, rows).
            ids = torch.remainder(ids, self.table_sizes)
        out = self.model(dense.to(self.dtype), ids)
        if out.dim() == 1:
            out = out.unsqueeze(1)
        out = out.float()
        return torch.sigmoid(out) if self.logits else out


# torch.jit.trace names the traced forward's arguments after this signature, and Triton's PyTorch
# backend maps config inputs to them by name: the schema's names, never spelled here.
TorchScriptServing.forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ("self", *(spec.name for spec in INPUTS))
    ]
)


def reduced_precision(serving: TorchServing, dtype: torch.dtype) -> TorchScriptServing:
    """A copy of ``serving.module`` in ``dtype``, its ``fp32_modules`` in FP32, wrapped for serving.

    Raises:
        ExportError: the module cannot be copied, or names a submodule it does not have.
    """
    try:
        model = copy.deepcopy(serving.module)
    except (RuntimeError, TypeError, copy.Error) as exc:
        raise ExportError(f"the module cannot be copied for the TorchScript variant ({exc})") from None
    with warnings.catch_warnings():
        # A TorchScript module's .to() reads each parameter's .grad, which torch warns about.
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor", category=UserWarning)
        model = model.to(dtype).eval()
    for name in serving.fp32_modules:
        parent_name, _, child = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name)
            island = Float32Island(parent.get_submodule(child), dtype)
        except AttributeError:
            raise ExportError(f"the module has no submodule {name!r} to keep in FP32") from None
        setattr(parent, child, island)
    return TorchScriptServing(model, dtype, serving.logits, serving.table_sizes).eval()


def write_torchscript(serving: TorchServing, dtype_name: str, out: Path) -> dict[str, Any]:
    """Trace :func:`reduced_precision` of ``serving`` and save it as TorchScript at ``out``.

    Args:
        serving: what the exporter gives (:meth:`export.framework.TorchSource.torch_serving`).
        dtype_name: ``float16`` or ``bfloat16`` (:data:`DTYPES`).
        out: the ``model.pt`` to write.

    The file records the torch that wrote it (:data:`bundle.ngc.TORCHSCRIPT_PRODUCER_RECORD`),
    so ``python -m export check-release`` can tell whether a release's LibTorch serves it.

    Returns:
        Report fields: the torch version and the archive's file-format version, the
        precision, the submodules kept in FP32, whether the ids are reduced by the
        wrapper, and the traced forward's signature.

    Raises:
        ConfigError: an unknown ``dtype_name``.
        ExportError: the module does not run in that precision, or tracing failed.
    """
    if dtype_name not in DTYPES:
        raise ConfigError(f"unknown TorchScript precision {dtype_name!r}; choose one of {', '.join(DTYPES)}")
    module = reduced_precision(serving, DTYPES[dtype_name])
    inputs = example_inputs(serving.table_sizes)
    if serving.hotness is not None:
        from criteo.multihot import expand

        inputs = (inputs[0], torch.from_numpy(expand(inputs[1].numpy(), serving.hotness)))
    try:
        with torch.no_grad():
            traced = torch.jit.trace(module, inputs, check_trace=False)
            out.parent.mkdir(parents=True, exist_ok=True)
            producer = json.dumps({"torch": torch.__version__})
            torch.jit.save(traced, str(out), _extra_files={TORCHSCRIPT_PRODUCER_RECORD: producer})
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"tracing the module in {dtype_name} for TorchScript failed: {first}") from None
    schema = str(traced.forward.schema)
    log.info("wrote %s (%s): %s", out, dtype_name, schema)
    pinned = cpu_device_constants(traced)
    if pinned:
        log.warning(
            "%s: the traced module creates tensors on the CPU in forward (%d device constant(s), first at "
            "%s); served on a GPU it may fail. Build such tensors from an input's device, or script the "
            "module (torch.jit.script) and export that file",
            out, len(pinned), pinned[0],
        )  # fmt: skip
    return {
        "format": "torchscript",
        # What a serving release's LibTorch must read (bundle.ngc.check_release).
        "torch_version": torch.__version__,
        "archive_format": read_torchscript_record(out).format_version,
        "dtype": dtype_name,
        "fp32_modules": list(serving.fp32_modules),
        "sigmoid": "fp32, appended" if serving.logits else "the module's own",
        "id_reduction_added": serving.table_sizes is not None,
        "signature": schema,
        "cpu_device_constants": len(pinned),
    }


def cpu_device_constants(traced: torch.jit.ScriptModule) -> list[str]:
    """Where the traced graph fixes a tensor's device to the CPU: ``prim::Constant`` devices.

    A trace records the device of every tensor ``forward`` creates (``torch.arange``,
    ``torch.zeros``); ``map_location`` moves parameters and buffers, not those.

    Returns:
        The source location (or the node) of each, in graph order; empty when the file is device-free.
    """
    found = []
    for node in traced.inlined_graph.nodes():
        output = node.outputsAt(0) if node.outputsSize() else None
        if node.kind() != "prim::Constant" or output is None or output.type().kind() != "DeviceObjType":
            continue
        if str(output.toIValue()) == "cpu":
            location = str(node.sourceRange()).strip().splitlines()
            found.append(location[0] if location else str(node).strip())
    return found


def torch_cuda_unavailable() -> str | None:
    """None when torch can run on a CUDA device here; else why not, in one line."""
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def cuda_device_name() -> str:
    """The name of the CUDA device the checks run on (``cuda:0``), for the report."""
    return torch.cuda.get_device_name(0)


def run_torchscript(path: Path, batch: Batch, device: str = "cpu", chunk: int = RUN_CHUNK) -> np.ndarray:
    """The TorchScript file at ``path`` on ``batch``, on ``device`` (``cpu`` or ``cuda``): ``B x 1`` float32.

    Raises:
        ExportError: the file does not load, or the module failed on the rows.
    """
    try:
        module = torch.jit.load(str(path), map_location=device).eval()
    except (RuntimeError, ValueError) as exc:
        raise ExportError(f"torch.jit.load cannot load {path} on {device}: {exc}") from None
    return run_in_chunks(module, path, batch, device, chunk)


def run_in_chunks(
    model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    path: Path,
    batch: Batch,
    device: str,
    chunk: int,
) -> np.ndarray:
    """``model(dense, ids)`` on ``batch`` in slices of ``chunk`` rows on ``device``: ``B x 1`` float32.

    Raises:
        ExportError: the model at ``path`` failed on the rows (first line of why).
    """
    outputs: list[np.ndarray] = []
    try:
        with torch.inference_mode():
            for start in range(0, len(batch), chunk):
                part = batch.slice(start, start + chunk)
                dense = torch.from_numpy(np.ascontiguousarray(part.dense, dtype=np.float32)).to(device)
                ids = torch.from_numpy(np.ascontiguousarray(part.categorical, dtype=np.int64)).to(device)
                outputs.append(model(dense, ids).cpu().numpy())
    except (RuntimeError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"{path} failed on {device}: {first}") from None
    if not outputs:
        return np.empty((0, 1), dtype=np.float32)
    return np.concatenate(outputs)
