"""The check of the compiled stages' C API declarations against Triton's own headers.

``backends/common/api_check.cc`` compiles only where Triton's ``tritonserver.h`` and
``tritonbackend.h`` are given (``-DTRITON_INCLUDE_DIR``; the compose image's build stage), and
neither those headers nor Docker are here. What is checked here instead:

- its lists name exactly what ``triton_api.h`` declares (each function; each enumerator with its
  enumeration), and every enumeration of ``triton_api.h`` sits where the check moves it aside;
- it compiles against stand-in headers made from ``triton_api.h`` itself (Triton's headers
  as the bundle describes them), and fails for each kind of difference made in them: a
  parameter or return type, an enumerator's value, a function Triton lacks, the API versions;
- the CMake option: ``TRITON_INCLUDE_DIR`` builds it, a folder without the headers stops the
  configure, no option skips it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ROOT / "backends"
COMMON = STAGES / "common"
API = COMMON / "triton_api.h"
CHECK = COMMON / "api_check.cc"

CXX = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
needs_compiler = pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++, g++ or $CXX)")


def _code(path: Path) -> str:
    """The file without its ``//`` comments."""
    return re.sub(r"//[^\n]*", "", path.read_text())


def _declared_functions() -> set[str]:
    return set(re.findall(r"\b(TRITON(?:SERVER|BACKEND)_\w+)\s*\(", _code(API)))


def _declared_enumerators() -> set[tuple[str, str]]:
    found = set()
    for match in re.finditer(r"typedef enum \w+ \{(.*?)\} (\w+);", _code(API), re.DOTALL):
        found |= {(match.group(2), name) for name in re.findall(r"(\w+)\s*=", match.group(1))}
    return found


def _macro(name: str) -> str:
    """The body of the macro ``name`` in api_check.cc."""
    match = re.search(rf"#define {name}\(X\)(.*?[^\\])\n", CHECK.read_text(), re.DOTALL)
    assert match, f"api_check.cc defines no {name}"
    return match.group(1)


def _api_version(name: str) -> int:
    match = re.search(rf"\b{name} = (\d+);", API.read_text())
    assert match, name
    return int(match.group(1))


def test_the_check_names_every_function_and_enumerator_triton_api_h_declares() -> None:
    functions = set(re.findall(r"X\((\w+)\)", _macro("STAGES_TRITON_FUNCTIONS")))
    declared = _declared_functions()
    assert declared, "no function found in triton_api.h"
    assert functions == declared, (
        f"add to STAGES_TRITON_FUNCTIONS in api_check.cc: {sorted(declared - functions)}; "
        f"remove: {sorted(functions - declared)}"
    )
    enumerators = set(re.findall(r"X\((\w+), (\w+)\)", _macro("STAGES_TRITON_ENUMERATORS")))
    declared_enumerators = _declared_enumerators()
    assert declared_enumerators, "no enumeration found in triton_api.h"
    assert enumerators == declared_enumerators, (
        f"add to STAGES_TRITON_ENUMERATORS in api_check.cc: {sorted(declared_enumerators - enumerators)}; "
        f"remove: {sorted(enumerators - declared_enumerators)}"
    )


def test_every_enumeration_moves_aside_when_triton_headers_come_first() -> None:
    """Triton's headers define the enumerations too: triton_api.h's must lie in the block that
    api_check.cc puts into namespace stages_declared, or the check would redefine them."""
    text = API.read_text()
    opening = "#ifdef STAGES_WITH_TRITON_HEADERS\nnamespace stages_declared {"
    closing = "#ifdef STAGES_WITH_TRITON_HEADERS\n}  // namespace stages_declared\n#endif"
    assert text.count(opening) == 1 and text.count(closing) == 1
    start, end = text.index(opening), text.index(closing)
    for match in re.finditer(r"\benum\b", text):
        line = text.count("\n", 0, match.start()) + 1
        assert start < match.start() < end, f"triton_api.h:{line}: an enumeration outside the block"


def _stand_in_headers(folder: Path) -> Path:
    """``triton/core/tritonserver.h`` and ``tritonbackend.h`` that declare what triton_api.h
    declares, at its API versions: Triton's headers as far as the bundle knows them."""
    core = folder / "triton" / "core"
    core.mkdir(parents=True)
    body = "\n".join(line for line in API.read_text().splitlines() if "inline constexpr" not in line)
    (core / "tritonserver.h").write_text(
        "#pragma once\n#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n"
        f"#define TRITONSERVER_API_VERSION_MAJOR {_api_version('kServerApiMajor')}\n"
        f"#define TRITONSERVER_API_VERSION_MINOR {_api_version('kServerApiMinor')}\n" + body + "\n"
    )
    (core / "tritonbackend.h").write_text(
        '#pragma once\n#include "triton/core/tritonserver.h"\n'
        f"#define TRITONBACKEND_API_VERSION_MAJOR {_api_version('kBackendApiMajor')}\n"
        f"#define TRITONBACKEND_API_VERSION_MINOR {_api_version('kBackendApiMinor')}\n"
    )
    return folder


