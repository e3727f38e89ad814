"""What set-up fetches from outside pip (bundle/downloads.py): pins, downloads, hashes and the files
of a Debian package, each failure in one line; and ``python -m server promtool install``, which
unpacks promtool from Debian's package into the venv. No network: the packages are built here and
served from ``file://`` URLs."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bundle import downloads
from bundle.errors import BundleError, ConfigError
from server import promtool
from server.__main__ import app as server_app

ROOT = Path(__file__).resolve().parents[2]
FAKE_PROMTOOL = b"#!/bin/sh\necho 'promtool, version 9.9.9 (branch: test)'\n"


def build_deb(
    files: dict[str, bytes], data_name: str = "data.tar.xz", links: dict[str, str] | None = None
) -> bytes:
    """A Debian package: an ar archive of debian-binary, control.tar.xz and ``data_name`` holding
    ``files`` (and symbolic ``links``) under ``./``, as dpkg-deb writes them."""

    def tar(mode: str, members: dict[str, bytes], symlinks: dict[str, str]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode=mode) as archive:  # type: ignore[call-overload]
            for name, body in members.items():
                info = tarfile.TarInfo(f"./{name}")
                info.size, info.mode = len(body), 0o755
                archive.addfile(info, io.BytesIO(body))
            for name, target in symlinks.items():
                info = tarfile.TarInfo(f"./{name}")
                info.type, info.linkname = tarfile.SYMTYPE, target
                archive.addfile(info)
        return out.getvalue()

    compression = {"data.tar.xz": "w:xz", "data.tar.gz": "w:gz", "data.tar": "w"}.get(data_name)
    data = tar(compression, files, links or {}) if compression else b"not read"
    control = tar("w:xz", {"control": b"Package: test\n"}, {})
    deb = b"!<arch>\n"
    for name, body in (("debian-binary", b"2.0\n"), ("control.tar.xz", control), (data_name, data)):
        deb += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body
        deb += b"\n" if len(body) % 2 else b""
    return deb


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert text and "\n" not in text, f"not one line: {text!r}"
    return text


@pytest.mark.parametrize("data_name", ["data.tar.xz", "data.tar.gz", "data.tar"])
def test_a_file_is_read_by_its_path_out_of_the_packages_data_archive(data_name: str) -> None:
    deb = build_deb({"usr/bin/promtool": b"ELF promtool", "usr/bin/prometheus": b"ELF prometheus"}, data_name)
    assert downloads.deb_file(deb, "usr/bin/promtool") == b"ELF promtool"
    assert downloads.deb_file(deb, "/usr/bin/prometheus") == b"ELF prometheus"


def test_a_file_the_package_does_not_hold_is_refused_in_one_line() -> None:
    deb = build_deb({"usr/bin/prometheus": b"ELF"}, links={"usr/bin/promtool": "prometheus"})
    with pytest.raises(BundleError) as error:
        downloads.deb_file(deb, "usr/bin/other", "prometheus.deb")
    assert _one_line(error) == "prometheus.deb holds no /usr/bin/other"
    # The same name elsewhere in the package is not the file asked for.
    with pytest.raises(BundleError, match="holds no /bin/prometheus"):
        downloads.deb_file(deb, "bin/prometheus")
    with pytest.raises(BundleError) as error:
        downloads.deb_file(deb, "usr/bin/promtool", "prometheus.deb")
    assert _one_line(error) == "prometheus.deb's /usr/bin/promtool is not a regular file"


@pytest.mark.parametrize(
    ("deb", "reason"),
    [
        (os.urandom(4096), "x.deb is not a Debian package (no ar archive header)"),
        (b"PK\x03\x04" + b"\0" * 100, "x.deb is not a Debian package (no ar archive header)"),
        (
            b"!<arch>\n" + b"debian-binary   garbage",
            "x.deb is a damaged Debian package (a bad ar header at byte 8)",
        ),
        (
            build_deb({"usr/bin/promtool": b"ELF"})[:-40],
            "x.deb is a damaged Debian package (cut short at byte",
        ),
        (
            build_deb({"usr/bin/promtool": b"ELF"}, "data.tar.zst"),
            "x.deb holds its files in data.tar.zst, which",
        ),
    ],
    ids=["random bytes", "a zip", "a bad header", "cut short", "zstd"],
)
def test_what_is_no_readable_debian_package_is_refused_in_one_line(deb: bytes, reason: str) -> None:
    with pytest.raises(BundleError) as error:
        downloads.deb_file(deb, "usr/bin/promtool", "x.deb")
    assert _one_line(error).startswith(reason)


def test_a_damaged_data_archive_is_refused_in_one_line() -> None:
    deb = bytearray(build_deb({"usr/bin/promtool": os.urandom(2000)}))
    start = deb.index(b"data.tar.xz") + 60
    deb[start + 40 : start + 80] = b"\0" * 40  # inside the xz stream, past its header
    with pytest.raises(BundleError) as error:
        downloads.deb_file(bytes(deb), "usr/bin/promtool", "x.deb")
    assert _one_line(error).startswith("x.deb's data.tar.xz is damaged: ")


def test_a_hash_that_does_not_match_is_refused_in_one_line() -> None:
    data = b"the package"
    assert downloads.check_sha256(data, hashlib.sha256(data).hexdigest(), "x.deb") == data
    with pytest.raises(BundleError) as error:
        downloads.check_sha256(data, "0" * 64, "x.deb")
    digest = hashlib.sha256(data).hexdigest()
    assert _one_line(error) == f"x.deb has SHA-256 {digest}, expected {'0' * 64}: not unpacked"


def test_a_download_says_its_size_first_and_a_failed_one_says_why_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.deb"
    path.write_bytes(b"x" * 2_500_000)
    lines: list[str] = []
    assert downloads.download(path.as_uri(), lines.append) == path.read_bytes()
    assert lines == [f"downloading {path.as_uri()} (2.5 MB)"]
    missing = (tmp_path / "missing.deb").as_uri()
    with pytest.raises(BundleError) as error:
        downloads.download(missing)
    assert _one_line(error).startswith(f"cannot download {missing}: ")
    with pytest.raises(BundleError, match="cannot download nowhere: unknown url type"):
        downloads.download("nowhere")


def test_the_pin_is_one_deb_line_of_a_requirements_file(tmp_path: Path) -> None:
    for name in ("requirements-promtool.txt", "requirements-perf-analyzer.txt"):
        pin = downloads.read_deb_pin(ROOT / name)
        assert pin.url.startswith("http://deb.debian.org/debian/pool/main/") and len(pin.sha256) == 64
    assert downloads.read_deb_pin(ROOT / "requirements-promtool.txt").filename == (
        "prometheus_2.42.0+ds-5+deb12u1_amd64.deb"
    )
    path = tmp_path / "pins.txt"
    path.write_text("# deb http://example.org/x.deb sha256=nothex\nrequests==2.0\n")
    with pytest.raises(ConfigError, match=r"must hold one '# deb URL sha256=\.\.\.' line, not 0"):
        downloads.read_deb_pin(path)
    line = f"# deb http://example.org/x.deb sha256={'a' * 64}"
    path.write_text(f"{line}\n{line}\n")
    with pytest.raises(ConfigError, match="not 2"):
        downloads.read_deb_pin(path)
    with pytest.raises(ConfigError, match=r"ends in \.deb"):
        downloads.DebPin("http://example.org/x.tar", "a" * 64)


def test_a_pinned_package_is_fetched_checked_and_its_file_read(tmp_path: Path) -> None:
    deb = tmp_path / "prometheus_1+ds_amd64.deb"
    deb.write_bytes(build_deb({"usr/bin/promtool": b"ELF"}))
    good = downloads.DebPin(deb.as_uri(), hashlib.sha256(deb.read_bytes()).hexdigest())
    assert good.filename == "prometheus_1+ds_amd64.deb"
    assert downloads.fetch_deb_file(good, "usr/bin/promtool") == b"ELF"
    with pytest.raises(BundleError, match=r"^prometheus_1\+ds_amd64\.deb has SHA-256 .*: not unpacked$"):
        downloads.fetch_deb_file(downloads.DebPin(deb.as_uri(), "0" * 64), "usr/bin/promtool")


# python -m server promtool install


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A venv's folder for the install to write into."""
    prefix = tmp_path / "venv"
    monkeypatch.setattr(promtool, "venv_promtool", lambda prefix_=None: prefix / "bin" / "promtool")
    return prefix


