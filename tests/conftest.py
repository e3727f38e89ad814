"""Integration-test fixtures: real local tritonservers, started per repository.

Usage in any integration test module::

    @pytest.fixture(scope="module")
    def server(start_triton, my_repository: Path) -> Iterator[LocalServer]:
        server = start_triton(my_repository)        # ready: every model READY
        yield server
        server.stop()                               # optional: else at session end

    def test_something(server: LocalServer) -> None:
        client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bundle.errors import ServerError
from criteo.synth import SynthConfig, write_tsv
from server import LocalServer, ServerConfig, TritonInstallation

StartTriton = Callable[..., LocalServer]


@pytest.fixture(scope="session")
def triton_installation() -> TritonInstallation:
    """The nvidia-pytriton wheel's tritonserver; skips the test where it is absent."""
    try:
        return TritonInstallation.locate()
    except ServerError as exc:
        pytest.skip(f"no local tritonserver: {exc}")


@pytest.fixture(scope="session")
def start_triton(
    triton_installation: TritonInstallation, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartTriton]:
    """Factory: ``start_triton(repository, **config_options) -> LocalServer``.

    ``repository`` is a folder, or an ``s3://`` URL (tritonserver downloads it).

    Each call starts one tritonserver on ``repository`` on three free ports of
    127.0.0.1, with its log in a temporary folder (``server.log_file``), and
    returns once every model is ready; ``config_options`` are further
    ``ServerConfig`` fields (``model_control_mode``, ``load_models``, ...).
    A failed start raises ``ServerError`` with the server already stopped.
    Every server still running at the end of the session is stopped by its
    process id (SIGTERM, then SIGKILL of its process group after a timeout), all of them at once.
    """
    servers: list[LocalServer] = []
    logs = tmp_path_factory.mktemp("tritonserver-logs")
    counter = itertools.count()

    def start(repository: Path | str, **options: Any) -> LocalServer:
        options.setdefault("log_file", logs / f"{Path(repository).name}-{next(counter)}.log")
        server = LocalServer(
            # A str stays one: an s3:// URL is passed to tritonserver as it is.
            ServerConfig.with_free_ports(repository, **options),
            installation=triton_installation,
        )
        servers.append(server)
        return server.start()

    yield start
    # All at once: each drains and unloads on its own, so the session does not wait them out in turn.
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        list(pool.map(lambda server: server.stop(), servers))


def _run_stage(*args: str) -> None:
    """Run ``python -m <stage> ...`` in its own process (TensorFlow and PyTorch never share one)."""
    command = [sys.executable, "-m", *args]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stdout}\n{completed.stderr}"
        )


@pytest.fixture(scope="session")
def labeled_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A labeled synthetic Criteo TSV file of 6,000 rows."""
    path = tmp_path_factory.mktemp("data") / "rows.tsv"
    write_tsv(SynthConfig(rows=6_000, seed=11), path)
    return path


@pytest.fixture(scope="session")
def exported_repository(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Path:
    """A model repository with every model of the cpu profile, trained (tiny preset) and
    exported through the real CLIs: <family>_onnx, <family>_onnx_fp16 and <family>_onnx_int8 of both."""
    root = tmp_path_factory.mktemp("exported")
    repository = root / "model_repository"
    train = ["--data", str(labeled_file), "--preset", "tiny", "--table-size", "500"]
    # The tiny, barely trained models check serving, not accuracy: the INT8 gate is opened wide so
    # that both INT8 variants are written (an untrained DLRM's INT8 AUC moves by a few 1e-3).
    check = ["--repository", str(repository), "--check-data", str(labeled_file), "--check-rows", "2048",
             "--int8-auc-tolerance", "1.0"]  # fmt: skip
    _run_stage("models", "train", "dlrm", *train, "--out", str(root / "dlrm"))
    _run_stage("export", "dlrm", "--checkpoint", str(root / "dlrm"), *check)
    _run_stage("models", "train", "wide-deep", *train, "--out", str(root / "wide_deep"))
    _run_stage("export", "wide-deep", "--saved-model", str(root / "wide_deep"), *check)
    return repository


@pytest.fixture(scope="session")
def exported_server(start_triton: StartTriton, exported_repository: Path) -> LocalServer:
    """One local tritonserver serving :func:`exported_repository` for the whole session."""
    return start_triton(exported_repository)
