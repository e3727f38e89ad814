"""What the tests of the compiled stages share: whether this machine's numpy computes float32
``log1p`` as the C library's ``log1pf`` (which the compiled raw-row stage calls), bit for bit.

Where it does, the compiled stage's dense features must equal the python rules' bit for bit;
where numpy takes a SIMD version of its own (some builds do on AVX-512 machines), within 4 ULP.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np


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
