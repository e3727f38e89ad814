"""A seeded fuzz over the wire of every stage served: random requests in every form the protocols take.

Each stage gets :data:`CASES` random requests, each in one of three forms: raw HTTP with a JSON
body, raw HTTP with binary tensors, raw gRPC (``ModelInferRequest`` with ``raw_input_contents``, or
typed ``contents``). The stages, as the export writes them: the raw-row stage (``criteo_rows``,
backend ``raw_rows``) and the embedding stage (``dlrm_embedding``, backend ``embedding``); the
module skips where ``make stages`` did not build them. A request is drawn as

- content: rows (random, mutated, random bytes, NULs, invalid UTF-8, overlong, empty, line ends
  inside and after, a large batch) or ids (in range, negative, ``INT64_MIN``/``INT64_MAX``, random);
- or damaged: another data type (every Triton type, BF16 and BYTES among them, and unknown names),
  another shape (rank 0 to 3, zero and negative dims, huge dims with short data), a missing, extra,
  unknown or repeated input, an unknown output, a ``binary_data_size`` or header length that is not
  the data's, a truncated body or BYTES element, garbage.

What each must get:

- a request the stage can take gets the answer of the stage's in-process reference, exactly (raw
  rows: :func:`criteo.rows.request_inputs`, the dense features within 4 ULP where numpy's float32
  ``log1p`` is not libm's; ids: :class:`export.stage.hot_cold_lookup.HotColdLookup`; see
  :mod:`tests.native_stages`), or the reference's error text;
- any other request its own error: HTTP 400, or 500 where tritonserver could not parse the body
  (its parser's message, as ``test_fuzz.py`` pins), or gRPC INVALID_ARGUMENT; always with a message;
  never a dropped connection, no answer within :data:`TIMEOUT_S`, or a crash;
- a good request after every :data:`GOOD_EVERY` cases is answered exactly; at the end the server
  is live and ready, the stage ready, and tritonserver the same process.

tritonserver 2.51's own behaviour, pinned here:

- a batch dimension is read as its low 32 bits: ``[2**32 + k, 1]`` with ``k`` rows is answered as
  ``k`` rows, and ``[2**32, 1]`` (batch 0) reaches the stage as the shape ``[1]``;
- a gRPC request with more ``raw_input_contents`` than inputs is answered: the extra ones are ignored;
- a JSON string is not checked to be UTF-8: the stage receives its bytes as they are;
- a last BYTES element longer than the data passes its check: the stage refuses it
  ("incomplete string data ...", the words of tritonserver's python backend, kept);
- a shape whose byte size passes 2**64 wraps in its check: ``[2**61 * j + k, 26]`` int64 with ``k``
  rows of data (``[2**62, 26]`` with none) reaches the embedding stage, which refuses it (the
  python stage's stub died on it);
- an error longer than 16 KiB outgrows a gRPC client's default metadata limit, which drops it: a
  refused row's error therefore quotes a long field by its head and its length
  (:func:`test_an_overlong_rows_error_reaches_a_grpc_client`);
- its HTTP frontend allocates the bytes a JSON input of a fixed-size type declares before it checks
  anything, and aborts on ``std::bad_alloc`` (:func:`test_a_json_input_declaring_terabytes_is_refused`,
  an expected failure): a JSON body here declares at most :data:`JSON_DECLARED_BYTES`.

Reproducing a case: the failure message names the seed, the stage and the case's number; the case
is ``_draw(stage.family, lookup, rng)`` and its wire ``_wire(case, rng)``, with ``rng`` from
``np.random.default_rng([SEED, stage_index, number])`` (an interleaved good request is drawn next).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bundle.repository import version_dir
from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    RAW_ROWS_INPUT,
)
from export.raw_rows import STAGE_MODEL, write_stage
from export.stage.hot_cold_lookup import COLD_READ_FAULT, HotColdLookup
from export.tables.ensemble import HOT_SET_FILE, embedding_model_name, write_embedding_stage
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays
from server import LocalServer
from server.installation import COMPILED_STAGES
from tests.native_stages import LOG1P_IS_LIBMS, Arrays, ids_reference, rows_reference

LIBRARIES = ("raw_rows/libtriton_raw_rows.so", "embedding/libtriton_embedding.so")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not all((COMPILED_STAGES / library).is_file() for library in LIBRARIES),
        reason=f"the compiled stages are not built (in {COMPILED_STAGES}): run `make stages`",
    ),
]
logger = logging.getLogger(__name__)

SEED = 20261127
#: Random requests per stage (a good one follows every GOOD_EVERY of them).
CASES = 150
GOOD_EVERY = 5
#: Seconds a request may take before it counts as unanswered.
TIMEOUT_S = 10.0
#: The most bytes a JSON input of a fixed-size type declares (see the module: tritonserver 2.51
#: allocates them before checking anything).
JSON_DECLARED_BYTES = 1 << 24

FAMILY = "dlrm"
WIDTH = 4
#: 26 tables of 3 .. 53 rows.
TABLE_SIZES = tuple(3 + 2 * t for t in range(NUM_CATEGORICAL))
INT64 = np.iinfo(np.int64)
#: Every Triton data type, with its element size (0: BYTES).
DATATYPES = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
    "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2, "BYTES": 0,
}  # fmt: skip
#: Names that are no Triton data type.
UNKNOWN_DATATYPES = ("FP99", "", "bytes", "int64")
#: The messages of tritonserver 2.51's HTTP frontend when it cannot parse a body: HTTP 500.
HTTP_PARSE_ERRORS = ("failed to parse the request JSON buffer", "Unable to parse")
OUTPUT_DTYPES: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8")}


@dataclass(frozen=True)
class Stage:
    """One stage served: its model name, and its ``family``: ``rows`` (Criteo rows in, model inputs
    out) or ``embedding`` (ids in, placement out)."""

    model: str
    family: str


ROWS = Stage(STAGE_MODEL, "rows")
EMBEDDING = Stage(embedding_model_name(FAMILY), "embedding")
STAGES = {"raw_rows": ROWS, "embedding": EMBEDDING}


# ------------------------------------------------------------------------------ the repository
def _write_embedding_stage(repository: Path, root: Path) -> None:
    """The embedding stage over a tiny store inside its model folder."""
    rng = np.random.default_rng(SEED)
    tables = [rng.normal(0, 0.5, (size, WIDTH)).astype(np.float32) for size in TABLE_SIZES]
    hot_ids = tuple(rng.permutation(size)[: max(1, size // 3)].astype(np.int64) for size in TABLE_SIZES)
    store_dir = repository / EMBEDDING.model / "rows"
    write_arrays(store_dir, RowStoreSpec.for_dlrm(TABLE_SIZES, WIDTH), tables)
    hot_set = HotSet(
        table_sizes=TABLE_SIZES,
        row_bytes=(WIDTH * 4,) * NUM_CATEGORICAL,
        budget_bytes=10**6,
        ids=hot_ids,
        counts=tuple(np.ones(ids.size, dtype=np.int64) for ids in hot_ids),
        profiled_lookups=sum(ids.size for ids in hot_ids),
    )
    write_embedding_stage(repository, FAMILY, store_dir, hot_set.save(root / "hot.npz"), TABLE_SIZES, WIDTH)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stage-fuzz")
    repository = root / "model_repository"
    write_stage(repository)
    _write_embedding_stage(repository, root)
    return repository


@pytest.fixture(scope="module")
def server(start_triton: Callable[..., LocalServer], repository: Path) -> LocalServer:
    """Explicit model control: the embedding stage is loaded by its own test, so that a load that
    fails costs that test alone."""
    return start_triton(
        repository, model_control_mode="explicit", load_models=[ROWS.model], on_dead_model="stop"
    )


@pytest.fixture(scope="module")
def lookup(repository: Path) -> Iterator[HotColdLookup]:
    """The embedding stage's reference, in process, over the stage's own files."""
    folder = version_dir(repository, EMBEDDING.model, 1)
    opened = HotColdLookup.open(
        repository / EMBEDDING.model / "rows",
        folder / HOT_SET_FILE,
        TABLE_SIZES,
        cold_reads=COLD_READ_FAULT,
    )
    yield opened
    opened.close()


# ------------------------------------------------------------------------------ the references
def _chosen(expected: Arrays | str, outputs: tuple[str, ...] | None) -> Arrays | str:
    """The reference's answer, with only the ``outputs`` a request names (None: all)."""
    if isinstance(expected, str) or outputs is None:
        return expected
    return {name: expected[name] for name in outputs}


