"""Shared-memory regions that carry a request's tensors instead of the message.

With ``system`` shared memory the client writes the inputs into a POSIX
shared-memory segment, registers it with tritonserver (which must run on the
same host), and the request only names regions and offsets; the server writes
the output into the same segment. One :class:`SystemRegion` holds one request:
its inputs, then its output, back to back::

    | input 0: B x row_0 | input 1: B x row_1 | ... | output: B x row_out |

Registering and unregistering are calls to the server, so they live in the
clients (:mod:`clients.triton`, :mod:`clients.aio`); this module owns the
local segment. CUDA shared memory needs the gpu profile (a GPU and the
``cuda-python`` bindings), which this bundle does not have: asking for it
raises :func:`cuda_unavailable`.
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bundle.errors import ClientError
from clients import failures
from clients.validation import TensorMeta

_counter = itertools.count()


def cuda_unavailable() -> ClientError:
    """The error for ``--shared-memory cuda`` on this bundle."""
    return ClientError(
        "CUDA shared memory needs the gpu profile and a GPU (and the cuda-python bindings); "
        "use --shared-memory system or none"
    )


def registration_error(error: ClientError) -> ClientError:
    """What a failed registration raises, given the call's ``error`` (whose cause is tritonserver's).

    ``error`` itself when the server could not be reached (it says so already);
    else ``error`` with the reason added: the admin key, when the server
    restricts its shared-memory API; otherwise that system shared memory needs
    tritonserver on this host.
    """
    cause = error.__cause__
    if cause is not None and failures.is_restricted(cause):
        return ClientError(
            f"{error} (this server restricts shared-memory registration to its admin key: "
            "pass --admin-key or set TRITON_ADMIN_KEY, or drop --shared-memory)"
        )
    if cause is not None and failures.is_transport_failure(cause):
        return error
    return ClientError(f"{error} (system shared memory needs tritonserver on this host)")


def region_name() -> str:
    """A name no other client of the same server uses (process id + random part + counter)."""
    return f"ctr_{os.getpid()}_{uuid.uuid4().hex[:8]}_{next(_counter)}"


@dataclass(frozen=True)
class Slice:
    """Where one tensor lies in a region.

    Attributes:
        tensor: the tensor.
        shape: its full shape in this request (``B x row_shape``).
        offset: first byte in the region.
        nbytes: its size in bytes.
    """

    tensor: TensorMeta
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def layout(
    inputs: Sequence[tuple[TensorMeta, tuple[int, ...]]], output: TensorMeta, rows: int
) -> list[Slice]:
    """Place the inputs, then the output, back to back.

    Args:
        inputs: each input with its shape in this request.
        output: the output; ``rows x output.row_shape``.
        rows: the batch size ``B``.

    Returns:
        One slice per input, then the output's slice.
    """
    # math.prod, not np.prod: this runs per request, and numpy's reduction costs microseconds.
    slices = []
    offset = 0
    for tensor, shape in inputs:
        nbytes = math.prod(shape) * tensor.numpy_dtype.itemsize
        slices.append(Slice(tensor, tuple(shape), offset, nbytes))
        offset += nbytes
    out_shape = (rows, *output.row_shape)
    out_bytes = math.prod(out_shape) * output.numpy_dtype.itemsize
    slices.append(Slice(output, out_shape, offset, out_bytes))
    return slices


def region_bytes(slices: Sequence[Slice]) -> int:
    """Bytes a region needs to hold every slice of a :func:`layout`."""
    return max(where.offset + where.nbytes for where in slices)


class SystemRegion:
    """One POSIX shared-memory segment of this process (``/dev/shm/<name>``).

    Args:
        byte_size: the segment's size.
        name: Triton's name of the region (also the segment's key, with a leading ``/``);
            a fresh unique one when omitted.

    Raises:
        ClientError: the segment could not be created.
    """

    def __init__(self, byte_size: int, name: str | None = None) -> None:
        import tritonclient.utils.shared_memory as shm

        if byte_size <= 0:
            raise ClientError(f"a shared-memory region needs a positive size, got {byte_size}")
        self._shm = shm
        self.name = name or region_name()
        self.key = f"/{self.name}"
        self.byte_size = int(byte_size)
        try:
            self._handle: Any = shm.create_shared_memory_region(
                self.name, self.key, self.byte_size, create_only=True
            )
        except shm.SharedMemoryException as exc:
            raise ClientError(
                f"cannot create shared memory {self.key} of {self.byte_size} bytes: {exc.__cause__ or exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"SystemRegion({self.key!r}, {self.byte_size} bytes)"

    def write(self, array: np.ndarray, offset: int) -> None:
        """Copy ``array`` (C-contiguous) into the region at byte ``offset``."""
        if offset + array.nbytes > self.byte_size:
            raise ClientError(f"{self}: {array.nbytes} bytes at offset {offset} do not fit")
        self._shm.set_shared_memory_region(self._handle, [array], offset=offset)

    def read(self, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int) -> np.ndarray:
        """A copy of the array of ``dtype`` and ``shape`` at byte ``offset``.

        A copy, not a view: a view would keep the segment mapped (and the
        region could not be destroyed while it lives).
        """
        view = self._shm.get_contents_as_numpy(self._handle, dtype, list(shape), offset)
        result = np.array(view, copy=True)
        del view
        return result

    def destroy(self) -> None:
        """Unmap and unlink the segment (after the server has unregistered it)."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            self._shm.destroy_shared_memory_region(handle)
        except self._shm.SharedMemoryException as exc:
            raise ClientError(f"cannot destroy shared memory {self.key}: {exc.__cause__ or exc}") from exc

    @property
    def destroyed(self) -> bool:
        """Whether :meth:`destroy` has run."""
        return self._handle is None


def mapped_regions() -> list[str]:
    """Keys of the segments this process still has mapped (for leak checks)."""
    import tritonclient.utils.shared_memory as shm

    return list(shm.mapped_shared_memory_regions())