def _pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deb: bytes, sha256: str | None = None) -> None:
    """Pin the package ``deb``, served from a file:// URL, as requirements-promtool.txt would."""
    path = tmp_path / "prometheus_2.42.0+ds_amd64.deb"
    path.write_bytes(deb)
    pins = tmp_path / "requirements-promtool.txt"
    pins.write_text(f"# promtool\n# deb {path.as_uri()} sha256={sha256 or hashlib.sha256(deb).hexdigest()}\n")
    monkeypatch.setattr(promtool, "PINS_FILE", pins)


def test_promtool_install_unpacks_the_pinned_promtool_into_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, venv: Path
) -> None:
    _pin(tmp_path, monkeypatch, build_deb({"usr/bin/promtool": FAKE_PROMTOOL, "usr/bin/prometheus": b"ELF"}))
    result = CliRunner().invoke(server_app, ["promtool", "install"])
    assert result.exit_code == 0, result.output
    installed = venv / "bin" / "promtool"
    assert installed.read_bytes() == FAKE_PROMTOOL and installed.stat().st_mode & 0o777 == 0o755
    lines = result.output.splitlines()
    assert lines[0].startswith("promtool: downloading file://") and lines[0].endswith(" kB)")
    assert lines[1:] == [f"promtool: {installed} (promtool, version 9.9.9 (branch: test))"]
    assert sorted(p.name for p in installed.parent.iterdir()) == ["promtool"]  # nothing staged is left
    # The tests' promtool is the venv's, unless PROMTOOL names another.
    monkeypatch.delenv("PROMTOOL", raising=False)
    assert promtool.locate() == installed
    monkeypatch.setenv("PROMTOOL", "/elsewhere/promtool")
    assert promtool.locate() == Path("/elsewhere/promtool")


