"""A Python-based Triton backend named ``pytorch``, for the local server: TorchScript models and
AOTInductor packages.

Triton maps ``platform: "pytorch_libtorch"`` to backend ``pytorch``. The wheel's
tritonserver has no LibTorch backend; copied to ``<backend-dir>/pytorch/model.py``
(with ``batched_model.py`` beside it), this file serves those models locally,
and the same config serves unchanged in the NGC container, where the C++
PyTorch backend takes it. It loads ``<default_model_filename>`` (``model.pt``)
with ``torch.jit.load`` onto the CPU for a KIND_CPU instance, or onto
``cuda:<device id>`` for a KIND_GPU one (which needs a CUDA build of torch in
the stub's interpreter), and runs it under ``torch.inference_mode``.

Tensors are matched as the C++ backend (24.xx/25.xx) matches them. Inputs: by the
names of ``forward``'s arguments when every config input is one of them; else
by the ``<name>__<index>`` convention; else in config order. Outputs (a tensor,
or a tuple or list of them): by ``<name>__<index>``, else in config order.

Requests are checked, batched and answered by :class:`batched_model.BatchedModel`
(one bad request never costs the others theirs; NaN/Inf inputs are refused
unless ``allow_non_finite_inputs: "true"``; an output whose dtype is not the
config's is an error, as in the C++ backend).

AOTInductor packages (``platform: "torch_aoti"``, a ``.pt2`` file; the C++ backend's from
26.03) are loaded with ``torch._inductor.aoti_load_package``, on the CPU for a KIND_CPU
instance or on ``cuda:<device id>`` for a KIND_GPU one, and their tensors are matched as the
C++ backend matches them from 26.05 on, by the package's call spec: inputs all ordinal
(``INPUT__<i>``, the i-th tensor of the flattened call) or all forward-based (``ARGS[<i>]``,
``KWARGS[<name>]``); outputs all ordinal (``OUTPUT__<i>``) or forward-based (``RESULT`` for a
single tensor, ``RESULT[<key>]`` for a dict of them). A package runs only under the torch that
compiled it and on its device, so one is refused at load, in one line naming both, when the
producer record the export appends (``<root>/extra/producer.json``, ``{"torch", "device"}``)
names another torch release than this one, or when the device it is compiled for (its
metadata's ``AOTI_DEVICE_KEY``) is not the instance's. The local tritonserver 2.51 itself
refuses ``platform: "torch_aoti"``; the launcher serves it a view of the repository in which
such a model's config names only the backend (``server/repository_view.py``), and the package
is recognised here by its ``.pt2`` file.

Config ``parameters``, as the C++ backend names them (string values):
``INFERENCE_MODE`` (default true; false: ``torch.no_grad``),
``INTRA_OP_THREAD_COUNT`` and ``INTER_OP_THREAD_COUNT`` (0 or absent: torch's default).

This module is loaded by ``triton_python_backend_stub`` inside tritonserver,
not imported by the bundle: ``triton_python_backend_utils`` exists only there.
"""

from __future__ import annotations

import contextlib
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from batched_model import BatchedModel, RequestError, flag_parameter, int_parameter

# The C++ backend's <name>__<index> convention.
_INDEXED = re.compile(r"^.*__(\d+)$")
#: The platform of an AOTInductor package (``bundle.repository.AOTI_PLATFORM``).
AOTI_PLATFORM = "torch_aoti"
#: The file suffix of an AOTInductor package (PT2 archive).
PACKAGE_SUFFIX = ".pt2"
#: The export's producer record in a package, ``<root>/extra/<this>``
#: (``bundle.ngc.TORCHSCRIPT_PRODUCER_RECORD``; the stub cannot import the bundle in every image).
PRODUCER_RECORD = "producer.json"
#: The metadata key of a compiled model that names its device (``cpu`` or ``cuda``).
DEVICE_KEY = "AOTI_DEVICE_KEY"
# The pytorch backend's names for an AOTInductor package's tensors (26.05 and later): ordinal
# prefixes, and the output of a forward that returns one tensor (RESULT[<key>] for a dict).
_ORDINAL_INPUT, _ORDINAL_OUTPUT = "INPUT__", "OUTPUT__"
_RESULT = "RESULT"


