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
from collections.abc import Iterator
from typing import Any

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