def test_promtool_install_refuses_a_package_whose_hash_does_not_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, venv: Path
) -> None:
    _pin(tmp_path, monkeypatch, build_deb({"usr/bin/promtool": FAKE_PROMTOOL}), sha256="0" * 64)
    result = CliRunner().invoke(server_app, ["promtool", "install"])
    assert result.exit_code != 0 and isinstance(result.exception, BundleError)
    assert "has SHA-256" in str(result.exception) and "expected 0000" in str(result.exception)
    # --optional: one line saying it is not installed and why, exit 0, so set-up goes on.
    result = CliRunner().invoke(server_app, ["promtool", "install", "--optional"])
    assert result.exit_code == 0, result.output
    (last,) = [line for line in result.output.splitlines() if not line.startswith("promtool: downloading")]
    assert last.startswith("promtool not installed: prometheus_2.42.0+ds_amd64.deb has SHA-256 ")
    assert last.endswith("; the promtool tests of tests/unit/test_alerts.py will skip")
    assert not (venv / "bin" / "promtool").exists()


def test_promtool_install_keeps_no_binary_that_does_not_run_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, venv: Path
) -> None:
    earlier = venv / "bin" / "promtool"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(FAKE_PROMTOOL)
    _pin(
        tmp_path,
        monkeypatch,
        build_deb({"usr/bin/promtool": b"#!/bin/sh\necho 'no such option' >&2; exit 2\n"}),
    )
    result = CliRunner().invoke(server_app, ["promtool", "install", "--optional"])
    assert result.exit_code == 0, result.output
    assert (
        "is not a working promtool: exit code 2, said 'no such option'; the promtool tests" in result.output
    )
    assert earlier.read_bytes() == FAKE_PROMTOOL  # the earlier one stays
    assert sorted(p.name for p in earlier.parent.iterdir()) == ["promtool"]


def test_promtool_install_without_network_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, venv: Path
) -> None:
    pins = tmp_path / "requirements-promtool.txt"
    pins.write_text(f"# deb {(tmp_path / 'gone.deb').as_uri()} sha256={'a' * 64}\n")
    monkeypatch.setattr(promtool, "PINS_FILE", pins)
    result = CliRunner().invoke(server_app, ["promtool", "install", "--optional"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.splitlines()
    assert line.startswith(f"promtool not installed: cannot download {(tmp_path / 'gone.deb').as_uri()}: ")
