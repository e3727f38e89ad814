"""The tritonserver that ships in the nvidia-pytriton wheel, and how to run it.

The wheel holds a real tritonserver binary with only the python backend. It
runs outside its container when (verified on this project's machines):

1. the backend directory holds ``python/`` with ``libtriton_python.so``,
   ``triton_python_backend_utils.py`` and the stub built for this Python
   (``python_backend_stubs/<major>.<minor>/triton_python_backend_stub``);
   tritonserver resolves symlinks and rejects a backend library outside the
   backend directory, so these are copied, not linked;
2. ``LD_LIBRARY_PATH`` starts with this interpreter's LIBDIR (the stub embeds
   libpython), then ``<site-packages>/nvidia_pytriton.libs``;
3. this interpreter's ``bin`` is first on ``PATH``: the embedded interpreter
   finds its prefix (and so the venv's numpy and onnxruntime) through it.

Python-based backends (``backends/<name>/model.py``) are copied next to
``python/`` as ``<name>/model.py``; tritonserver then serves every model whose
config says ``backend: "<name>"`` (or a platform Triton maps to it, e.g.
``pytorch_libtorch`` -> ``pytorch``) with that file, without a model.py per
model. The modules they share (``backends/*.py``, e.g.
``batched_model.py``) are copied beside each ``model.py``: the python backend
puts that folder on ``sys.path``.

The bundle's compiled stages (Triton C++ backends, ``backends/CMakeLists.txt``,
built by ``make stages`` into ``build/stages``) are copied in too where they are built:
``build/stages/<stage>/libtriton_<stage>.so`` becomes ``<stage>/libtriton_<stage>.so``, so a
config that says ``backend: "<stage>"`` loads it. They link no Triton library: the server
resolves their ``TRITON*`` symbols when it opens them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bundle.errors import ServerError

logger = logging.getLogger(__name__)

# Our Python-based backends: one folder per backend name, each with a model.py.
BACKENDS_SOURCE = Path(__file__).resolve().parents[1] / "backends"
# Where `make stages` builds the compiled stages: <stage>/libtriton_<stage>.so each.
# STAGES_BUILD_ENV names another build (`make stages-sanitize` points it at the ASan + UBSan one,
# and STAGES_PRELOAD_ENV at the sanitizer runtime tritonserver must load first).
STAGES_BUILD_ENV = "BUNDLE_STAGES_BUILD"
STAGES_PRELOAD_ENV = "BUNDLE_STAGES_PRELOAD"
COMPILED_STAGES = Path(
    os.environ.get(STAGES_BUILD_ENV) or Path(__file__).resolve().parents[1] / "build" / "stages"
)

_PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
_STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstallation:
    """Paths of the wheel's tritonserver and of what it needs at run time.

    Args:
        binary: the ``tritonserver`` executable.
        python_backend: folder with ``libtriton_python.so`` and
            ``triton_python_backend_utils.py``.
        stub: ``triton_python_backend_stub`` built for this Python version.
        libraries: the wheel's bundled shared libraries (``nvidia_pytriton.libs``).
        caches: folder of response-cache implementations (``--cache-directory``).
        python_libdir: the folder with this interpreter's ``libpython``.
        python_bin: this interpreter's ``bin`` folder (a venv's, if in one).
    """

    binary: Path
    python_backend: Path
    stub: Path
    libraries: Path
    caches: Path
    python_libdir: Path
    python_bin: Path

    @classmethod
    def locate(cls) -> TritonInstallation:
        """Find the wheel's tritonserver for the running interpreter.

        Raises:
            ServerError: nvidia-pytriton is not installed, a file is missing,
                or this Python has no shared libpython for the stub.
        """
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise ServerError(
                "nvidia-pytriton is not installed in this environment; "
                "its wheel provides the tritonserver binary (see requirements.txt)"
            )
        package = Path(next(iter(spec.submodule_search_locations)))
        root = package / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        libdir = sysconfig.get_config_var("LIBDIR")
        libpython = sysconfig.get_config_var("INSTSONAME")
        installation = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / _STUB_NAME,
            libraries=package.parent / "nvidia_pytriton.libs",
            caches=root / "caches",
            python_libdir=Path(libdir) if libdir else Path(),
            # Not resolved: a venv's python is a symlink, and the venv's own
            # bin folder is the one that must come first on PATH.
            python_bin=Path(sys.executable).parent,
        )
        required = [
            installation.binary,
            installation.stub,
            installation.libraries,
            *(installation.python_backend / name for name in _PYTHON_BACKEND_FILES),
        ]
        missing = [str(path) for path in required if not path.exists()]
        if missing:
            raise ServerError(
                f"the nvidia-pytriton wheel lacks files the local server needs "
                f"(Python {version}): {', '.join(missing)}"
            )
        if not libdir or not libpython or not (Path(libdir) / libpython).exists():
            raise ServerError(
                f"the python backend stub needs a shared libpython ({libpython or 'libpython'}) "
                f"in {libdir or 'LIBDIR'}; use a Python built with --enable-shared"
            )
        return installation

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment tritonserver and its python stubs need.

        Args:
            base: the environment to extend; ``os.environ`` by default.

        Returns:
            A copy of ``base`` with ``LD_LIBRARY_PATH`` and ``PATH`` prefixed, and
            ``LD_PRELOAD`` set to ``BUNDLE_STAGES_PRELOAD`` where that is set.
        """
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = _prepend(env.get("LD_LIBRARY_PATH", ""), self.python_libdir, self.libraries)
        env["PATH"] = _prepend(env.get("PATH", ""), self.python_bin)
        if env.get(STAGES_PRELOAD_ENV):
            env["LD_PRELOAD"] = env[STAGES_PRELOAD_ENV]
        return env

    def build_backend_directory(
        self, target: Path, sources: Path = BACKENDS_SOURCE, compiled: Path = COMPILED_STAGES
    ) -> Path:
        """Assemble a ``--backend-directory`` for tritonserver in ``target``.

        Args:
            target: an empty or missing folder; created.
            sources: folder of Python-based backends, ``<name>/model.py`` each.
            compiled: the build folder of the compiled stages, ``<stage>/libtriton_<stage>.so``
                each; stages not built there are left out.

        Returns:
            ``target``, holding ``python/``, one ``<name>/model.py`` per backend, each with
            the shared modules of ``sources`` beside it, and one
            ``<stage>/libtriton_<stage>.so`` per compiled stage.
        """
        python_dir = target / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for name in _PYTHON_BACKEND_FILES:
            shutil.copy2(self.python_backend / name, python_dir / name)
        shutil.copy2(self.stub, python_dir / _STUB_NAME)
        shared = sorted(path for path in sources.glob("*.py") if path.name != "__init__.py")
        backends = sorted(path.parent for path in sources.glob("*/model.py"))
        for backend in backends:
            (target / backend.name).mkdir(exist_ok=True)
            for module in (backend / "model.py", *shared):
                shutil.copy2(module, target / backend.name / module.name)
        libraries = sorted(
            library
            for library in compiled.glob("*/libtriton_*.so")
            if library.name == f"libtriton_{library.parent.name}.so"
        )
        stages = [library.parent for library in libraries]
        for library in libraries:
            (target / library.parent.name).mkdir(exist_ok=True)
            shutil.copy2(library, target / library.parent.name / library.name)
        names = [b.name for b in backends] + [f"{s.name} (compiled)" for s in stages]
        logger.debug("backend directory %s: python + %s", target, ", ".join(names))
        return target


def _prepend(current: str, *paths: Path) -> str:
    parts = [str(path) for path in paths]
    if current:
        parts.append(current)
    return os.pathsep.join(parts)