def _compile(include: Path) -> subprocess.CompletedProcess[str]:
    assert CXX is not None
    command = [CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"]
    command += ["-I", str(COMMON), "-I", str(include), str(CHECK)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _edit(path: Path, pattern: str, replacement: str) -> None:
    text, count = re.subn(pattern, replacement, path.read_text())
    assert count == 1, f"{pattern!r} matched {count} times in {path.name}"
    path.write_text(text)


@needs_compiler
def test_the_check_passes_where_the_headers_say_what_triton_api_h_says(tmp_path: Path) -> None:
    done = _compile(_stand_in_headers(tmp_path))
    assert done.returncode == 0, done.stderr


#: A difference in Triton's headers (pattern, replacement in tritonserver.h / tritonbackend.h)
#: and a word the compiler's error names, or None where the check must still pass.
DIFFERENCES = {
    "parameter type": (
        "tritonserver.h",
        r"TRITONBACKEND_ModelName\(\s*TRITONBACKEND_Model\* model, const char\*\* name\)",
        "TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, char** name)",
        "TRITONBACKEND_ModelName",
    ),
    "parameter width": (
        "tritonserver.h",
        r"(TRITONBACKEND_RequestRelease\(\s*TRITONBACKEND_Request\* request, )uint32_t",
        r"\g<1>uint64_t",
        "TRITONBACKEND_RequestRelease",
    ),
    "return type": (
        "tritonserver.h",
        r"TRITONSERVER_Error\* (TRITONBACKEND_ResponseDelete\()",
        r"void \g<1>",
        "TRITONBACKEND_ResponseDelete",
    ),
    "an entry point's signature": (
        "tritonserver.h",
        r"(TRITONBACKEND_ModelInstanceExecute\([^;]*)const uint32_t request_count",
        r"\g<1>const uint64_t request_count",
        "TRITONBACKEND_ModelInstanceExecute",
    ),
    "enumerator value": (
        "tritonserver.h",
        r"TRITONSERVER_ERROR_INTERNAL = 1\b",
        "TRITONSERVER_ERROR_INTERNAL = 9",
        "TRITONSERVER_ERROR_INTERNAL",
    ),
    "function missing": (
        "tritonserver.h",
        r"bool TRITONSERVER_LogIsEnabled\([^;]*;",
        "",
        "TRITONSERVER_LogIsEnabled",
    ),
    "backend API major": (
        "tritonbackend.h",
        r"TRITONBACKEND_API_VERSION_MAJOR \d+",
        "TRITONBACKEND_API_VERSION_MAJOR 2",
        "kBackendApiMajor",
    ),
    "backend API minor older": (
        "tritonbackend.h",
        r"TRITONBACKEND_API_VERSION_MINOR \d+",
        f"TRITONBACKEND_API_VERSION_MINOR {_api_version('kBackendApiMinor') - 1}",
        "kBackendApiMinor",
    ),
    "backend API minor newer (allowed)": (
        "tritonbackend.h",
        r"TRITONBACKEND_API_VERSION_MINOR \d+",
        f"TRITONBACKEND_API_VERSION_MINOR {_api_version('kBackendApiMinor') + 7}",
        None,
    ),
    "server API major": (
        "tritonserver.h",
        r"TRITONSERVER_API_VERSION_MAJOR \d+",
        "TRITONSERVER_API_VERSION_MAJOR 2",
        "kServerApiMajor",
    ),
}


@needs_compiler
@pytest.mark.parametrize("difference", list(DIFFERENCES))
def test_the_check_fails_for_each_kind_of_difference(tmp_path: Path, difference: str) -> None:
    header, pattern, replacement, named = DIFFERENCES[difference]
    include = _stand_in_headers(tmp_path)
    _edit(include / "triton" / "core" / header, pattern, replacement)
    done = _compile(include)
    if named is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0, f"{difference}: the check passed"
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert errors and named in errors[0], done.stderr


def _configure(source: Path, build: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = ["cmake", "-S", str(source), "-B", str(build), f"-DCMAKE_CXX_COMPILER={CXX}", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@needs_compiler
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_the_cmake_option_builds_the_check_only_where_headers_are_given(tmp_path: Path) -> None:
    include = _stand_in_headers(tmp_path / "include")
    given = _configure(STAGES, tmp_path / "given", f"-DTRITON_INCLUDE_DIR={include}")
    assert given.returncode == 0, given.stdout + given.stderr
    assert f"triton_api.h is checked against {include}/triton/core" in given.stdout
    built = subprocess.run(
        ["cmake", "--build", str(tmp_path / "given"), "--target", "stages_api_check"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr

    wrong = _configure(STAGES, tmp_path / "wrong", f"-DTRITON_INCLUDE_DIR={tmp_path}")
    assert wrong.returncode != 0 and "holds no triton/core/tritonbackend.h" in wrong.stderr

    absent = _configure(STAGES, tmp_path / "absent")
    assert absent.returncode == 0, absent.stdout + absent.stderr
    assert "triton_api.h is not checked against Triton's headers" in absent.stdout
