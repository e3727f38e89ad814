"""A PyTorch DLRM -> ``<family>_aoti``: an AOTInductor package (``model.pt2``) for Triton's pytorch backend.

PyTorch 2 serves without Python through AOTInductor: :func:`torch.export.export` captures the
module's graph and :func:`torch._inductor.aoti_compile_and_package` compiles it into C++ code and
a shared library, packed with the weights into one PT2 archive. The NGC image's pytorch backend
loads such a package from 26.03 on (``platform: "torch_aoti"``, ``backend: "pytorch"``); the
local server loads it with the Python-based backend ``backends/pytorch/model.py``.

The module is the exporter's own (:class:`export.framework.TorchServing`), wrapped as the
TorchScript variant wraps it (:class:`export.engines.torchscript.TorchScriptServing`), in FP32:

- ids of any int64 value are reduced into their tables (``torch.remainder``) where the module
  does not do it itself, so no lookup ever reads out of range;
- the sigmoid is appended where the module gives logits; the output is ``B x 1`` float32;
- it is called with keyword arguments named after :data:`bundle.schema.INPUTS`
  (:class:`KeywordServing`), so the package's call spec holds the schema's names: a config
  maps them as ``KWARGS[<name>]`` and the one output as ``RESULT``, the forward-based names
  of the pytorch backend (26.05 and later);
- the batch dimension of every input is dynamic, from 1 to the served ``max_batch_size``.

A package runs only under the PyTorch that compiled it and on the device it was compiled for
(its ``*_metadata.json`` records ``AOTI_DEVICE_KEY``, and the CPU instruction set of a CPU
package, ``AOTI_CPU_ISA``). The export appends a producer record (``<root>/extra/producer.json``,
:data:`bundle.ngc.TORCHSCRIPT_PRODUCER_RECORD`: the compiling torch and the device), which
``python -m export check-release`` and the local backend read. Compiling for CUDA needs a
machine with a GPU and a CUDA build of torch; elsewhere the package is compiled for the CPU.

Imports torch at the top: import this module inside the functions that need it.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import secrets
import shutil
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bundle.errors import ExportError
from bundle.ngc import TORCHSCRIPT_PRODUCER_RECORD
from bundle.repository import aoti_input_name
from bundle.schema import INPUTS
from criteo.tsv import Batch
from export.engines.torchscript import RUN_CHUNK, TorchScriptServing, run_in_chunks
from export.framework import TorchServing, example_inputs

log = logging.getLogger(__name__)

#: Devices a package is compiled for (``AOTI_DEVICE_KEY`` of its metadata).
DEVICES: tuple[str, ...] = ("cpu", "cuda")
#: The metadata key of a compiled model that names its device.
DEVICE_KEY = "AOTI_DEVICE_KEY"
#: The metadata key of a CPU package that names the instruction set it was compiled for.
CPU_ISA_KEY = "AOTI_CPU_ISA"


class KeywordServing(nn.Module):
    """The served contract, called with keyword arguments named after the schema's inputs.

    ``torch.export`` records the keyword names in the package's call spec, which is how the
    pytorch backend (26.05 and later) maps config inputs named ``KWARGS[<name>]``.

    Args:
        serving: the wrapped module, ``forward(dense, ids)`` in the schema's order.

    Shapes:
        ``forward(dense_features=B x 13 float32, categorical_ids=B x 26 int64)`` (``B x H``
        ids for a multi-hot module) -> ``B x 1`` float32 probabilities.
    """

    def __init__(self, serving: TorchScriptServing) -> None:
        super().__init__()
        self.serving = serving

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.serving(*(inputs[spec.name] for spec in INPUTS))


# torch.export reads the arguments' names from this signature (dynamic shapes are given by name);
# the call passes them as keywords, which forward takes whatever they are called: the schema's
# names, never spelled here.
KeywordServing.forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY) for spec in INPUTS]
)


def compile_device(profile: str) -> tuple[str, str | None]:
    """The device a package of ``profile`` is compiled for, and why not CUDA where the profile wants it.

    ``cuda`` in the gpu profile where torch sees a CUDA device; else ``cpu``. A gpu-profile package
    compiled for the CPU runs on the CPU only (its instances are then KIND_CPU): that is logged
    once, and the reason returned for the export's report.

    Returns:
        ``(device, note)``: ``note`` is None unless the gpu profile gets a CPU package.
    """
    if profile != "gpu" or torch.cuda.is_available():
        return ("cuda" if profile == "gpu" else "cpu"), None
    note = (
        f"torch {torch.__version__} sees no CUDA device: the package is compiled for the CPU and runs on "
        "KIND_CPU instances; compile it on a machine with a GPU for KIND_GPU"
    )
    log.warning("%s", note)
    return "cpu", note


def fp32_module(serving: TorchServing, device: str) -> KeywordServing:
    """``serving.module`` in FP32 on ``device``, wrapped for serving (the exporter's module itself on
    the CPU, where nothing changes it; a copy where it must move to another device).

    Raises:
        ExportError: the module cannot be copied to move it.
    """
    module = serving.module
    if device != "cpu":
        try:
            module = copy.deepcopy(module)
        except (RuntimeError, TypeError, copy.Error) as exc:
            raise ExportError(
                f"the module cannot be copied to {device} for the AOTInductor variant ({exc})"
            ) from None
        module = module.to(device)
    wrapped = TorchScriptServing(module, torch.float32, serving.logits, serving.table_sizes).to(device)
    return KeywordServing(wrapped).eval()


def _example(serving: TorchServing, device: str) -> dict[str, torch.Tensor]:
    """An example batch by input name (multi-hot ids as :func:`export.engines.torchscript.write_torchscript`
    builds them)."""
    dense, ids = example_inputs(serving.table_sizes)
    if serving.hotness is not None:
        from criteo.multihot import expand

        ids = torch.from_numpy(expand(ids.numpy(), serving.hotness))
    names = [spec.name for spec in INPUTS]
    return {names[0]: dense.to(device), names[1]: ids.to(device)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_aoti(serving: TorchServing, out: Path, max_batch_size: int, device: str = "cpu") -> dict[str, Any]:
    """Export ``serving`` in FP32 with a dynamic batch, compile it with AOTInductor for ``device``
    and write the package, with its producer record, at ``out``.

    The package is compiled into a temporary folder beside ``out`` and renamed into place once
    its record is in, so ``out`` never holds a part of one.

    Args:
        serving: what the exporter gives (:meth:`export.framework.TorchSource.torch_serving`).
        out: the ``model.pt2`` to write.
        max_batch_size: the largest batch the package takes (the config's ``max_batch_size``).
        device: ``cpu`` or ``cuda`` (:func:`compile_device`).

    Returns:
        Report fields: the compiling torch, the device (and a CPU package's instruction set),
        the seconds of export and of compilation, the batch range, the input names of the
        call spec, whether the wrapper reduces ids and appends the sigmoid.

    Raises:
        ExportError: an unknown device, or the module does not export or compile (first line of why).
    """
    if device not in DEVICES:
        raise ExportError(f"unknown AOTInductor device {device!r}; choose one of {', '.join(DEVICES)}")
    module = fp32_module(serving, device)
    example = _example(serving, device)
    batch = torch.export.Dim("batch", min=1, max=max_batch_size)
    dynamic = {name: {0: batch} for name in example}
    temporary = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp"
    try:
        temporary.mkdir(parents=True)
        started = time.perf_counter()
        try:
            with torch.no_grad():
                program = torch.export.export(module, (), example, dynamic_shapes=dynamic)
        except Exception as exc:  # torch.export raises many kinds (UserError, Unsupported, ...)
            log.debug("torch.export failed", exc_info=True)  # the whole story, with --verbose
            raise ExportError(f"torch.export of the module failed: {_first_line(exc)}") from None
        exported = time.perf_counter()
        try:
            with warnings.catch_warnings():
                # torch's own pickling of the call spec, deprecated inside torch: nothing to act on here.
                warnings.filterwarnings(
                    "ignore", message=".*LeafSpec.* is deprecated", category=FutureWarning
                )
                package = torch._inductor.aoti_compile_and_package(
                    program, package_path=str(temporary / out.name)
                )
        except Exception as exc:  # inductor and the C++ compiler raise many kinds
            log.debug("aoti_compile_and_package failed", exc_info=True)
            raise ExportError(
                f"AOTInductor could not compile the module for {device}: {_first_line(exc)}"
            ) from None
        compiled = time.perf_counter()
        append_producer_record(Path(package), device)
        os.replace(package, out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    metadata = package_metadata(out)
    log.info(
        "wrote %s (%s, batch 1..%d): exported in %.1f s, compiled in %.1f s",
        out, device, max_batch_size, exported - started, compiled - exported,
    )  # fmt: skip
    return {
        "format": "aotinductor",
        # What a serving release's pytorch backend must be (bundle.ngc.package_problem).
        "torch_version": torch.__version__,
        "device": device,
        "cpu_isa": metadata.get(CPU_ISA_KEY) or None,
        "dtype": "float32",
        "export_seconds": round(exported - started, 3),
        "compile_seconds": round(compiled - exported, 3),
        "batch": [1, max_batch_size],
        "inputs": [aoti_input_name(name) for name in example],
        "sigmoid": "fp32, appended" if serving.logits else "the module's own",
        "id_reduction_added": serving.table_sizes is not None,
    }


def _archive_root(archive: zipfile.ZipFile, path: Path) -> str:
    """The folder every record of the PT2 archive lies in (``model`` for ``model.pt2``)."""
    roots = {name.split("/", 1)[0] for name in archive.namelist() if "/" in name}
    if len(roots) != 1:
        raise ExportError(f"{path} is not a PT2 archive (its records lie in {sorted(roots) or 'no folder'})")
    return roots.pop()


def append_producer_record(path: Path, device: str) -> None:
    """Append ``<root>/extra/producer.json`` = ``{"torch": <this torch>, "device": device}`` to the package.

    torch's own reader (``aoti_load_package``, ``load_pt2(...).extra_files``) reads past it.

    Raises:
        ExportError: ``path`` is no PT2 archive.
    """
    record = json.dumps({"torch": torch.__version__, "device": device})
    try:
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr(f"{_archive_root(archive, path)}/extra/{TORCHSCRIPT_PRODUCER_RECORD}", record)
    except zipfile.BadZipFile:
        raise ExportError(f"{path} is not a PT2 archive (not a zip file)") from None


def package_metadata(path: Path) -> dict[str, str]:
    """The compiled model's metadata (``AOTI_DEVICE_KEY``, ``AOTI_CPU_ISA``, ...) read from the
    package's ``data/aotinductor/*/*_metadata.json`` records, without loading it.

    Raises:
        ExportError: not a zip file, or no compiled model's metadata in it.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = [
                name
                for name in archive.namelist()
                if "/data/aotinductor/" in name and name.endswith("_metadata.json")
            ]
            for name in names:
                fields = json.loads(archive.read(name).decode())
                if isinstance(fields, dict) and DEVICE_KEY in fields:
                    return {str(key): str(value) for key, value in fields.items()}
    except (zipfile.BadZipFile, OSError):
        raise ExportError(f"{path} is not an AOTInductor package (not a zip file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ExportError(f"{path}: its compiled model's metadata is not JSON") from None
    raise ExportError(f"{path} is not an AOTInductor package (no compiled model's metadata in it)")


def run_aoti(path: Path, batch: Batch, device: str = "cpu", chunk: int = RUN_CHUNK) -> np.ndarray:
    """The AOTInductor package at ``path`` on ``batch`` on ``device`` (``cpu``, ``cuda``): ``B x 1`` float32.

    Raises:
        ExportError: the package does not load here, or the model failed on the rows.
    """
    compiled_for = package_metadata(path).get(DEVICE_KEY)
    if compiled_for != device:
        raise ExportError(f"{path} is compiled for {compiled_for}, not {device}")
    try:
        model = torch._inductor.aoti_load_package(str(path))
    except Exception as exc:  # the loader raises RuntimeError, and torch's pt2 reader others
        raise ExportError(f"aoti_load_package cannot load {path} on {device}: {_first_line(exc)}") from None
    first, second = (spec.name for spec in INPUTS)
    return run_in_chunks(lambda dense, ids: model(**{first: dense, second: ids}), path, batch, device, chunk)
