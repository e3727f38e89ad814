"""What the tests of the compiled stages share: each stage's reference in Python, and whether
this machine's numpy computes float32 ``log1p`` as the C library's ``log1pf`` (which the compiled
raw-row stage calls), bit for bit.

The references: the raw-row stage answers a request's rows as :func:`criteo.rows.request_inputs`
does, or refuses them with its :class:`~criteo.rows.RowError`'s text; the embedding stage answers
ids as :class:`~export.stage.hot_cold_lookup.HotColdLookup` places them, or refuses
them with its :class:`~export.stage.hot_cold_lookup.RequestError`'s text.

Where numpy's ``log1p`` is libm's, the compiled stage's dense features must equal the rules' bit
for bit; where numpy takes a SIMD version of its own (some builds do on AVX-512 machines), within
4 ULP.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Sequence

import numpy as np

from bundle.schema import CATEGORICAL_INPUT, COLD_POSITIONS, COLD_ROWS, DENSE_INPUT, HOT_SLOTS
from criteo.rows import RowError, request_inputs
from export.stage.hot_cold_lookup import HotColdLookup, RequestError

Arrays = dict[str, np.ndarray]


def _log1p_is_libms() -> bool:
    """Whether numpy's float32 log1p answers as the C library's log1pf, bit for bit."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.log1pf.restype, libm.log1pf.argtypes = ctypes.c_float, [ctypes.c_float]
    probe = np.concatenate(
        [np.arange(20000, dtype=np.float32), np.float32(10) ** np.arange(19, dtype=np.float32)]
    )
    theirs = np.array([libm.log1pf(float(value)) for value in probe], dtype=np.float32)
    return bool(np.array_equal(np.log1p(probe).view(np.int32), theirs.view(np.int32)))


#: Probed once per test session.
LOG1P_IS_LIBMS = _log1p_is_libms()


def rows_reference(rows: Sequence[bytes]) -> Arrays | str:
    """A request's rows as the raw-row stage answers them (``B x 13`` float32, ``B x 26`` int64),
    or the error text it refuses them with."""
    try:
        dense, ids = request_inputs(rows)
    except RowError as exc:
        return str(exc)
    return {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}


def ids_reference(lookup: HotColdLookup, ids: np.ndarray) -> Arrays | str:
    """Ids' placement as the embedding stage answers it, or the error text it refuses them with."""
    try:
        placement = lookup.place(lookup.check_ids(ids, CATEGORICAL_INPUT))
    except RequestError as exc:
        return str(exc)
    return {
        HOT_SLOTS: placement.hot_slots,
        COLD_POSITIONS: placement.cold_positions,
        COLD_ROWS: placement.cold_rows,
    }


def assert_rows_equal(answered: Arrays, expected: Arrays) -> None:
    """The raw-row stage's tensors against the rules': ids bit for bit, dense features bit for bit
    or within 4 ULP (see the module)."""
    assert answered[CATEGORICAL_INPUT].tobytes() == expected[CATEGORICAL_INPUT].tobytes()
    if LOG1P_IS_LIBMS:
        assert answered[DENSE_INPUT].tobytes() == expected[DENSE_INPUT].tobytes()
    else:
        np.testing.assert_array_max_ulp(answered[DENSE_INPUT], expected[DENSE_INPUT], maxulp=4)
