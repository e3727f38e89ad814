"""``python -m export publish`` and ``python -m export fetch``: a model repository to and from S3.

The command line of :mod:`export.publish`; ``python -m export`` mounts both commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bundle.options import Repository, RepositoryOut
from bundle.s3 import S3Url
from export.publish import TransferResult, fetch_repository, publish_repository

_URL_HELP = (
    "s3://bucket/prefix (AWS; region from AWS_DEFAULT_REGION), or s3://host:port/bucket/prefix for another "
    "S3-compatible endpoint (s3://https://host:port/... over TLS): the form tritonserver serves from."
)


def _print(action: str, result: TransferResult) -> None:
    deleted = f", {result.deleted} stale objects deleted" if result.deleted else ""
    print(f"{action} {result.files} files ({result.bytes / 2**20:.1f} MiB) {result.url}{deleted}")


def publish(
    repository: Repository[Path],
    to: Annotated[str, typer.Option("--to", help=f"Where to: {_URL_HELP}")],
    delete: Annotated[
        bool,
        typer.Option("--delete", help="Also remove objects under the prefix that the folder does not hold."),
    ] = False,
) -> None:
    """Upload a model repository to S3-compatible storage (credentials: AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY, or a profile); then serve it with `python -m server serve --repository URL`
    or the Kubernetes manifests in deploy/k8s."""
    url = S3Url.parse(to)
    result = publish_repository(repository, url, delete=delete)
    _print("published", result)
    print(f"serve it: python -m server serve --repository {url}")


def fetch(
    source: Annotated[str, typer.Option("--from", help=f"Where from: {_URL_HELP}")],
    repository: RepositoryOut,
) -> None:
    """Download a model repository from S3-compatible storage into a folder (--repository)."""
    result = fetch_repository(S3Url.parse(source), repository)
    _print("fetched", result)