def _rows_reference(rows: list[bytes], outputs: tuple[str, ...] | None) -> Arrays | str:
    """``B`` rows' tensors (``B x 13`` float32, ``B x 26`` int64), or the error the stage answers."""
    return _chosen(rows_reference(rows), outputs)


def _ids_reference(lookup: HotColdLookup, ids: np.ndarray, outputs: tuple[str, ...] | None) -> Arrays | str:
    """``B x 26`` ids' placement, or the error the stage answers."""
    return _chosen(ids_reference(lookup, ids), outputs)


# ------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class Tensor:
    """One input as sent: ``raw`` is its bytes in a binary HTTP body or gRPC, ``data`` its JSON
    ``data``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes
    data: list[Any]


@dataclass(frozen=True)
class Case:
    """One request as drawn.

    Attributes:
        what: what was drawn (for the failure message).
        transport: ``json``, ``binary`` or ``grpc``.
        inputs, outputs: the tensors and the outputs named (None: none named, all come back).
        expected: the stage's outputs, its error text, or None: any refusal.
        damage: how the transport's form is damaged after it is written ("" for none).
    """

    what: str
    transport: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...] | None
    expected: Arrays | str | None
    damage: str = ""


@dataclass(frozen=True)
class Wire:
    """A request as it goes out: an HTTP body and headers, or a gRPC request (model name unset)."""

    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    grpc: service_pb2.ModelInferRequest | None = None


def _bytes_raw(elements: list[bytes]) -> bytes:
    """BYTES as Triton frames them: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def _rows_tensor(rows: list[bytes], shape: tuple[int, ...] | None = None) -> Tensor:
    # A JSON string carries text: each byte that is not UTF-8 goes as a lone surrogate, which
    # tritonserver writes as its three UTF-8-style bytes (see _json_view).
    data = [row.decode("utf-8", "surrogateescape") for row in rows]
    return Tensor(RAW_ROWS_INPUT, "BYTES", shape or (len(rows), 1), _bytes_raw(rows), data)


def _ids_tensor(ids: np.ndarray, shape: tuple[int, ...] | None = None) -> Tensor:
    raw = np.ascontiguousarray(ids, dtype="<i8").tobytes()
    return Tensor(CATEGORICAL_INPUT, "INT64", shape or tuple(ids.shape), raw, [int(v) for v in ids.ravel()])


