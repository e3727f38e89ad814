"""A model repository to S3-compatible object storage and back, so that replicas serve it from there.

``publish`` uploads a repository folder (as :mod:`export` wrote it, TensorRT
plans included where built) under ``s3://bucket/prefix``; tritonserver then
serves ``--model-repository=s3://bucket/prefix`` unchanged (it downloads the
repository at start). ``fetch`` downloads one into a folder: the Kubernetes gpu
overlay does that before it builds TensorRT plans for the node's GPU.

Uploads and downloads go through boto3 (multipart for large files); the
credentials come from where boto3 finds them (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, a profile, an instance role), the same variables
tritonserver reads.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from bundle.errors import ConfigError, StorageError
from bundle.repository import CONFIG_NAME, read_config
from bundle.s3 import S3Url
from bundle.staging import RepositoryWrite
from export.stage.hot_cold_lookup import PARAM_ROW_STORE

log = logging.getLogger(__name__)

#: Seconds to wait for an endpoint to accept a connection; an unreachable one fails fast.
CONNECT_TIMEOUT_S = 5.0
#: Keys per DeleteObjects call (S3's limit).
_DELETE_BATCH = 1000

T = TypeVar("T")


@dataclass(frozen=True)
class TransferResult:
    """What one publish or fetch moved.

    Args:
        url: the repository's location in object storage.
        files: files uploaded (publish) or downloaded (fetch).
        bytes: their total size.
        deleted: objects under the prefix removed because the folder no longer holds them
            (publish with ``delete``).
    """

    url: S3Url
    files: int
    bytes: int
    deleted: int = 0


def _client(url: S3Url) -> Any:
    """A boto3 S3 client for ``url``'s endpoint (AWS when it names none)."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=60,
        retries={"max_attempts": 2, "mode": "standard"},
        # Custom endpoints (MinIO, Ceph, moto) route buckets by path, not by DNS name.
        s3={"addressing_style": "path" if url.endpoint else "auto"},
    )
    return boto3.session.Session().client("s3", endpoint_url=url.endpoint_url, config=config)


def _where(url: S3Url) -> str:
    return url.endpoint_url or "AWS S3"


def _call(url: S3Url, action: str, function: Callable[[], T]) -> T:
    """Run one S3 call; turn botocore's failures into one line naming what to fix."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        return function()
    except EndpointConnectionError as exc:
        raise StorageError(f"cannot reach the S3 endpoint {_where(url)} to {action}: {exc}") from None
    except (NoCredentialsError, PartialCredentialsError):
        raise StorageError(
            f"no S3 credentials to {action} {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE)"
        ) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            raise StorageError(f"bucket {url.bucket!r} does not exist at {_where(url)}") from None
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise StorageError(
                f"{_where(url)} refused to {action} {url} ({code}): check the credentials and the "
                "bucket's policy"
            ) from None
        raise StorageError(f"could not {action} {url}: {code} {error.get('Message', exc)}") from None
    except S3UploadFailedError as exc:
        raise StorageError(f"could not {action} {url}: {exc}") from None
    except BotoCoreError as exc:
        raise StorageError(f"could not {action} {url} at {_where(url)}: {exc}") from None


def _check_bucket(client: Any, url: S3Url, action: str) -> None:
    _call(url, action, lambda: client.head_bucket(Bucket=url.bucket))


def _repository_files(repository: Path) -> list[tuple[str, Path]]:
    """``(relative posix path, file)`` of every file under ``repository``, in upload order: model by
    model, each model's version folders (weights, row store) before the files beside them
    (``config.pbtxt`` last), so that a model whose upload was cut short keeps its old config."""
    files = []
    for path in repository.rglob("*"):
        if path.is_file():
            files.append((path.relative_to(repository).as_posix(), path))

    def order(item: tuple[str, Path]) -> tuple[str, int, str]:
        parts = item[0].split("/")
        beside = len(parts) == 2  # <model>/<file>: its config and report
        return parts[0], (2 if parts[-1] == CONFIG_NAME else 1) if beside else 0, item[0]

    return sorted(files, key=order)


def check_repository(repository: Path) -> list[str]:
    """The model names of a repository folder, checked for publishing.

    Raises:
        ConfigError: the folder does not exist, or holds no ``<model>/config.pbtxt``.
    """
    if not repository.is_dir():
        what = "is not a directory" if repository.exists() else "does not exist"
        raise ConfigError(f"model repository {repository} {what}")
    models = sorted(path.parent.name for path in repository.glob(f"*/{CONFIG_NAME}"))
    if not models:
        raise ConfigError(f"model repository {repository} holds no <model>/{CONFIG_NAME}: nothing to publish")
    for model in models:
        config = read_config(repository / model / CONFIG_NAME)
        parameter = config.parameters.get(PARAM_ROW_STORE)
        store = parameter.string_value if parameter is not None else ""
        if store and PurePosixPath(store).is_absolute():
            # A store outside the repository is not published: each replica must mount it there.
            log.warning(
                "%s reads its row store from %s, outside the repository: it is not uploaded, and every "
                "replica must mount it at that path",
                model,
                store,
            )
    return models


def _remote_keys(client: Any, url: S3Url) -> Iterator[tuple[str, int]]:
    """``(key, size)`` of every object under the repository's prefix."""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=url.bucket, Prefix=url.key_prefix):
        for item in page.get("Contents", []):
            yield str(item["Key"]), int(item["Size"])


