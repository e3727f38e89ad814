"""Building one inference request and reading its answer, for either protocol.

The same for the sync and the asyncio clients: tritonclient's ``InferInput``
and ``InferRequestedOutput`` classes are shared by ``tritonclient.http`` and
``tritonclient.http.aio`` (and likewise for gRPC); only the call differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from bundle.errors import ClientError
from bundle.schema import OUTPUT, OUTPUTS
from clients.shm import Slice, SystemRegion, layout
from clients.validation import ModelSpec, TensorMeta, triton_dtype


def schema_output() -> TensorMeta:
    """The contract's output (``B x 1`` FP32), for requests sent without the server's metadata."""
    spec = next(s for s in OUTPUTS if s.name == OUTPUT)
    return TensorMeta(spec.name, spec.triton_dtype, (-1, *spec.shape))


def unchecked_inputs(inputs: Mapping[str, np.ndarray]) -> tuple[list[tuple[TensorMeta, np.ndarray]], int]:
    """The inputs as given (no metadata check), in the form :meth:`ModelSpec.validate` returns."""
    pairs = []
    for name, value in inputs.items():
        array = np.ascontiguousarray(value)
        pairs.append((TensorMeta(name, triton_dtype(array.dtype), tuple(array.shape)), array))
    rows = int(pairs[0][1].shape[0]) if pairs and pairs[0][1].ndim else 1
    return pairs, rows


@dataclass
class Prepared:
    """One request, ready to send.

    Attributes:
        model: model name.
        version: model version ("" for the server's choice).
        inputs: tritonclient ``InferInput`` objects.
        outputs: tritonclient ``InferRequestedOutput`` objects.
        rows: batch size ``B``.
        output: the output read back from the answer.
        region: the shared-memory region holding this request, if any.
        output_slice: where the output lands in ``region``.
    """

    model: str
    version: str
    inputs: list[Any]
    outputs: list[Any]
    rows: int
    output: TensorMeta
    region: SystemRegion | None = None
    output_slice: Slice | None = None


def build(
    module: ModuleType,
    protocol: str,
    model: str,
    version: str,
    pairs: list[tuple[TensorMeta, np.ndarray]],
    rows: int,
    output: TensorMeta,
) -> Prepared:
    """A request whose tensors travel in the message (binary, for HTTP too).

    Args:
        module: ``tritonclient.http`` or ``tritonclient.grpc`` (or an ``.aio`` form).
        protocol: ``http`` or ``grpc``.
        model: model name.
        version: model version.
        pairs: (tensor, C-contiguous array) per input, in the model's order.
        rows: batch size ``B``.
        output: the output to request.
    """
    tensors = []
    for tensor, array in pairs:
        infer_input = module.InferInput(tensor.name, list(array.shape), tensor.datatype)
        if protocol == "http":
            infer_input.set_data_from_numpy(array, binary_data=True)
        else:
            infer_input.set_data_from_numpy(array)
        tensors.append(infer_input)
    if protocol == "http":
        requested = module.InferRequestedOutput(output.name, binary_data=True)
    else:
        requested = module.InferRequestedOutput(output.name)
    return Prepared(model, version, tensors, [requested], rows, output)


def shm_layout(pairs: list[tuple[TensorMeta, np.ndarray]], output: TensorMeta, rows: int) -> list[Slice]:
    """Where this request's inputs and output lie in a region (see :func:`clients.shm.layout`).

    Raises:
        ClientError: an input is BYTES (its size varies by row; see :meth:`TensorMeta.row_bytes`).
    """
    for tensor, _ in pairs:
        if tensor.datatype == "BYTES":
            tensor.row_bytes()
    return layout([(t, a.shape) for t, a in pairs], output, rows)


def build_shm(
    module: ModuleType,
    model: str,
    version: str,
    pairs: list[tuple[TensorMeta, np.ndarray]],
    rows: int,
    output: TensorMeta,
    region: SystemRegion,
    slices: list[Slice],
) -> Prepared:
    """A request whose inputs and output live in ``region`` (registered with the server).

    Copies each input into the region at its slice of :func:`shm_layout`; the
    request carries only names, offsets and sizes.
    """
    tensors = []
    for (tensor, array), where in zip(pairs, slices, strict=False):
        region.write(array, where.offset)
        infer_input = module.InferInput(tensor.name, list(array.shape), tensor.datatype)
        infer_input.set_shared_memory(region.name, where.nbytes, where.offset)
        tensors.append(infer_input)
    out = slices[-1]
    requested = module.InferRequestedOutput(output.name)
    requested.set_shared_memory(region.name, out.nbytes, out.offset)
    return Prepared(model, version, tensors, [requested], rows, output, region, out)


def build_named(
    module: ModuleType,
    protocol: str,
    model: str,
    version: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
) -> Prepared:
    """A request of ``inputs`` as given (each with its own shape), asking for each of ``outputs``
    (a model of several outputs: a DLRMv3 model's one per task); :func:`decode_named` reads them."""
    pairs, rows = unchecked_inputs(inputs)
    prepared = build(module, protocol, model, version, pairs, rows, TensorMeta(outputs[0], "FP32", (-1,)))
    if protocol == "http":
        prepared.outputs = [module.InferRequestedOutput(name, binary_data=True) for name in outputs]
    else:
        prepared.outputs = [module.InferRequestedOutput(name) for name in outputs]
    return prepared


def decode_named(result: Any, outputs: Sequence[str], where: str) -> dict[str, np.ndarray]:
    """Each of ``outputs`` of an answer, by name.

    Raises:
        ClientError: the answer lacks one (``where`` says whose).
    """
    answers = {}
    for name in outputs:
        answer = result.as_numpy(name)
        if answer is None:
            raise ClientError(f"{where}: the answer holds no output {name!r}")
        answers[name] = np.asarray(answer)
    return answers


def decode(prepared: Prepared, result: Any) -> np.ndarray:
    """The output of an answer: ``B x output.row_shape`` of the output's dtype.

    Raises:
        ClientError: the answer lacks the output or it has the wrong shape or dtype.
    """
    name = prepared.output.name
    if prepared.region is not None and prepared.output_slice is not None:
        described = result.get_output(name)
        if described is None:
            raise ClientError(f"model {prepared.model!r}: the response holds no {name!r}")
        where = prepared.output_slice
        array = prepared.region.read(prepared.output.numpy_dtype, where.shape, where.offset)
    else:
        try:
            value = result.as_numpy(name)
        except ValueError as exc:  # tritonclient reshapes the bytes it got to the shape it was told
            raise ClientError(
                f"model {prepared.model!r}: output {name!r} came back malformed or empty ({exc}); "
                "a python-backend server whose stub runs numpy 2 answers this way: install numpy<2 there"
            ) from None
        if value is None:
            raise ClientError(f"model {prepared.model!r}: the response holds no {name!r}")
        array = np.asarray(value)
    expected_rows = prepared.rows if prepared.output.shape[:1] == (-1,) else None
    if expected_rows is not None and (array.ndim == 0 or array.shape[0] != expected_rows):
        raise ClientError(
            f"model {prepared.model!r}: output {name!r} has shape {list(array.shape)} "
            f"for a batch of {expected_rows}"
        )
    if array.dtype != prepared.output.numpy_dtype:
        raise ClientError(
            f"model {prepared.model!r}: output {name!r} has dtype {array.dtype}, "
            f"expected {prepared.output.datatype}"
        )
    return array


def output_for(spec: ModelSpec | None) -> TensorMeta:
    """The output to request: from the model's metadata, or the contract's when unchecked."""
    return schema_output() if spec is None else spec.output(OUTPUT)