def _json_view(rows: list[bytes]) -> list[bytes]:
    """The rows a stage receives when they are sent as JSON strings (see _rows_tensor)."""
    return [row.decode("utf-8", "surrogateescape").encode("utf-8", "surrogatepass") for row in rows]


def _typed_tensor(rng: np.random.Generator, name: str, datatype: str, shape: tuple[int, ...]) -> Tensor:
    """A tensor of ``datatype`` (known or not) holding random values for ``shape``."""
    count = min(math.prod(shape) if min(shape, default=0) >= 0 else 1, 64)
    size = DATATYPES.get(datatype, 2)
    if datatype == "BYTES":
        elements = [rng.bytes(int(rng.integers(0, 8))) for _ in range(count)]
        return Tensor(name, datatype, shape, _bytes_raw(elements), [e.hex() for e in elements])
    raw = rng.bytes(count * size)
    data: list[Any]
    if datatype == "BOOL":
        data = [bool(v) for v in rng.integers(0, 2, count)]
    elif datatype.startswith(("FP", "BF")):
        data = [float(v) for v in rng.normal(0, 1, count).round(3)]
    else:
        data = [int(v) for v in rng.integers(0, 100, count)]
    return Tensor(name, datatype, shape, raw, data)


# ---------------------------------------------------------------------------- drawing content
def _good_row(rng: np.random.Generator) -> bytes:
    """A row by the rules: counts (some missing, negative or 18 digits), ids (some missing, 16 hex
    digits at int64's ends, either case)."""
    counts = [str(int(v)) if rng.random() > 0.1 else "" for v in rng.integers(-10, 10**6, 13)]
    if rng.random() < 0.2:
        counts[int(rng.integers(0, 13))] = str(rng.choice(["999999999999999999", "-999999999999999999", "0"]))
    ids = [format(int(v), "x") if rng.random() > 0.1 else "" for v in rng.integers(0, 2**62, 26)]
    if rng.random() < 0.3:
        edges = ["8000000000000000", "ffffffffffffffff", "7FFFFFFFFFFFFFFF", "0", "aBcDeF"]
        ids[int(rng.integers(0, 26))] = str(rng.choice(edges))
    return "\t".join(counts + ids).encode()


def _spliced(rng: np.random.Generator, row: bytes, piece: bytes) -> bytes:
    where = int(rng.integers(0, len(row) + 1))
    return row[:where] + piece + row[where:]


def _mutated(rng: np.random.Generator, row: bytes) -> bytes:
    """``row`` with a few bytes put in, replaced or taken out (tabs, line ends, NUL, 0xff among them)."""
    for _ in range(int(rng.integers(1, 4))):
        where = int(rng.integers(0, len(row) + 1))
        byte = bytes([int(rng.choice([9, 10, 13, 45, 39, 0, 255, int(rng.integers(0, 256))]))])
        action = int(rng.integers(0, 3))
        tail = row[where + 1 :] if action else row[where:]
        row = row[:where] + (byte if action < 2 else b"") + tail
    return row


def _overlong(rng: np.random.Generator) -> bytes:
    """A row of 64 KiB to 512 KiB: one huge count or id, or far too many fields."""
    size = int(rng.integers(1 << 16, 1 << 19))
    fields = _good_row(rng).split(b"\t")
    choice = int(rng.integers(0, 3))
    if choice == 0:
        fields[int(rng.integers(0, 13))] = b"7" * size
    elif choice == 1:
        fields[13 + int(rng.integers(0, 26))] = b"f" * size
    else:
        fields = fields * (size // 40)
    return b"\t".join(fields)


ROW_KINDS = (
    "good", "good", "good", "line_ends", "mutated", "random_bytes", "nul", "invalid_utf8", "overlong",
    "empty", "line_break", "big_batch",
)  # fmt: skip


def _draw_rows(rng: np.random.Generator, kind: str) -> list[bytes]:
    count = int(rng.integers(1000, 3000)) if kind == "big_batch" else int(rng.integers(1, 9))
    rows = [_good_row(rng) for _ in range(count)]
    pick = int(rng.integers(0, count))
    if kind == "line_ends":
        ends = [b"\n", b"\r\n"]
        rows = [row + ends[int(rng.integers(0, 2))] if rng.random() < 0.7 else row for row in rows]
    elif kind == "mutated":
        rows[pick] = _mutated(rng, rows[pick])
    elif kind == "random_bytes":
        rows[pick] = rng.bytes(int(rng.integers(0, 400)))
    elif kind == "nul":
        rows[pick] = _spliced(rng, rows[pick], b"\0" * int(rng.integers(1, 4)))
    elif kind == "invalid_utf8":
        piece = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"][
            int(rng.integers(0, 5))
        ]
        rows[pick] = _spliced(rng, rows[pick], piece)
    elif kind == "overlong":
        rows[pick] = _overlong(rng)
    elif kind == "empty":
        rows[pick] = b""
    elif kind == "line_break":
        rows[pick] = _spliced(rng, rows[pick], [b"\n", b"\r\n", b"\r"][int(rng.integers(0, 3))])
    return rows


ID_KINDS = ("in_range", "negative", "extremes", "random", "random", "big_batch")


