"""The compiled stages as built files: what the backend library exports and leaves to the server,
how the local server's backend directory gets them, and the config reader they share (its test
driver against Python's json on the same texts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.installation import COMPILED_STAGES, TritonInstallation

LIBRARY = COMPILED_STAGES / "raw_rows" / "libtriton_raw_rows.so"
JSON_DRIVER = Path(os.environ.get("STAGES_JSON_DRIVER", COMPILED_STAGES / "common" / "json_driver"))
ENTRY_POINTS = {
    "TRITONBACKEND_Initialize",
    "TRITONBACKEND_ModelInitialize",
    "TRITONBACKEND_ModelFinalize",
    "TRITONBACKEND_ModelInstanceInitialize",
    "TRITONBACKEND_ModelInstanceFinalize",
    "TRITONBACKEND_ModelInstanceExecute",
}


def _symbols(*options: str) -> set[str]:
    done = subprocess.run(["nm", "-D", *options, str(LIBRARY)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.skipif(
    not LIBRARY.is_file(), reason=f"the compiled stages are not built ({LIBRARY}): run `make stages`"
)
@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_the_backend_exports_its_entry_points_and_links_no_triton_library() -> None:
    """The six entry points are its only exports of the C API; the server's functions stay
    undefined, to resolve when tritonserver opens it (the wheel's core library is renamed)."""
    defined = {name for name in _symbols("--defined-only") if name.startswith("TRITON")}
    assert defined == ENTRY_POINTS
    undefined = {name for name in _symbols("--undefined-only") if name.startswith("TRITON")}
    assert {"TRITONBACKEND_ResponseSend", "TRITONBACKEND_ModelConfig", "TRITONSERVER_ErrorNew"} <= undefined
    needed = subprocess.run(
        ["readelf", "-d", str(LIBRARY)], capture_output=True, text=True, check=True
    ).stdout
    assert "tritonserver" not in needed


def test_the_backend_directory_gets_each_built_stage(tmp_path: Path) -> None:
    wheel = tmp_path / "wheel"
    (wheel / "python").mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py", "stub"):
        (wheel / "python" / name).write_bytes(b"")
    compiled = tmp_path / "build"
    (compiled / "raw_rows").mkdir(parents=True)
    (compiled / "raw_rows" / "libtriton_raw_rows.so").write_bytes(b"ELF")
    (compiled / "raw_rows" / "libraw_rows_parse.a").write_bytes(b"")
    (compiled / "stray").mkdir()
    (compiled / "stray" / "libtriton_other.so").write_bytes(b"")  # not named after its folder
    installation = TritonInstallation(
        binary=wheel / "tritonserver",
        python_backend=wheel / "python",
        stub=wheel / "python" / "stub",
        libraries=wheel,
        caches=wheel,
        python_libdir=wheel,
        python_bin=wheel,
    )
    sources = tmp_path / "backends"
    sources.mkdir()
    target = installation.build_backend_directory(
        tmp_path / "backend-dir", sources=sources, compiled=compiled
    )
    assert (target / "raw_rows" / "libtriton_raw_rows.so").read_bytes() == b"ELF"
    assert sorted(path.name for path in (target / "raw_rows").iterdir()) == ["libtriton_raw_rows.so"]
    assert not (target / "stray").exists()
    assert (target / "python" / "libtriton_python.so").is_file()


class _Number(str):
    """A number as written."""


class _Object(list[tuple[str, Any]]):
    """An object's members in order, repeats kept."""


def _reject(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _canonical(value: Any) -> str:
    """The json driver's canonical form of a value Python's reader gave."""
    if value is None:
        return "n"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, _Number):
        return "#" + value
    if isinstance(value, str):
        return "s" + value.encode("utf-8", "surrogatepass").hex()
    if isinstance(value, _Object):
        members = (
            name.encode("utf-8", "surrogatepass").hex() + ":" + _canonical(item) for name, item in value
        )
        return "{" + ",".join(members) + "}"
    return "[" + ",".join(_canonical(item) for item in value) + "]"


def _python_reads(text: bytes) -> str | None:
    try:
        value = json.loads(
            text.decode("ascii"),
            object_pairs_hook=_Object,
            parse_int=_Number,
            parse_float=_Number,
            parse_constant=_reject,
        )
    except ValueError:
        return None
    return _canonical(value)


def _json_corpus() -> list[bytes]:
    """Configs as tritonserver writes them, then the same texts damaged byte by byte."""
    config = {
        "name": "criteo_rows",
        "max_batch_size": 65536,
        "input": [{"name": "raw_rows", "data_type": "TYPE_STRING", "dims": ["1"]}],
        "output": [
            {"name": "dense_features", "data_type": "TYPE_FP32", "dims": [13]},
            {"name": "categorical_ids", "data_type": "TYPE_INT64", "dims": [26], "x": -1.5e-3},
        ],
        "parameters": {"note": 'tab\t "quoted" \u00e9 \ud83d\ude00 \ud800', "empty": {}, "none": None},
        "flags": [True, False, [], [[0]]],
    }
    texts = [json.dumps(config).encode(), json.dumps(config, indent=2).encode()]
    texts += [b'"\\ud800\\u0041"', b"-0", b"01", b"1.", b".5", b"1e", b"-", b"[1,]", b"{,}", b"NaN", b""]
    texts += [b"[" * 60 + b"]" * 60, b'{"a":1,"a":2}', b"\t [ 1 , 2 ] \n", b'"\x01"']
    rng = np.random.default_rng(3)
    alphabet = b'{}[]:,"\\ -+.eE0123456789tfnulrasu\t\n\x01'
    for _ in range(400):
        text = bytearray(texts[int(rng.integers(0, 2))])
        for _ in range(int(rng.integers(1, 4))):
            where = int(rng.integers(0, len(text)))
            byte = alphabet[int(rng.integers(0, len(alphabet)))]
            action = int(rng.integers(0, 3))
            if action == 0:
                text[where] = byte
            elif action == 1:
                text.insert(where, byte)
            else:
                del text[where]
        texts.append(bytes(text))
    return texts


@pytest.mark.skipif(
    not JSON_DRIVER.is_file(), reason=f"the compiled stages are not built ({JSON_DRIVER}): run `make stages`"
)
def test_the_config_reader_reads_json_as_python_does() -> None:
    """Accepted where Python's reader accepts (the same values), refused where it refuses."""
    outcomes = {"read": 0, "refused": 0}
    for text in _json_corpus():
        done = subprocess.run([str(JSON_DRIVER)], input=text, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        answer = done.stdout.decode().rstrip("\n")
        expected = _python_reads(text)
        if expected is None:
            assert answer.startswith("E "), (text, answer)
            outcomes["refused"] += 1
        else:
            assert answer == expected, text
            outcomes["read"] += 1
    assert min(outcomes.values()) > 40, outcomes
