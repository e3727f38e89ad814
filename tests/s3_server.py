"""An S3-compatible server on loopback for tests: moto's server (``moto[s3]``), in this process.

Usage::

    with s3_server() as endpoint:      # "127.0.0.1:PORT"
        create_bucket(endpoint, "models")
        url = f"s3://{endpoint}/models/ctr"   # tritonserver's form for a custom endpoint

moto accepts any credentials; :data:`CREDENTIALS` are the ones the tests put in the
environment (boto3 and tritonserver both read them from there).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test-access-key",
    "AWS_SECRET_ACCESS_KEY": "test-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """Run moto's S3 server on a free port of 127.0.0.1; yields ``host:port``; stops it on exit."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"{host}:{port}"
    finally:
        server.stop()


#: The models of :func:`two_model_repository`.
MODELS = ("dlrm_onnx", "wide_deep_onnx")


@contextlib.contextmanager
def s3_endpoint(*buckets: str) -> Iterator[str]:
    """:func:`s3_server` with :data:`CREDENTIALS` in this process's environment for its duration (so
    that boto3, and the tritonservers and commands started here, read them) and ``buckets`` made."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)
        with s3_server() as address:
            for bucket in buckets:
                create_bucket(address, bucket)
            yield address


def two_model_repository(repository: Path, parameters: dict[str, str] | None = None) -> Path:
    """A repository of ``dlrm_onnx`` and ``wide_deep_onnx`` at ``repository`` to publish and fetch:
    configs (with ``parameters``) and random model files; no server reads it."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    for name in MODELS:
        config = model_config_pb2.ModelConfig(name=name, backend="onnxruntime", max_batch_size=8)
        for key, value in (parameters or {}).items():
            config.parameters[key].string_value = value
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(text_format.MessageToString(config))
        (repository / name / "1" / "model.onnx").write_bytes(os.urandom(3000) + name.encode())
    return repository


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its path from there, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def client(endpoint: str) -> Any:
    """A boto3 S3 client of the server at ``endpoint`` with :data:`CREDENTIALS`."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://{endpoint}",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    )


def create_bucket(endpoint: str, bucket: str) -> None:
    client(endpoint).create_bucket(Bucket=bucket)


def keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every object key under ``prefix``, sorted."""
    pages = client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))