def _draw_ids(rng: np.random.Generator, kind: str) -> np.ndarray:
    count = int(rng.integers(300, 1000)) if kind == "big_batch" else int(rng.integers(1, 17))
    sizes = np.array(TABLE_SIZES)
    if kind == "in_range":
        return rng.integers(0, sizes, (count, NUM_CATEGORICAL), dtype=np.int64)
    if kind == "negative":
        return -rng.integers(1, 10**12, (count, NUM_CATEGORICAL), dtype=np.int64)
    ids = rng.integers(INT64.min, INT64.max, (count, NUM_CATEGORICAL), dtype=np.int64, endpoint=True)
    if kind == "extremes":
        mask = rng.random(ids.shape) < 0.5
        ids[mask] = rng.choice(
            np.array([INT64.min, INT64.max, -1, 0, INT64.min + 1, INT64.max - 1]), mask.sum()
        )
    return ids


# ---------------------------------------------------------------------------- drawing damage
def _shape_damage(rng: np.random.Generator, family: str, count: int) -> tuple[tuple[int, ...], str]:
    """A wrong shape for ``count`` rows of data, and what becomes of it: ``refused``, ``answered``
    (its batch dimension's low 32 bits are ``count``), ``wraps`` (its byte size wraps to the
    data's) or ``empty`` (sent with no data: the stage's own error)."""
    if family == "rows":
        shapes: list[tuple[tuple[int, ...], str]] = [
            ((), "refused"), ((count,), "refused"), ((count, 1, 1), "refused"), ((1, count, 1), "refused"),
            ((count, 2), "refused"), ((0, 1), "refused"), ((count, 0), "refused"), ((-1, 1), "refused"),
            ((count, -1), "refused"), ((2**40, 1), "refused"), ((65537, 1), "refused"),
            ((2**31, 1), "refused"), ((2**63 - 1, 1), "refused"), ((2**62, 1), "refused"),
            ((2**32, 1), "refused"), ((2**32 + count, 1), "answered"),
        ]  # fmt: skip
    else:
        width = NUM_CATEGORICAL
        shapes = [
            ((), "refused"), ((count * width,), "refused"), ((count, width - 1), "refused"),
            ((count, width + 1), "refused"), ((count, width, 1), "refused"), ((1, count, width), "refused"),
            ((count, 0), "refused"), ((-1, width), "refused"), ((count, -width), "refused"),
            ((2**40, width), "refused"), ((2**63 - 1, width), "refused"), ((2**31, width), "refused"),
            ((2**61 * int(rng.integers(1, 4)) + count, width), "wraps"), ((2**62, width), "wraps"),
            ((0, width), "empty"),
        ]  # fmt: skip
    return shapes[int(rng.integers(0, len(shapes)))]


def _json_safe(tensor: Tensor) -> bool:
    """Whether a JSON body may declare this tensor (see :data:`JSON_DECLARED_BYTES`): BYTES, a
    negative dim (refused as it is parsed) or a size within bounds."""
    size = DATATYPES.get(tensor.datatype, 0)
    shape = tensor.shape
    return not size or min(shape, default=0) < 0 or math.prod(shape) * size <= JSON_DECLARED_BYTES


TRANSPORTS = ("json", "binary", "grpc")
DAMAGES = {
    "json": ("truncated", "garbage", "data_count", "data_values", "raw_control_byte"),
    "binary": (
        "size_more", "size_less", "header_long", "header_short", "header_huge", "header_negative",
        "header_zero", "truncated", "extra_bytes", "data_and_binary",
    ),
    "grpc": ("raw_short", "raw_long", "raw_extra", "raw_missing", "typed_and_raw"),
}  # fmt: skip


def _content(family: str, rng: np.random.Generator, good: bool) -> tuple[str, Tensor, Any]:
    """A tensor of good form: (what, tensor, its content: rows or ids); ``good``: good content too."""
    if family == "rows":
        kind = "good" if good else str(rng.choice(ROW_KINDS))
        rows = _draw_rows(rng, kind)
        return f"rows:{kind}", _rows_tensor(rows), rows
    kind = "random" if good else str(rng.choice(ID_KINDS))
    ids = _draw_ids(rng, kind)
    return f"ids:{kind}", _ids_tensor(ids), ids


def _expected(
    family: str,
    lookup: HotColdLookup,
    content: Any,
    transport: str,
    outputs: tuple[str, ...] | None,
    raw_strings: bool = False,
) -> Arrays | str:
    """What the stage answers to ``content`` sent in good form over ``transport`` (``raw_strings``:
    JSON strings that hold the rows' bytes unescaped, see :func:`_raw_json_string`)."""
    if family == "rows":
        rows = _json_view(content) if transport == "json" and not raw_strings else content
        return _rows_reference(rows, outputs)
    return _ids_reference(lookup, content, outputs)