def _indices(names: list[str]) -> list[int] | None:
    """The ``<index>`` of every ``<name>__<index>``; None unless all names follow the convention."""
    found = [_INDEXED.match(name) for name in names]
    if not all(found):
        return None
    return [int(match.group(1)) for match in found if match is not None]


def _device(args: dict[str, str]) -> torch.device:
    """The CPU for a KIND_CPU instance; ``cuda:<device id>`` for a KIND_GPU one, where torch has CUDA."""
    if args.get("model_instance_kind", "CPU") != "GPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise pb_utils.TritonModelException(
            f"model '{args['model_name']}': a KIND_GPU instance needs torch with CUDA; "
            f"torch {torch.__version__} here sees no CUDA device"
        )
    return torch.device("cuda", int(args.get("model_instance_device_id", "0")))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _release(version: str) -> str:
    """A torch version without its local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


def read_package(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The producer record of the AOTInductor package at ``path`` (None when it has none: a package
    the export did not write) and the device its model is compiled for, read without loading it.

    Raises:
        ValueError: not a PT2 archive, no compiled model in it, or a record that does not parse or
            names no torch.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if not any(name.endswith("/archive_format") for name in names):
                raise ValueError(f"{path} is not a PT2 archive (no archive_format record)")
            record = None
            found = [n for n in names if n.count("/") == 2 and n.endswith(f"/extra/{PRODUCER_RECORD}")]
            if found:
                record = json.loads(archive.read(found[0]).decode())
                if not isinstance(record, dict) or not record.get("torch"):
                    raise ValueError(f"{path}: its producer record names no torch ({record!r})")
            for name in names:
                if "/data/aotinductor/" in name and name.endswith("_metadata.json"):
                    metadata = json.loads(archive.read(name).decode())
                    if isinstance(metadata, dict) and DEVICE_KEY in metadata:
                        return record, str(metadata[DEVICE_KEY])
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not a PT2 archive (not a zip file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{path}: a JSON record in it does not parse") from None
    raise ValueError(f"{path} holds no AOTInductor model (no {DEVICE_KEY} in its metadata)")


def call_names(call_spec: list[str]) -> tuple[list[str | None], list[str | None]]:
    """The forward-based name of each flattened input and output of a package, from its call spec.

    Inputs: ``ARGS[<i>]`` and ``KWARGS[<name>]``, in the order the package takes them flattened
    (positional first, then keywords in the spec's order); outputs: ``RESULT`` for a single
    tensor, ``RESULT[<key>]`` for each tensor of a dict. A tensor nested deeper has no such name
    (None): only the ordinal names reach it.
    """
    from torch.utils import _pytree as pytree

    def children(spec: Any) -> list[Any]:
        # TreeSpec.children() is the newer torch's; children_specs the older's (deprecated since).
        return list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)

    inputs: list[str | None] = []
    spec = pytree.treespec_loads(call_spec[0])
    args, kwargs = children(spec) if spec.num_children == 2 else (spec, None)
    for index, child in enumerate(children(args)):
        inputs.extend([f"ARGS[{index}]"] if child.is_leaf() else [None] * child.num_leaves)
    if kwargs is not None:
        for key, child in zip(kwargs.context or [], children(kwargs), strict=True):
            inputs.extend([f"KWARGS[{key}]"] if child.is_leaf() else [None] * child.num_leaves)
    out = pytree.treespec_loads(call_spec[1])
    if out.is_leaf():
        return inputs, [_RESULT]
    if out.type is dict:
        outputs: list[str | None] = []
        for key, child in zip(out.context or [], children(out), strict=True):
            outputs.extend([f"{_RESULT}[{key}]"] if child.is_leaf() else [None] * child.num_leaves)
        return inputs, outputs
    return inputs, [None] * out.num_leaves


def match_names(config: list[str], package: list[str | None], ordinal: str, what: str) -> list[int]:
    """The flattened position of each config tensor name among the package's ``what`` (inputs or outputs).

    Args:
        config: the config's names, in config order.
        package: the package's forward-based names (:func:`call_names`), in flattened order.
        ordinal: the ordinal names' prefix (``INPUT__`` or ``OUTPUT__``).
        what: ``inputs`` or ``outputs``, for messages.

    Raises:
        ValueError: the names follow neither convention, name a tensor the package does not have,
            or (inputs) leave one of the package's out.
    """
    indices = [re.fullmatch(rf"{ordinal}(\d+)", name) for name in config]
    if all(indices):
        positions = [int(match.group(1)) for match in indices if match is not None]
        if max(positions, default=-1) >= len(package) or len(set(positions)) != len(positions):
            raise ValueError(
                f"config.pbtxt's {what} {config} do not name distinct ones of the package's {len(package)}"
            )
    else:
        known = {name: position for position, name in enumerate(package) if name is not None}
        missing = [name for name in config if name not in known]
        if missing:
            raise ValueError(
                f"config.pbtxt names {what} {missing} that the package's call spec does not have (it has "
                f"{[name for name in package if name is not None]}, or {ordinal}<i> by position)"
            )
        positions = [known[name] for name in config]
    if what == "inputs" and sorted(positions) != list(range(len(package))):
        raise ValueError(f"config.pbtxt has {len(config)} inputs {config}; the package takes {len(package)}")
    return positions


class TritonPythonModel(BatchedModel):
    """Runs one TorchScript model with torch for one Triton model instance."""

    BACKEND = "pytorch"
    DEFAULT_FILE = "model.pt"

    def _load(self, path: Path, args: dict[str, str], parameters: dict[str, Any]) -> str:
        """Load the TorchScript file or the AOTInductor package at ``path`` onto the instance's device
        and match its tensors."""
        self._device = _device(args)
        self._package: Any = None
        threads = int_parameter(parameters, "INTRA_OP_THREAD_COUNT")
        if threads:
            torch.set_num_threads(threads)
        interop = int_parameter(parameters, "INTER_OP_THREAD_COUNT")
        if interop:
            with contextlib.suppress(RuntimeError):  # only before the first parallel work of the process
                torch.set_num_interop_threads(interop)
        self._inference_mode = flag_parameter(parameters, "INFERENCE_MODE", default=True)
        platform = json.loads(args["model_config"]).get("platform", "")
        if platform == AOTI_PLATFORM or path.suffix == PACKAGE_SUFFIX:
            return self._load_package(path)
        try:
            self._module = torch.jit.load(str(path), map_location=self._device).eval()
        except (RuntimeError, ValueError) as exc:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': torch.jit.load could not load {path} (a TorchScript file is "
                f"expected): {_first_line(exc)}"
            ) from None
        self._feed_order = self._match_inputs()
        names = [spec.name for spec in self._outputs]
        self._output_index = _indices(names) or list(range(len(names)))
        return (
            f"on {self._device}, forward{tuple(self._feed_order)}, "
            f"threads={torch.get_num_threads()}, inference_mode={self._inference_mode}"
        )

    def _load_package(self, path: Path) -> str:
        """Load the AOTInductor package at ``path`` once its torch and device are this instance's,
        and match the config's tensor names to its call spec."""
        prefix = f"model '{self._name}': {path}"
        try:
            record, device = read_package(path)
        except ValueError as exc:
            raise pb_utils.TritonModelException(f"model '{self._name}': {exc}") from None
        compiled_by = None if record is None else str(record.get("torch", ""))
        if compiled_by is not None and _release(compiled_by) != _release(torch.__version__):
            raise pb_utils.TritonModelException(
                f"{prefix} was compiled by torch {compiled_by}, and this server's torch is "
                f"{torch.__version__}: a package loads only under the torch that compiled it; export it "
                "again with this torch"
            )
        if device != self._device.type:
            kind = "KIND_GPU" if self._device.type == "cuda" else "KIND_CPU"
            raise pb_utils.TritonModelException(
                f"{prefix} is compiled for {device}, but its instance is {kind} ({self._device}): "
                f"compile it for {self._device.type} (a gpu-profile export on a machine with a GPU compiles "
                "for cuda, a cpu-profile export for cpu)"
            )
        if compiled_by is None:
            pb_utils.Logger.log_warn(
                f"{prefix} has no producer record ({PRODUCER_RECORD}): the torch that compiled it is "
                f"unknown, and it loads only under that one (this is {torch.__version__})"
            )
        index = self._device.index if self._device.type == "cuda" and self._device.index is not None else -1
        try:
            self._package = torch._inductor.aoti_load_package(str(path), device_index=index)
            inputs, outputs = call_names(self._package.loader.get_call_spec())
        except Exception as exc:  # the loader raises RuntimeError, torch's PT2 reader others
            raise pb_utils.TritonModelException(
                f"{prefix}: aoti_load_package could not load it (an AOTInductor package is expected): "
                f"{_first_line(exc)}"
            ) from None
        try:
            input_positions = match_names(
                [spec.name for spec in self._inputs], inputs, _ORDINAL_INPUT, "inputs"
            )
            self._output_index = match_names(
                [spec.name for spec in self._outputs], outputs, _ORDINAL_OUTPUT, "outputs"
            )
        except ValueError as exc:
            self._package = None  # its loader removes the files it unpacked
            raise pb_utils.TritonModelException(f"model '{self._name}': {exc}") from None
        order = sorted(zip(input_positions, (spec.name for spec in self._inputs), strict=True))
        self._feed_order = [name for _, name in order]
        compiler = "an unknown torch" if compiled_by is None else f"torch {compiled_by}"
        return f"on {self._device} (AOTInductor package compiled by {compiler})"

    def _match_inputs(self) -> list[str]:
        """The config's input names in the order ``forward`` takes them."""
        arguments = [argument.name for argument in self._module.forward.schema.arguments][1:]
        names = [spec.name for spec in self._inputs]
        if len(arguments) != len(names):
            raise pb_utils.TritonModelException(
                f"model '{self._name}': config.pbtxt has {len(names)} inputs {names}, but the "
                f"TorchScript forward takes {len(arguments)} {arguments}"
            )
        if set(names) == set(arguments):
            return arguments
        indices = _indices(names)
        if indices is not None and sorted(indices) == list(range(len(names))):
            return [name for _, name in sorted(zip(indices, names, strict=True))]
        return names

    def _infer(self, feeds: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        """Run the module on ``feeds`` on the instance's device; outputs in config order.

        Raises:
            RequestError: torch failed, or the module gave fewer outputs than the config names.
        """
        tensors = []
        for name in self._feed_order:
            array = feeds[name]
            # pb_utils hands out read-only views; torch wants memory it may write to.
            array = array if array.flags.writeable else array.copy()
            tensors.append(torch.from_numpy(array).to(self._device))
        mode = torch.inference_mode() if self._inference_mode else torch.no_grad()
        if self._package is not None:
            return self._run_package(tensors, mode)
        try:
            with mode:
                result = self._module(*tensors)
        except RuntimeError as exc:
            raise RequestError(
                f"pytorch failed on model '{self._name}': {_first_line(exc)}", invalid_argument=False
            ) from None
        results = [result] if isinstance(result, torch.Tensor) else list(result)
        if max(self._output_index) >= len(results):
            raise RequestError(
                f"model '{self._name}' returned {len(results)} output(s); config.pbtxt names "
                f"{[spec.name for spec in self._outputs]}",
                invalid_argument=False,
            )
        return [results[index].detach().cpu().numpy() for index in self._output_index]

    def _run_package(self, tensors: list[torch.Tensor], mode: Any) -> list[Any]:
        """The package on its flattened inputs; outputs in config order.

        Raises:
            RequestError: the package failed (a batch outside its range, ...).
        """
        try:
            with mode:
                results = self._package.loader.run(tensors)
        except RuntimeError as exc:
            raise RequestError(
                f"pytorch failed on model '{self._name}': {_first_line(exc)}", invalid_argument=False
            ) from None
        return [results[index].detach().cpu().numpy() for index in self._output_index]

    def finalize(self) -> None:
        """Release the module or package (and its device memory) when the model unloads."""
        self._module = None
        self._package = None
