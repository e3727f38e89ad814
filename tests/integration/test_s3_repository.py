"""The bundle's repository served from S3-compatible object storage by the real local tritonserver.

A DLRM (tiny preset) is trained and exported through the real CLIs, published with
``python -m export publish`` to moto's S3 server on loopback, and served from there: by the
``start_triton`` fixture and by ``python -m server serve --repository s3://...``; answers over
HTTP and gRPC must equal ONNX Runtime in this process. tritonserver downloads the repository
itself, with the credentials of the AWS variables in its environment.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from bundle.errors import ServerError
from clients.verify import verify_repository
from criteo.tsv import read_batch
from server import LocalServer, free_ports
from tests.s3_server import CREDENTIALS, keys, s3_endpoint

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]  # the start_triton fixture of conftest.py
BUCKET = "models"
PREFIX = "ctr/model_repository"


def _run(*args: str) -> str:
    command = [sys.executable, "-m", *args]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **CREDENTIALS}, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Path:
    """dlrm_onnx alone (FP32, tiny preset): trained and exported in seconds."""
    root = tmp_path_factory.mktemp("s3-export")
    train = ["--data", str(labeled_file), "--preset", "tiny", "--table-size", "500"]
    _run("models", "train", "dlrm", *train, "--out", str(root / "dlrm"))
    _run("export", "dlrm", "--checkpoint", str(root / "dlrm"), "--repository", str(root / "model_repository"),
         "--check-data", str(labeled_file), "--check-rows", "1024", "--no-fp16", "--no-int8")  # fmt: skip
    return root / "model_repository"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with the bucket; the credentials in this process's environment,
    so that the tritonservers started here read them."""
    with s3_endpoint(BUCKET) as address:
        yield address


@pytest.fixture(scope="module")
def published(repository: Path, endpoint: str) -> str:
    """The repository published with the CLI; its s3:// URL."""
    url = f"s3://{endpoint}/{BUCKET}/{PREFIX}"
    output = _run("export", "publish", "--repository", str(repository), "--to", url)
    assert f"python -m server serve --repository {url}" in output
    local = sorted(p.relative_to(repository).as_posix() for p in repository.rglob("*") if p.is_file())
    assert keys(endpoint, BUCKET, PREFIX + "/") == [f"{PREFIX}/{name}" for name in local]
    return url


def test_served_from_s3_equals_in_process_over_http_and_grpc(
    start_triton: StartTriton, published: str, repository: Path, labeled_file: Path
) -> None:
    server = start_triton(published)
    try:
        assert server.config.remote
        # The raw-row ensembles (the model's, and the family's over it) load from S3 too.
        served = ["criteo_rows", "dlrm_onnx", "dlrm_onnx_raw", "dlrm_raw"]
        assert [(m.name, m.state) for m in server.models()] == [(name, "READY") for name in served]
        (result,) = verify_repository(
            repository, server.http_url, server.grpc_url, read_batch(labeled_file, 64)
        )
        assert result.rows == 64
        assert result.http_max_abs_diff <= 1e-6 and result.grpc_max_abs_diff <= 1e-6, result
        assert f"--model-repository={published}" in server.log_file.read_text()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("unreachable", "cannot reach the S3 endpoint 127.0.0.1:{closed} of the model repository {url}"),
        ("no-bucket", "cannot read the model repository {url}: .*Unable to create S3 filesystem client"),
        (
            "empty-prefix",
            "cannot read the model repository {url}: .*repository path is not a valid directory",
        ),
    ],
)
def test_an_unreadable_repository_fails_the_start_with_tritons_reason(
    start_triton: StartTriton, endpoint: str, where: str, reason: str
) -> None:
    (closed,) = free_ports(1)
    url = {
        "unreachable": f"s3://127.0.0.1:{closed}/{BUCKET}/{PREFIX}",
        "no-bucket": f"s3://{endpoint}/no-such-bucket/{PREFIX}",
        "empty-prefix": f"s3://{endpoint}/{BUCKET}/never-published",
    }[where]
    started = time.monotonic()
    with pytest.raises(ServerError, match=reason.format(closed=closed, url=re.escape(url))):
        start_triton(url, startup_timeout_s=60)
    assert time.monotonic() - started < 30, "told at once, not after the readiness timeout"


def _read_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def test_cli_serves_an_s3_repository(published: str, tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [
        sys.executable, "-m", "server", "serve", "--repository", published, "--http-port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--log-file", str(tmp_path / "triton.log"),
    ]  # fmt: skip
    errors = tmp_path / "cli.err"
    with errors.open("w") as stderr:
        cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert cli.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(cli.stdout, lines), daemon=True)
    reader.start()
    output: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not output or not output[-1].startswith("stop with"):
            if time.monotonic() > deadline or (cli.poll() is not None and lines.empty()):
                pytest.fail(f"no summary from the CLI: {''.join(output)}{errors.read_text()}")
            with contextlib.suppress(queue.Empty):
                output.append(lines.get(timeout=0.2))
        text = "".join(output)
        assert re.search(r"dlrm_onnx +version 1 +READY", text), text
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0, errors.read_text()
    finally:
        if cli.poll() is None:  # the test failed before a clean stop: the CLI stops its server
            cli.send_signal(signal.SIGTERM)
            try:
                cli.wait(timeout=20)
            except subprocess.TimeoutExpired:
                cli.kill()
                cli.wait()
        reader.join(timeout=5)
        cli.stdout.close()