def _draw(family: str, lookup: HotColdLookup, rng: np.random.Generator, good: bool = False) -> Case:
    """One random case of a stage of ``family`` (``good``: a good request, in any transport)."""
    transport = str(rng.choice(TRANSPORTS))
    what, tensor, content = _content(family, rng, good)
    outputs_all = (
        (DENSE_INPUT, CATEGORICAL_INPUT) if family == "rows" else (HOT_SLOTS, COLD_POSITIONS, COLD_ROWS)
    )
    if good:
        return Case(what, transport, (tensor,), None, _expected(family, lookup, content, transport, None))
    category = str(rng.choice(["content", "content", "structure", "structure", "wire"]))
    if category == "content":
        outputs: tuple[str, ...] | None = None
        if rng.random() < 0.3:
            picked = rng.permutation(outputs_all)[: int(rng.integers(1, len(outputs_all) + 1))]
            outputs = tuple(str(name) for name in picked)
        expected = _expected(family, lookup, content, transport, outputs)
        if transport == "grpc" and rng.random() < 0.3:
            return Case(f"{what} typed", transport, (tensor,), outputs, expected, damage="typed")
        if transport == "json" and family == "rows" and rng.random() < 0.5:
            expected = _expected(family, lookup, content, transport, outputs, raw_strings=True)
            return Case(f"{what} raw_strings", transport, (tensor,), outputs, expected, damage="raw_strings")
        return Case(what, transport, (tensor,), outputs, expected)
    if category == "wire":
        damage = str(rng.choice(DAMAGES[transport]))
        # An extra raw_input_contents is ignored by tritonserver (see the module): answered.
        answer = _expected(family, lookup, content, transport, None) if damage == "raw_extra" else None
        case = Case(f"{what} wire:{damage}", transport, (tensor,), None, answer, damage=damage)
        return _bytes_framing(rng, family, case, content) if rng.random() < 0.3 else case
    return _structure(rng, family, lookup, transport, what, tensor, content)


def _bytes_framing(rng: np.random.Generator, family: str, case: Case, content: Any) -> Case:
    """A BYTES input framed wrongly (binary HTTP and gRPC only): the last element longer than the
    data (past tritonserver's check: the stage's words, predicted here), bytes left over,
    an element too many or too few."""
    if family != "rows" or case.transport == "json":
        return case
    rows: list[bytes] = content
    choice = int(rng.integers(0, 4))
    if choice == 0:
        extra = int(rng.choice([1, 7, 2**32 - 1 - len(rows[-1])]))
        declared = len(rows[-1]) + extra
        raw = _bytes_raw(rows[:-1]) + struct.pack("<I", declared) + rows[-1]
        expected: str | None = (
            f"incomplete string data for inference input '{RAW_ROWS_INPUT}', expecting string of length "
            f"{declared} but only {len(rows[-1])} bytes available"
        )
        what = f"framing:last_element_longer_by_{extra}"
    elif choice == 1:
        raw, expected, what = _bytes_raw(rows) + rng.bytes(int(rng.integers(1, 4))), None, "framing:left_over"
    elif choice == 2:
        raw, expected, what = _bytes_raw([*rows, rows[0]]), None, "framing:one_more"
    else:
        raw, expected, what = _bytes_raw(rows[:-1]), None, "framing:one_fewer"
    tensor = replace(case.inputs[0], raw=raw)
    return replace(
        case, what=f"{case.what.split(' ')[0]} {what}", inputs=(tensor,), expected=expected, damage=""
    )


def _structure(
    rng: np.random.Generator,
    family: str,
    lookup: HotColdLookup,
    transport: str,
    what: str,
    tensor: Tensor,
    content: Any,
) -> Case:
    """A request whose tensors or outputs are wrong: data type, shape, inputs or outputs."""
    kind = str(rng.choice(["datatype", "shape", "shape", "inputs", "outputs"]))
    count = len(content)
    if kind == "datatype":
        names = [name for name in [*DATATYPES, *UNKNOWN_DATATYPES] if name != tensor.datatype]
        datatype = names[int(rng.integers(0, len(names)))]
        wrong = _typed_tensor(rng, tensor.name, datatype, tensor.shape)
        if transport == "json" and not _json_safe(wrong):
            transport = "binary"
        return Case(f"{what} datatype:{datatype!r}", transport, (wrong,), None, None)
    if kind == "shape":
        shape, fate = _shape_damage(rng, family, count)
        wrong = replace(tensor, shape=shape)
        if transport == "json" and not _json_safe(wrong):
            transport = "binary"
        if fate == "answered":
            return Case(
                f"{what} shape:{list(shape)} (batch read as its low 32 bits)", transport, (wrong,), None,
                _expected(family, lookup, content, transport, None),
            )  # fmt: skip
        if fate == "wraps":
            if shape[0] % 2**61 == 0:  # wraps to 0 bytes: sent with none
                wrong = replace(wrong, raw=b"", data=[])
            what = f"{what} shape:{list(shape)} (byte size wraps)"
            return Case(what, transport, (wrong,), None, None)
        if fate == "empty":
            # Past tritonserver's checks (-1 takes 0 rows): the stage's own error.
            empty = _ids_tensor(np.zeros((0, NUM_CATEGORICAL), dtype=np.int64))
            expected = _ids_reference(lookup, np.zeros((0, NUM_CATEGORICAL), dtype=np.int64), None)
            return Case(f"{what} shape:[0, 26] (empty batch)", transport, (empty,), None, expected)
        return Case(f"{what} shape:{list(shape)}", transport, (wrong,), None, None)
    if kind == "inputs":
        choice = int(rng.integers(0, 6))
        extra = _typed_tensor(rng, "extra_input", "INT64", (1,))
        inputs = [
            (),
            (replace(tensor, name="no_such_input"),),
            (tensor, extra),
            (tensor, tensor),
            (replace(tensor, name=tensor.name.upper()),),
            (replace(tensor, name=""),),
        ][choice]
        return Case(f"{what} inputs:{choice}", transport, inputs, None, None)
    choice = int(rng.integers(0, 3))
    outputs = [("no_such_output",), ("",), (DENSE_INPUT if family == "embedding" else HOT_SLOTS,)][choice]
    return Case(f"{what} outputs:{outputs}", transport, (tensor,), outputs, None)


