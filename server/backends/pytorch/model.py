"""A Python-based Triton backend named ``pytorch``, for the local server: TorchScript models.

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

Config ``parameters``, as the C++ backend names them (string values):
``INFERENCE_MODE`` (default true; false: ``torch.no_grad``),
``INTRA_OP_THREAD_COUNT`` and ``INTER_OP_THREAD_COUNT`` (0 or absent: torch's default).

This module is loaded by ``triton_python_backend_stub`` inside tritonserver,
not imported by the bundle: ``triton_python_backend_utils`` exists only there.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from batched_model import BatchedModel, RequestError, flag_parameter, int_parameter

# The C++ backend's <name>__<index> convention.
_INDEXED = re.compile(r"^.*__(\d+)$")


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


class TritonPythonModel(BatchedModel):
    """Runs one TorchScript model with torch for one Triton model instance."""

    BACKEND = "pytorch"
    DEFAULT_FILE = "model.pt"

    def _load(self, path: Path, args: dict[str, str], parameters: dict[str, Any]) -> str:
        """Load the TorchScript file at ``path`` onto the instance's device and match its tensors."""
        self._device = _device(args)
        threads = int_parameter(parameters, "INTRA_OP_THREAD_COUNT")
        if threads:
            torch.set_num_threads(threads)
        interop = int_parameter(parameters, "INTER_OP_THREAD_COUNT")
        if interop:
            with contextlib.suppress(RuntimeError):  # only before the first parallel work of the process
                torch.set_num_interop_threads(interop)
        self._inference_mode = flag_parameter(parameters, "INFERENCE_MODE", default=True)
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

    def finalize(self) -> None:
        """Release the module (and its device memory) when the model unloads."""
        self._module = None
