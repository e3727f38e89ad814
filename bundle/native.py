"""Native libraries' start-up lines, kept out of a command's output.

TensorFlow's C++ libraries write absl and oneDNN lines to the process's standard error
(file descriptor 2) while they load: "All log messages before absl::InitializeLog() is
called...", "oneDNN custom operations are on...", "This TensorFlow binary is optimized
to use available CPU instructions...". They come before any Python logging applies, and
``TF_CPP_MIN_LOG_LEVEL`` no longer silences them (TensorFlow 2.21), so a one-line error
of a command ends up below five lines of noise. :func:`quiet_native_stderr` points
descriptor 2 at a temporary file while such a library is imported: with ``--verbose``
the lines pass, and if the import fails they are written out after all.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from bundle.cli import is_verbose


@contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Hold what native code writes to descriptor 2 inside the block (shown again only on an error)."""
    if is_verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def import_tensorflow() -> ModuleType:
    """``import tensorflow`` (and keras, which loads the same libraries) without their start-up lines."""
    with quiet_native_stderr():
        import keras  # noqa: F401  (loaded here so that its own start-up lines are held too)
        import tensorflow

    return tensorflow