# ---------------------------------------------------------------------------- the wire
def _wire(case: Case, rng: np.random.Generator) -> Wire:
    """The case in its transport's form, damaged as it says."""
    if case.transport == "grpc":
        return Wire(grpc=_grpc_request(case, rng))
    if case.transport == "json":
        body = _json_body(case, rng)
        return Wire(body, (("Content-Type", "application/json"),))
    return _binary_body(case, rng)


def _json_body(case: Case, rng: np.random.Generator) -> bytes:
    inputs = []
    for tensor in case.inputs:
        data = list(tensor.data)
        if case.damage == "data_count":
            data = data[:-1] if data and rng.random() < 0.5 else [*data, *data[:1]]
        elif case.damage == "data_values" and data:
            values: list[Any] = [None, {"a": 1}, [[]], True, 2**63, -(2**63) - 1, "x"]
            data[int(rng.integers(0, len(data)))] = values[int(rng.integers(0, len(values)))]
        inputs.append(
            {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype, "data": data}
        )
    request: dict[str, Any] = {"inputs": inputs}
    if case.outputs is not None:
        request["outputs"] = [{"name": name} for name in case.outputs]
    body = json.dumps(request).encode()
    if case.damage == "raw_strings":
        # One input of BYTES: its strings written with their bytes as they are.
        rows = _split_bytes(case.inputs[0].raw)
        inputs[0]["data"] = "@DATA@"
        strings = b",".join(_raw_json_string(row) for row in rows)
        body = json.dumps(request).encode().replace(b'"@DATA@"', b"[" + strings + b"]")
    if case.damage == "truncated":
        return body[: int(rng.integers(1, len(body)))]
    if case.damage == "garbage":
        return rng.bytes(int(rng.integers(0, 400)))
    if case.damage == "raw_control_byte":
        # A byte no JSON string may hold unescaped, inside the first string or name.
        at = body.index(b'"', body.index(b'"name"') + 7) + 1
        return body[:at] + bytes([int(rng.choice([0, 1, 10, 31, 0x80, 0xC3, 0xFF]))]) + body[at:]
    return body


def _raw_json_string(row: bytes) -> bytes:
    """A JSON string of ``row``'s bytes as they are, escaping only what JSON requires (a quote, a
    backslash, control bytes): tritonserver 2.51 does not check that a string is UTF-8, so the
    stage receives ``row`` itself, invalid UTF-8 and all."""
    out = bytearray(b'"')
    for byte in row:
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif byte < 0x20:
            out += b"\\u%04x" % byte
        else:
            out.append(byte)
    return bytes(out + b'"')


def _binary_body(case: Case, rng: np.random.Generator) -> Wire:
    raws = [tensor.raw for tensor in case.inputs]
    inputs = []
    for tensor in case.inputs:
        size = len(tensor.raw)
        if case.damage == "size_more":
            size += int(rng.integers(1, 9))
        elif case.damage == "size_less":
            size = max(0, size - int(rng.integers(1, 9)))
        entry: dict[str, Any] = {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
        }
        entry["parameters"] = {"binary_data_size": size}
        if case.damage == "data_and_binary":
            entry["data"] = tensor.data or [0]
        inputs.append(entry)
    request: dict[str, Any] = {"inputs": inputs}
    if case.outputs is None:
        request["parameters"] = {"binary_data_output": True}
    else:
        request["outputs"] = [{"name": name, "parameters": {"binary_data": True}} for name in case.outputs]
    header = json.dumps(request).encode()
    body = header + b"".join(raws)
    length = str(len(header))
    if case.damage == "truncated":
        body = body[: len(header) + int(rng.integers(0, max(1, len(body) - len(header))))]
    elif case.damage == "extra_bytes":
        body += rng.bytes(int(rng.integers(1, 16)))
    elif case.damage.startswith("header_"):
        length = {
            "header_long": str(len(header) + int(rng.integers(1, 16))),
            "header_short": str(int(rng.integers(1, len(header)))),
            "header_huge": str(10**9),
            "header_negative": "-3",
            "header_zero": str(rng.choice(["0", "abc", ""])),
        }[case.damage]
    headers = (("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", length))
    return Wire(body, headers)


def _grpc_request(case: Case, rng: np.random.Generator) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest()
    for index, tensor in enumerate(case.inputs):
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        raw = tensor.raw
        if case.damage == "typed" or (case.damage == "typed_and_raw" and index == 0):
            if tensor.datatype == "BYTES":
                entry.contents.bytes_contents.extend(_split_bytes(raw))
            else:
                entry.contents.int64_contents.extend(np.frombuffer(raw, dtype="<i8").tolist())
            if case.damage == "typed":
                continue
        if case.damage == "raw_short":
            raw = raw[: -int(rng.integers(1, 5))] if raw else raw
        elif case.damage == "raw_long":
            raw += rng.bytes(int(rng.integers(1, 9)))
        elif case.damage == "raw_missing":
            continue
        request.raw_input_contents.append(raw)
    if case.damage == "raw_extra":
        request.raw_input_contents.append(rng.bytes(8))
    for name in case.outputs or ():
        request.outputs.add(name=name)
    return request


def _split_bytes(raw: bytes) -> list[bytes]:
    """The elements of well-framed BYTES (the typed form of the same tensor)."""
    elements, position = [], 0
    while position + 4 <= len(raw):
        (length,) = struct.unpack_from("<I", raw, position)
        elements.append(raw[position + 4 : position + 4 + length])
        position += 4 + length
    return elements


