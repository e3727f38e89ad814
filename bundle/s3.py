"""``s3://`` locations of a model repository, in the form tritonserver reads them.

tritonserver takes a repository in S3-compatible object storage as
``--model-repository=s3://bucket/prefix`` (AWS, region from the environment) or
``s3://host:port/bucket/prefix`` (any other endpoint, plain HTTP), or
``s3://https://host:port/bucket/prefix`` (that endpoint over TLS). Publishing
(:mod:`export.publish`) and serving (:mod:`server`) take the same string, so the
URL a user publishes to is the URL they serve from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bundle.errors import ConfigError

SCHEME = "s3://"
#: Bucket names as S3 allows them (3-63 lowercase letters, digits, dots and hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: ``host:port`` of an endpoint other than AWS; tritonserver tells it from a bucket by the port.
_ENDPOINT = re.compile(r"[0-9A-Za-z.-]+:[0-9]{1,5}")
_TLS_PREFIXES = {"https://": "https", "http://": "http"}


def is_s3_url(location: object) -> bool:
    """Whether ``location`` is a string naming an ``s3://`` location (valid or not)."""
    return isinstance(location, str) and location.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    """One repository location in S3-compatible storage.

    Args:
        bucket: the bucket.
        prefix: the key prefix of the repository, without leading or trailing
            ``/``; empty for the bucket's root.
        endpoint: ``host:port`` of an S3-compatible server other than AWS, or
            None for AWS itself.
        protocol: ``http`` or ``https``, how that endpoint is reached
            (tritonserver's default for a custom endpoint is ``http``).
    """

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    protocol: str = "http"

    def __post_init__(self) -> None:
        if not _BUCKET.fullmatch(self.bucket):
            raise ConfigError(
                f"bucket {self.bucket!r} is not a valid S3 bucket name "
                "(3-63 lowercase letters, digits, '.' and '-')"
            )
        if self.prefix != self.prefix.strip("/") or "//" in self.prefix:
            raise ConfigError(f"prefix {self.prefix!r} must have no leading, trailing or double '/'")
        if any(part in (".", "..") for part in self.prefix.split("/")):
            raise ConfigError(f"prefix {self.prefix!r} must not contain '.' or '..' segments")
        if self.endpoint is not None and not _ENDPOINT.fullmatch(self.endpoint):
            raise ConfigError(f"endpoint {self.endpoint!r} must be host:port")
        if self.protocol not in ("http", "https"):
            raise ConfigError(f"protocol must be http or https, got {self.protocol!r}")

    @classmethod
    def parse(cls, url: str) -> S3Url:
        """Parse tritonserver's ``s3://`` repository forms (see the module docstring).

        Raises:
            ConfigError: ``url`` is not one of those forms, or names an invalid bucket.
        """
        if not is_s3_url(url):
            raise ConfigError(
                f"{url!r} is not an S3 URL: expected s3://bucket/prefix or s3://host:port/bucket/prefix"
            )
        rest = url[len(SCHEME) :]
        protocol, explicit = "http", False
        for marker, name in _TLS_PREFIXES.items():
            if rest.startswith(marker):
                protocol, explicit, rest = name, True, rest[len(marker) :]
        first, _, rest = rest.partition("/")
        endpoint = None
        if _ENDPOINT.fullmatch(first):
            endpoint = first
            first, _, rest = rest.partition("/")
        elif explicit:
            raise ConfigError(f"{url!r}: an http:// or https:// endpoint needs host:port before the bucket")
        if not first:
            raise ConfigError(f"{url!r} names no bucket")
        try:
            return cls(bucket=first, prefix=rest.rstrip("/"), endpoint=endpoint, protocol=protocol)
        except ConfigError as exc:
            raise ConfigError(f"{url!r}: {exc}") from None

    @property
    def endpoint_url(self) -> str | None:
        """The endpoint as boto3 takes it (``http://host:port``), or None for AWS."""
        return None if self.endpoint is None else f"{self.protocol}://{self.endpoint}"

    def key(self, relative: str) -> str:
        """The object key of ``relative`` (a ``/``-separated path inside the repository)."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    @property
    def key_prefix(self) -> str:
        """What every key of the repository starts with (``prefix/``, or empty at the root)."""
        return f"{self.prefix}/" if self.prefix else ""

    def __str__(self) -> str:
        """The URL in tritonserver's form (``--model-repository=`` takes it as it is)."""
        where = ""
        if self.endpoint is not None:
            where = ("https://" if self.protocol == "https" else "") + f"{self.endpoint}/"
        return f"{SCHEME}{where}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
