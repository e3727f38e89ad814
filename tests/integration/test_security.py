"""The admin APIs behind a key, on the real local tritonserver.

With ``ServerConfig.admin_key`` set, the model-repository (load, unload,
index), shared-memory, trace and logging APIs answer only requests that carry
the key (HTTP header ``admin-key``; gRPC metadata ``triton-grpc-protocol-admin-key``);
health, metadata, model config, statistics and inference stay open.
tritonserver refuses an unauthenticated call with HTTP 403, or gRPC
UNAVAILABLE, "... is restricted, expecting header ...".
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.errors import ClientError, ConfigError
from clients.aio import AsyncTritonClient
from clients.reference import OnnxReference
from clients.shm import SystemRegion
from clients.triton import TritonClient
from criteo.tsv import Batch, read_batch
from server import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_ADMIN_HEADER, LocalServer, ServerConfig, free_ports
from server.installation import TritonInstallation
from server.security import generate_admin_key, read_admin_key

StartTriton = Callable[..., LocalServer]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOADED, UNLOADED = "dlrm_onnx", "wide_deep_onnx"
REFUSED = {
    "http": ("403", rf"This API is restricted, expecting header '{ADMIN_HEADER}'"),
    "grpc": (
        "StatusCode.UNAVAILABLE",
        rf"This protocol is restricted, expecting header '{GRPC_ADMIN_HEADER}'",
    ),
}


@pytest.fixture(scope="module")
def admin_key() -> str:
    return generate_admin_key()


@pytest.fixture(scope="module")
def secured(start_triton: StartTriton, exported_repository: Path, admin_key: str) -> Iterator[LocalServer]:
    """Explicit model control, dlrm_onnx loaded, the admin APIs behind ``admin_key``."""
    server = start_triton(
        exported_repository, model_control_mode="explicit", load_models=(LOADED,), admin_key=admin_key
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 16)


def _client(server: LocalServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _assert_refused(protocol: str, call: Callable[[], Any]) -> None:
    status, message = REFUSED[protocol]
    with pytest.raises(InferenceServerException, match=message) as refusal:
        call()
    assert str(refusal.value.status()) == status


def _wait_unloaded(server: LocalServer, model: str, timeout_s: float = 30.0) -> None:
    """Until the index says ``model`` is unloaded: while it is UNLOADING the server is not ready."""
    deadline = time.monotonic() + timeout_s
    while {m.name: m.state for m in server.models()}[model] != "UNAVAILABLE":
        assert time.monotonic() < deadline, f"{model} still not unloaded after {timeout_s} s"
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unauthenticated_model_load_and_unload_are_refused(secured: LocalServer, protocol: str) -> None:
    client = _client(secured, protocol)
    wrong_key = {name: generate_admin_key() for name in secured.admin_headers(protocol)}
    try:
        for headers in (None, wrong_key):
            _assert_refused(protocol, lambda h=headers: client.load_model(UNLOADED, headers=h))
            _assert_refused(protocol, lambda h=headers: client.unload_model(LOADED, headers=h))
            _assert_refused(protocol, lambda h=headers: client.get_model_repository_index(headers=h))
        # The plain header name does not open gRPC: tritonserver expects its prefixed form.
        if protocol == "grpc":
            plain = {ADMIN_HEADER: secured.config.admin_key}
            _assert_refused(protocol, lambda: client.load_model(UNLOADED, headers=plain))
        assert client.is_model_ready(LOADED) and not client.is_model_ready(UNLOADED)
    finally:
        client.close()
    states = {model.name: model.state for model in secured.models()}
    assert states[LOADED] == "READY" and states[UNLOADED] != "READY"


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_authenticated_model_load_and_unload_succeed(
    secured: LocalServer, exported_repository: Path, rows: Batch, protocol: str
) -> None:
    headers = secured.admin_headers(protocol)
    client = _client(secured, protocol)
    try:
        client.load_model(UNLOADED, headers=headers)
        assert client.is_model_ready(UNLOADED)
        with TritonClient(secured.grpc_url, "grpc") as inference:
            served = inference.infer(UNLOADED, rows.inputs())
        expected = OnnxReference(exported_repository / UNLOADED / "1" / "model.onnx").predict(rows)
        np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
        client.unload_model(UNLOADED, headers=headers)
        _wait_unloaded(secured, UNLOADED)
        assert client.is_model_ready(LOADED) and not client.is_model_ready(UNLOADED)
    finally:
        client.close()


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_registration_needs_the_key(secured: LocalServer, protocol: str) -> None:
    headers = secured.admin_headers(protocol)
    client = _client(secured, protocol)
    region = SystemRegion(4096)
    try:
        register = client.register_system_shared_memory
        _assert_refused(protocol, lambda: register(region.name, region.key, region.byte_size))
        _assert_refused(protocol, lambda: client.get_system_shared_memory_status())
        register(region.name, region.key, region.byte_size, headers=headers)
        status = client.get_system_shared_memory_status(headers=headers)
        names = [entry["name"] for entry in status] if protocol == "http" else list(status.regions)
        assert region.name in names
        _assert_refused(protocol, lambda: client.unregister_system_shared_memory(region.name))
        client.unregister_system_shared_memory(region.name, headers=headers)
    finally:
        region.destroy()
        client.close()


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_clients_register_shared_memory_with_the_admin_key(
    secured: LocalServer, exported_repository: Path, rows: Batch, admin_key: str, protocol: str
) -> None:
    """Without the key the client's shared-memory request fails with one line that says what to do
    and the server stays up; with it the answer equals ONNX Runtime in-process, sync and async."""
    url = secured.http_url if protocol == "http" else secured.grpc_url
    kind: Any = protocol
    with TritonClient(url, kind, shared_memory="system") as client:
        with pytest.raises(ClientError) as refusal:
            client.infer(LOADED, rows.inputs())
        assert "restricts shared-memory registration to its admin key" in str(refusal.value)
        assert "\n" not in str(refusal.value) and admin_key not in str(refusal.value)
    expected = OnnxReference(exported_repository / LOADED / "1" / "model.onnx").predict(rows)
    with TritonClient(url, kind, shared_memory="system", admin_key=admin_key) as client:
        np.testing.assert_allclose(client.infer(LOADED, rows.inputs()).ravel(), expected.ravel(), atol=1e-6)
        assert admin_key not in repr(client.options)

    async def infer_async() -> np.ndarray:
        async with AsyncTritonClient(url, kind, shared_memory="system", admin_key=admin_key) as client:
            return await client.infer(LOADED, rows.inputs())

    np.testing.assert_allclose(asyncio.run(infer_async()).ravel(), expected.ravel(), atol=1e-6)
    with TritonClient(url, kind) as client:
        assert client.is_ready()


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inference_health_metadata_config_and_statistics_stay_open(
    secured: LocalServer, exported_repository: Path, rows: Batch, protocol: str
) -> None:
    url = secured.http_url if protocol == "http" else secured.grpc_url
    # The validating client reads the model's metadata and config before it infers.
    with TritonClient(url, protocol, validate=True) as client:  # type: ignore[arg-type]
        assert client.server_live() and client.server_ready() and client.model_ready(LOADED)
        served = client.infer(LOADED, rows.inputs())
        assert client.statistics(LOADED)[0].success_count >= 1
    expected = OnnxReference(exported_repository / LOADED / "1" / "model.onnx").predict(rows)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)


@pytest.mark.integration
def test_admin_key_stays_out_of_the_log_and_the_config_repr(secured: LocalServer, admin_key: str) -> None:
    text = secured.log_file.read_text()
    assert "--http-restricted-api=model-repository,shared-memory,trace,logging:admin-key=<admin-key>" in text
    assert admin_key not in text
    assert admin_key not in repr(secured.config)
    # The documented trade-off: tritonserver reads the key from its argv only, so
    # whoever may read this process's /proc/<pid>/cmdline (ps) can see it.
    assert secured.pid is not None
    assert any(admin_key in arg for arg in psutil.Process(secured.pid).cmdline())


# ----------------------------------------------------------------- configuration (no server)
def _installation() -> TritonInstallation:
    paths = {name: Path(f"/opt/triton/{name}") for name in TritonInstallation.__dataclass_fields__}
    return TritonInstallation(**paths)


def test_restriction_flags_carry_the_key_on_both_endpoints(tmp_path: Path) -> None:
    key = generate_admin_key()
    config = ServerConfig(tmp_path, admin_key=key, restricted_apis=("model-repository", "shared-memory"))
    command = LocalServer(config).command(_installation(), tmp_path / "backends")
    assert f"--http-restricted-api=model-repository,shared-memory:admin-key={key}" in command
    assert f"--grpc-restricted-protocol=model-repository,shared-memory:admin-key={key}" in command
    unrestricted = LocalServer(ServerConfig(tmp_path)).command(_installation(), tmp_path / "backends")
    assert not [arg for arg in unrestricted if "restricted" in arg]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"admin_key": "too-short"}, "at least 16 characters, got 9"),
        ({"admin_key": "a" * 20 + ":b=c"}, "may hold only letters, digits"),
        ({"admin_key": "a" * 20, "restricted_apis": ("model-repository", "admin")}, "unknown API group"),
        ({"admin_key": "a" * 20, "restricted_apis": ()}, "at least one API group"),
        ({"address": "0.0.0.0"}, "address 0.0.0.0 exposes the admin APIs"),
        ({"extra_args": ("--http-restricted-api=model-repository:k=v",)}, "must not set --http-restricted"),
        ({"extra_args": ("--grpc-restricted-protocol=trace:k=v",)}, "must not set --grpc-restricted"),
    ],
)
def test_config_refuses_weak_keys_and_open_admin_apis_beyond_loopback(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as refusal:
        ServerConfig(tmp_path, **options)
    key = options.get("admin_key")
    assert not key or key not in str(refusal.value)


def test_config_serves_beyond_loopback_with_a_key_or_when_allowed(tmp_path: Path) -> None:
    assert ServerConfig(tmp_path, address="0.0.0.0", admin_key=generate_admin_key()).restricted
    assert not ServerConfig(tmp_path, address="0.0.0.0", allow_open_admin_apis=True).restricted
    assert not ServerConfig(tmp_path, address="127.0.0.2").restricted  # all of 127/8 is loopback


def test_admin_key_is_read_from_the_environment_or_a_file(tmp_path: Path) -> None:
    key = generate_admin_key()
    assert read_admin_key(environ={}) is None
    assert read_admin_key(environ={ADMIN_KEY_ENV: "  "}) is None
    assert read_admin_key(environ={ADMIN_KEY_ENV: key}) == key
    key_file = tmp_path / "admin.key"
    key_file.write_text(f"{key}\n")
    assert read_admin_key(key_file, environ={ADMIN_KEY_ENV: "ignored-when-a-file-is-given"}) == key
    key_file.write_text("short\n")
    with pytest.raises(ConfigError, match=r"admin key file .*admin\.key: .*at least 16 characters"):
        read_admin_key(key_file)
    with pytest.raises(ConfigError, match="cannot read the admin key file"):
        read_admin_key(tmp_path / "missing.key")
    with pytest.raises(ConfigError, match=rf"\${ADMIN_KEY_ENV}: .*at least 16"):
        read_admin_key(environ={ADMIN_KEY_ENV: "short"})


# ------------------------------------------------------------------------------------- CLI
def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def _index_status(port: int, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("POST", "/v2/repository/index", body=b"", headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.integration
def test_cli_serve_takes_the_key_from_the_environment(exported_repository: Path, tmp_path: Path) -> None:
    key = generate_admin_key()
    http_port, grpc_port, metrics_port = free_ports(3)
    log = tmp_path / "triton.log"
    command = [
        sys.executable, "-m", "server", "serve", "--repository", str(exported_repository),
        "--model-control-mode", "explicit", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port), "--log-file", str(log),
    ]  # fmt: skip
    env = {**os.environ, ADMIN_KEY_ENV: key}
    errors = tmp_path / "cli.err"
    with errors.open("w") as stderr:
        cli = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
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
        assert "admin APIs (model-repository, shared-memory, trace, logging) need the key" in text
        assert _index_status(http_port, {}) == 403
        assert _index_status(http_port, {ADMIN_HEADER: key}) == 200
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
    for where in (text, errors.read_text(), log.read_text()):
        assert key not in where


@pytest.mark.integration
def test_infer_cli_takes_the_admin_key_from_the_environment(
    secured: LocalServer, labeled_file: Path, admin_key: str, tmp_path: Path
) -> None:
    args = [sys.executable, "-m", "clients", "infer", "--model", LOADED, "--input", str(labeled_file)]
    args += ["--url", secured.grpc_url, "--shared-memory", "system", "--max-rows", "64"]
    args += ["--output", str(tmp_path / "p.csv")]
    env = {k: v for k, v in os.environ.items() if k != ADMIN_KEY_ENV}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    refused = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--admin-key" in lines[0], refused.stderr
    accepted = subprocess.run(
        args, capture_output=True, text=True, env={**env, ADMIN_KEY_ENV: admin_key}, timeout=120, check=False
    )
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "click_probability"
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 1 + 64