# ---------------------------------------------------------------------------- answers
@dataclass(frozen=True)
class Outcome:
    """What came back: the outputs, or a status (HTTP code, gRPC code name) and message."""

    arrays: Arrays | None
    status: str
    message: str


class Client:
    """Sends wires to one server over raw HTTP and raw gRPC."""

    def __init__(self, server: LocalServer, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
        host, port = server.http_url.rsplit(":", 1)
        self._host, self._port, self._stub = host, int(port), stub

    def send(self, model: str, wire: Wire) -> Outcome:
        if wire.grpc is not None:
            return self._call(model, wire.grpc)
        return self._post(model, wire)

    def _post(self, model: str, wire: Wire) -> Outcome:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)
        try:
            connection.request(
                "POST", f"/v2/models/{model}/infer", body=wire.body, headers=dict(wire.headers)
            )
            response = connection.getresponse()
            status, body = response.status, response.read()
            length = response.getheader("Inference-Header-Content-Length")
        except (OSError, http.client.HTTPException) as exc:
            return Outcome(None, "no answer", f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()
        split = int(length) if length else len(body)
        try:
            # tritonserver quotes what it was sent in its errors, invalid UTF-8 and all.
            header = json.loads(body[:split].decode("utf-8", "replace"))
        except ValueError:
            return Outcome(None, str(status), f"(unreadable body) {body[:200]!r}")
        if status != 200 or not isinstance(header, dict):
            error = header.get("error", "") if isinstance(header, dict) else ""
            return Outcome(None, str(status), str(error))
        arrays, offset = {}, split
        for output in header.get("outputs", []):
            dtype = OUTPUT_DTYPES[output["datatype"]]
            size = output.get("parameters", {}).get("binary_data_size")
            if size is None:
                array = np.array(output["data"], dtype=dtype)
            else:
                array = np.frombuffer(body[offset : offset + size], dtype=dtype)
                offset += size
            arrays[output["name"]] = array.reshape(output["shape"])
        return Outcome(arrays, "200", "")

    def _call(self, model: str, wire: service_pb2.ModelInferRequest) -> Outcome:
        request = service_pb2.ModelInferRequest()
        request.CopyFrom(wire)
        request.model_name = model
        try:
            response = self._stub.ModelInfer(request, timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return Outcome(None, exc.code().name, exc.details() or "")
        arrays = {}
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            arrays[output.name] = np.frombuffer(raw, dtype=OUTPUT_DTYPES[output.datatype]).reshape(
                output.shape
            )
        return Outcome(arrays, "OK", "")


def _differs(got: Arrays, expected: Arrays, ulps: int) -> str:
    """How ``got`` differs from ``expected`` ("" when equal; float32 outputs within ``ulps``)."""
    if sorted(got) != sorted(expected):
        return f"outputs {sorted(got)}, expected {sorted(expected)}"
    for name, want in expected.items():
        have = got[name]
        if (have.dtype, have.shape) != (want.dtype, want.shape):
            return f"{name}: {have.dtype} {list(have.shape)}, expected {want.dtype} {list(want.shape)}"
        if ulps and have.dtype == np.float32:
            apart = np.abs(have.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
            if apart.size and int(apart.max()) > ulps:
                return f"{name}: {int(apart.max())} ULP from the reference"
        elif have.tobytes() != want.tobytes():
            return f"{name}: {int(np.count_nonzero(have != want))} value(s) differ from the reference"
    return ""


def _refused_properly(outcome: Outcome) -> bool:
    """An error of the request's own: HTTP 400 (or 500 for a body tritonserver could not parse),
    gRPC INVALID_ARGUMENT, with a message."""
    if not outcome.message:
        return False
    if outcome.status == "500":
        return outcome.message.startswith(HTTP_PARSE_ERRORS)
    return outcome.status in ("400", "INVALID_ARGUMENT")


def _judge(stage: Stage, case: Case, outcome: Outcome) -> str:
    """What is wrong with ``outcome`` ("" when nothing)."""
    if isinstance(case.expected, dict):
        if outcome.arrays is None:
            return f"refused a good request: {outcome.status} {outcome.message[:300]!r}"
        ulps = 4 if stage.family == "rows" and not LOG1P_IS_LIBMS else 0
        return _differs(outcome.arrays, case.expected, ulps)
    if outcome.arrays is not None:
        return f"answered a request it should refuse ({case.expected!r})"
    if not _refused_properly(outcome):
        return f"not refused properly: {outcome.status} {outcome.message[:300]!r}"
    if isinstance(case.expected, str) and outcome.message != case.expected:
        return f"refused with {outcome.message[:300]!r}, expected {case.expected[:300]!r}"
    return ""


def _describe(case: Case) -> str:
    tensors = ", ".join(f"{t.name!r} {t.datatype!r} {list(t.shape)} ({len(t.raw)} B)" for t in case.inputs)
    return f"{case.what} over {case.transport}{f' ({case.damage})' if case.damage else ''}: [{tensors}]"


# ---------------------------------------------------------------------------- health
def _healthy(server: LocalServer, stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str) -> str:
    """What is wrong with the server's health ("" when live and ready, with ``model`` ready)."""
    problems = []
    if not server.running or server.failure:
        problems.append(f"the server is not running: {server.failure}")
        return "; ".join(problems)
    host, port = server.http_url.rsplit(":", 1)
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{model}/ready"):
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        try:
            connection.request("GET", path)
            status = connection.getresponse().status
        except (OSError, http.client.HTTPException) as exc:
            status = 0
            problems.append(f"GET {path}: {exc}")
        finally:
            connection.close()
        if status != 200:
            problems.append(f"GET {path}: {status}")
    try:
        live = stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=TIMEOUT_S).live
        ready = stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=TIMEOUT_S).ready
    except grpc.RpcError as exc:
        live = ready = False
        problems.append(f"gRPC health: {exc.code().name}")
    if not (live and ready):
        problems.append(f"gRPC: live {live}, model ready {ready}")
    return "; ".join(problems)


@pytest.fixture(scope="module")
def stub(server: LocalServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    # A channel of default options: every error must reach a client as it is
    # (test_an_overlong_rows_error_reaches_a_grpc_client).
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


# ---------------------------------------------------------------------------- the fuzz
def _kind(case: Case) -> str:
    """What was drawn, for the tally: ``json content``, ``grpc shape``, ``binary wire``, ..."""
    drawn = case.what.split(" ", 1)[1].split(":")[0] if " " in case.what else "content"
    return f"{case.transport} {drawn}"


@pytest.mark.parametrize("name", list(STAGES))
def test_random_requests_get_their_answer_or_their_own_error(
    name: str, server: LocalServer, stub: service_pb2_grpc.GRPCInferenceServiceStub, lookup: HotColdLookup
) -> None:
    stage = STAGES[name]
    if stage is EMBEDDING:
        server.load_model(stage.model)
    index = list(STAGES).index(name)
    pid = server.pid
    client = Client(server, stub)
    problems: list[str] = []
    drawn: Counter[str] = Counter()
    started = time.monotonic()
    for number in range(CASES):
        rng = np.random.default_rng([SEED, index, number])
        cases = [_draw(stage.family, lookup, rng)]
        if number % GOOD_EVERY == GOOD_EVERY - 1:
            cases.append(replace(_draw(stage.family, lookup, rng, good=True), what="interleaved good"))
        for case in cases:
            drawn[_kind(case)] += 1
            problem = _judge(stage, case, client.send(stage.model, _wire(case, rng)))
            if problem:
                problems.append(
                    f"seed {SEED}, stage {name} ({index}), case {number}: {_describe(case)}: {problem}"
                )
        health = _healthy(server, stub, stage.model) if len(cases) > 1 or not server.running else ""
        if health:
            problems.append(f"seed {SEED}, stage {name} ({index}), after case {number}: {health}")
            break
    elapsed = time.monotonic() - started
    logger.info(
        "%s: %d requests in %.1f s: %s", name, sum(drawn.values()), elapsed, dict(sorted(drawn.items()))
    )
    assert not problems, f"{len(problems)} problem(s) in {elapsed:.1f} s:\n" + "\n".join(problems[:25])
    assert not _healthy(server, stub, stage.model)
    assert server.pid == pid and not server.recoveries
    assert len(drawn) >= 15, drawn  # most kinds of request were drawn


# ---------------------------------------------------------------------------- a lost error
def test_an_overlong_rows_error_reaches_a_grpc_client(server: LocalServer) -> None:
    """A row whose first count is 64 KiB of digits, over a gRPC channel of default options: the
    error quotes the field's head and its length (criteo/rows.py's quoted; the compiled parse says
    the same), where the whole field would outgrow a gRPC client's default metadata limit, which
    drops the error (RESOURCE_EXHAUSTED: received metadata size exceeds hard limit)."""
    row = b"\t".join([b"7" * (1 << 16), *[b"1"] * 12, *[b"a"] * 26])
    case = Case("overlong count", "grpc", (_rows_tensor([row]),), None, None)
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        outcome = Client(server, stub).send(ROWS.model, _wire(case, np.random.default_rng(SEED)))
    finally:
        channel.close()
    assert outcome.status == "INVALID_ARGUMENT", (outcome.status, outcome.message[:200])
    assert outcome.message.startswith("row 0: I1: count '777"), outcome.message[:200]
    assert "'... (65536 bytes) is not an integer" in outcome.message and len(outcome.message) < 300


# ---------------------------------------------------------------------------- tritonserver's own crashes
def _start_alone(start_triton: Callable[..., LocalServer], repository: Path, model: str) -> LocalServer:
    return start_triton(repository, model_control_mode="explicit", load_models=[model], on_dead_model="stop")


@pytest.mark.xfail(
    strict=True,
    reason="tritonserver 2.51's HTTP frontend allocates what a JSON input of a fixed-size type declares "
    "before it checks anything, and aborts on std::bad_alloc",
)
def test_a_json_input_declaring_terabytes_is_refused(
    start_triton: Callable[..., LocalServer], repository: Path
) -> None:
    """One int64 value declared as ``[2**40, 1]`` (8 TiB), to the raw-row stage (which takes BYTES)."""
    server = _start_alone(start_triton, repository, ROWS.model)
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        tensor = Tensor(RAW_ROWS_INPUT, "INT64", (2**40, 1), b"", [1])
        case = Case("terabytes", "json", (tensor,), None, None)
        outcome = Client(server, stub).send(ROWS.model, _wire(case, np.random.default_rng(SEED)))
        assert _refused_properly(outcome), outcome
        assert not _healthy(server, stub, ROWS.model)
    finally:
        channel.close()
        server.stop()
