"""Files that set-up fetches from outside pip: downloaded, checked against a pinned SHA-256, and read
out of a Debian package without installing it (no root, no dpkg).

A Debian pin is one line of a requirements file, a comment to pip::

    # deb http://deb.debian.org/debian/pool/main/.../NAME_VERSION_amd64.deb sha256=HEX

A ``.deb`` is an ar archive whose ``data.tar.xz`` (or ``.gz``, or an uncompressed ``data.tar``)
holds the files the package installs, under paths such as ``./usr/bin/NAME``;
:func:`deb_file` reads one of them. Python 3.11's standard library reads no zstd, so a
``data.tar.zst`` (Ubuntu's packages since 21.10; Debian's use xz) is refused in one line.

Every failure is a :class:`~bundle.errors.BundleError` of one line: the download, the hash, an
archive that is no Debian package, a file the package does not hold.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import lzma
import posixpath
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bundle.errors import BundleError, ConfigError

#: ``# deb URL sha256=HEX``: the pin of one Debian package in a requirements file.
DEB_PIN_LINE = re.compile(r"^#\s*deb\s+(?P<url>\S+)\s+sha256=(?P<sha256>[0-9a-f]{64})\s*$")
_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60
#: How each data archive a ``.deb`` may hold is opened by tarfile (the member's name, its mode).
_DATA_ARCHIVES = {"data.tar": "r:", "data.tar.gz": "r:gz", "data.tar.xz": "r:xz", "data.tar.bz2": "r:bz2"}


@dataclass(frozen=True)
class DebPin:
    """One Debian package, by URL and SHA-256.

    Attributes:
        url: where to download it (``http``, ``https`` or ``file``).
        sha256: its SHA-256, 64 lower-case hex digits.
    """

    url: str
    sha256: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ConfigError(f"a SHA-256 is 64 lower-case hex digits, not {self.sha256!r}")
        if not self.url.endswith(".deb"):
            raise ConfigError(f"a Debian package's URL ends in .deb: {self.url}")

    @property
    def filename(self) -> str:
        """The package's file name, unquoted (``prometheus_2.42.0+ds-5+deb12u1_amd64.deb``)."""
        return _filename(self.url)


def _filename(url: str) -> str:
    return urllib.parse.unquote(posixpath.basename(urllib.parse.urlsplit(url).path))


def parse_deb_pin(line: str) -> DebPin | None:
    """The pin a ``# deb URL sha256=HEX`` line holds; None for any other line."""
    match = DEB_PIN_LINE.match(line.strip())
    return DebPin(match["url"], match["sha256"]) if match else None


def read_deb_pin(path: Path) -> DebPin:
    """The one Debian pin of the requirements file ``path``.

    Raises:
        ConfigError: the file holds no ``# deb URL sha256=...`` line, or more than one.
    """
    pins = [pin for line in path.read_text().splitlines() if (pin := parse_deb_pin(line))]
    if len(pins) != 1:
        raise ConfigError(f"{path} must hold one '# deb URL sha256=...' line, not {len(pins)}")
    return pins[0]


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{count / 1e3:.0f} kB"


def download(url: str, progress: Callable[[str], None] = lambda _: None, timeout_s: float = 60.0) -> bytes:
    """The bytes at ``url``; ``progress`` gets one line, with the size, before the body is read.

    Raises:
        BundleError: the URL cannot be reached or read (no network, HTTP 404, a cut connection).
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            size = f" ({_size(int(length))})" if length and length.isdigit() else ""
            host = urllib.parse.urlsplit(url).netloc
            progress(
                f"downloading {_filename(url)}{size} from {host}" if host else f"downloading {url}{size}"
            )
            return bytes(response.read())
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # HTTPError's own text has the status ("HTTP Error 404: Not Found"); a URLError's is in its reason.
        reason = exc if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", None) or exc
        why = " ".join(str(reason).split()) or type(exc).__name__
        raise BundleError(f"cannot download {url}: {why}") from None


def check_sha256(data: bytes, sha256: str, what: str) -> bytes:
    """``data``, once its SHA-256 is ``sha256``.

    Raises:
        BundleError: it is not; the line names ``what``, both hashes, and that nothing was unpacked.
    """
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise BundleError(f"{what} has SHA-256 {digest}, expected {sha256}: not unpacked")
    return data


def _ar_members(archive: bytes, what: str) -> Iterator[tuple[str, bytes]]:
    """Each member of an ar archive (a ``.deb``), as its name and its bytes."""
    if not archive.startswith(_AR_MAGIC):
        raise BundleError(f"{what} is not a Debian package (no ar archive header)")
    offset = len(_AR_MAGIC)
    while offset < len(archive):
        header = archive[offset : offset + _AR_HEADER]
        size_field = header[48:58].decode("ascii", "replace").strip()
        if len(header) < _AR_HEADER or header[58:60] != b"`\n" or not size_field.isdigit():
            raise BundleError(f"{what} is a damaged Debian package (a bad ar header at byte {offset})")
        start, size = offset + _AR_HEADER, int(size_field)
        if start + size > len(archive):
            raise BundleError(f"{what} is a damaged Debian package (cut short at byte {len(archive)})")
        # GNU ar ends a member's name with '/'; the body is padded to an even offset.
        yield header[:16].decode("ascii", "replace").strip().rstrip("/"), archive[start : start + size]
        offset = start + size + size % 2


def deb_file(deb: bytes, path: str, what: str = "the Debian package") -> bytes:
    """The file ``path`` (``usr/bin/promtool``) that the Debian package ``deb`` installs.

    Args:
        deb: the ``.deb`` file's bytes.
        path: the file's path inside the package, without the leading ``/`` or ``./``.
        what: the package, as error lines name it.

    Raises:
        BundleError: ``deb`` is no Debian package, its data archive is damaged or compressed in a
            way the standard library cannot read, or it holds no regular file at ``path``.
    """
    wanted = posixpath.normpath(path).lstrip("/")
    for name, body in _ar_members(deb, what):
        if not name.startswith("data.tar"):
            continue
        mode = _DATA_ARCHIVES.get(name)
        if mode is None:
            raise BundleError(
                f"{what} holds its files in {name}, which Python's standard library cannot read"
            )
        try:
            with tarfile.open(fileobj=io.BytesIO(body), mode=mode) as archive:  # type: ignore[call-overload]
                for info in archive:
                    if posixpath.normpath(info.name).lstrip("/") != wanted:
                        continue
                    handle = archive.extractfile(info) if info.isfile() else None
                    if handle is None:
                        raise BundleError(f"{what}'s /{wanted} is not a regular file")
                    return bytes(handle.read())
        except (tarfile.TarError, lzma.LZMAError, zlib.error, EOFError, OSError) as exc:
            raise BundleError(f"{what}'s {name} is damaged: {' '.join(str(exc).split())}") from None
        raise BundleError(f"{what} holds no /{wanted}")
    raise BundleError(f"{what} holds no data archive (data.tar.*)")


def fetch_deb_file(pin: DebPin, path: str, progress: Callable[[str], None] = lambda _: None) -> bytes:
    """Download the pinned package, check its SHA-256, and return the file ``path`` it installs.

    Raises:
        BundleError: see :func:`download`, :func:`check_sha256` and :func:`deb_file`.
    """
    deb = check_sha256(download(pin.url, progress), pin.sha256, pin.filename)
    return deb_file(deb, path, pin.filename)