def publish_repository(repository: Path, url: S3Url, delete: bool = False) -> TransferResult:
    """Upload every file of ``repository`` to ``url`` (the key of each is its path inside the folder).

    Object storage has no rename, so a publish is not all-or-nothing across objects: each object
    is replaced whole, model by model, a model's weights before its ``config.pbtxt``, and stale
    objects (``delete``) go last, after every upload succeeded. A replica that starts while a
    publish runs may see some models old and some new. To switch replicas at once, publish each
    release under a prefix of its own (``s3://bucket/releases/<id>``) and roll the deployment's
    ``--model-repository`` to it; ``fetch`` into a folder is all-or-nothing.

    Args:
        repository: a model repository folder.
        url: where it goes; the bucket must exist.
        delete: also remove objects under the prefix that the folder no longer holds
            (like ``aws s3 sync --delete``), so a model or version removed locally is
            not served from storage.

    Returns:
        What was uploaded (and deleted).

    Raises:
        ConfigError: the folder is no model repository.
        StorageError: the endpoint is unreachable, the bucket is missing, or the credentials
            are missing or refused.
    """
    models = check_repository(repository)
    client = _client(url)
    _check_bucket(client, url, "publish to")
    files = _repository_files(repository)
    total = 0
    for relative, path in files:
        key = url.key(relative)
        _call(url, "upload to", functools.partial(client.upload_file, str(path), url.bucket, key))
        total += path.stat().st_size
    deleted = 0
    if delete:
        wanted = {url.key(relative) for relative, _ in files}
        stored = _call(url, "list", lambda: list(_remote_keys(client, url)))
        stale = [key for key, _ in stored if key not in wanted]
        for start in range(0, len(stale), _DELETE_BATCH):
            batch = [{"Key": key} for key in stale[start : start + _DELETE_BATCH]]
            request = {"Bucket": url.bucket, "Delete": {"Objects": batch}}
            _call(url, "delete from", functools.partial(client.delete_objects, **request))
        deleted = len(stale)
    log.info("published %d models (%d files, %d bytes) to %s", len(models), len(files), total, url)
    return TransferResult(url=url, files=len(files), bytes=total, deleted=deleted)


def fetch_repository(url: S3Url, target: Path) -> TransferResult:
    """Download the repository at ``url`` into the folder ``target`` (created), all or nothing.

    The objects download into a staging folder beside ``target``
    (:class:`bundle.staging.RepositoryWrite`); only when all arrived does each model folder
    replace its namesake in ``target`` (other models there stay), one rename each.

    Raises:
        StorageError: as for :func:`publish_repository`, or nothing is stored under the prefix.
    """
    client = _client(url)
    _check_bucket(client, url, "fetch from")
    objects = _call(url, "list", lambda: list(_remote_keys(client, url)))
    objects = [(key, size) for key, size in objects if not key.endswith("/")]
    if not objects:
        raise StorageError(f"{url} holds no objects: publish a repository there first")
    total = 0
    with RepositoryWrite(target, f"fetch {url}") as write:
        root = write.staged.resolve()
        for key, size in objects:
            relative = key[len(url.key_prefix) :]
            path = (root / relative).resolve()
            if not path.is_relative_to(root) or path == root:
                raise StorageError(f"{url}: object {key!r} would be written outside {target}")
            path.parent.mkdir(parents=True, exist_ok=True)
            _call(url, "download from", functools.partial(client.download_file, url.bucket, key, str(path)))
            total += size
        for entry in sorted(root.iterdir()):
            write.put(entry, Path(target) / entry.name)
        write.commit()
    log.info("fetched %d files (%d bytes) from %s into %s", len(objects), total, url, target)
    return TransferResult(url=url, files=len(objects), bytes=total)
