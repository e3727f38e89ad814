"""``benchmarks/gpu/run.sh`` and its helper ``transfer.sh``, run on the CPU as a GPU host runs them.

A GPU host is at hand rarely; these tests keep the script's path working between GPU runs:
``run.sh --cpu`` trains, exports and measures tiny models through the same steps (the bundle's
local tritonserver, the cpu profile's configs in place of KIND_GPU ones) and its result files
are read back; ``transfer.sh`` packs a payload into checksummed parts and prints what to copy,
and the parts, moved into place one by one, join back into the same files (a damaged part is
refused, a stray one ignored).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "benchmarks" / "gpu"
#: OUT stays small and plain, as run.sh's header promises: at most this many files, named in these
#: characters.
MAX_OUT_FILES = 9
OUT_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _bash(script: str, *args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(SCRIPTS / script), *args],
        cwd=ROOT,
        env={**os.environ, "PATH": path, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _member(archive: tarfile.TarFile, name: str) -> dict:
    handle = archive.extractfile(f"./{name}")
    assert handle is not None, name
    return json.loads(handle.read())


@pytest.mark.integration
def test_cpu_mode_takes_every_figure_and_writes_what_comes_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _bash("run.sh", "--cpu", env={"WORK": str(tmp_path / "work"), "OUT": str(out)}, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()[1:]]
    assert [s[0] for s in steps] == [
        "machine", "train", "install", "export", "gpu", "cpu", "gpu_vs_cpu", "hot_cold", "aoti",
    ]  # fmt: skip
    assert all(s[2] == "ok" for s in steps), steps
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= MAX_OUT_FILES and all(OUT_NAME.fullmatch(name) for name in files), files
    assert {"results.tar.gz", "gpu.md", "cpu.md", "gpu_vs_cpu.md", "hot_cold.md", "aoti.md"} <= set(files)
    with tarfile.open(out / "results.tar.gz") as archive:
        gpu = _member(archive, "gpu/result.json")
        cpu = _member(archive, "cpu/result.json")
        hot_cold = _member(archive, "hot_cold/result.json")
        aoti = _member(archive, "aoti/result.json")
        devices = _member(archive, "gpu_vs_cpu.json")
        names = archive.getnames()
    # 1. every variant of both families, at batch 1 and the larger batch, in-process beside served
    assert [r["model"] for r in gpu["results"]] == [
        "dlrm_onnx", "dlrm_onnx_fp16", "dlrm_torch", "wide_deep_onnx", "wide_deep_onnx_fp16",
    ]  # fmt: skip
    for result in gpu["results"]:
        assert {s["batch_size"] for s in result["served"]} == {1, 256}
        assert all(s["samples_per_s"] > 0 and s["errors"] == 0 for s in result["served"])
        assert set(result["in_process"]) == {"1", "256"}
    verdicts = gpu["verdicts"]
    assert verdicts["fastest_passing_gate"]["p99_ms"] > 0
    assert set(verdicts["batch1_p50_ms"]) == {r["model"] for r in gpu["results"]}
    # 2. FP16 against FP32 for both families
    assert {"dlrm_onnx_fp16", "wide_deep_onnx_fp16"} <= set(verdicts["fp16_over_fp32"])
    # 3. the CPU default (INT8) served, and GPU against CPU per family
    assert [(r["model"], r["precision"]) for r in cpu["results"]] == [
        ("dlrm_onnx_int8", "INT8"), ("wide_deep_onnx_int8", "INT8"),
    ]  # fmt: skip
    for family in ("dlrm", "wide_deep"):
        found = devices["families"][family]
        assert found["latency_cpu_over_gpu"] > 0 and found["throughput_gpu_over_cpu"] > 0
    # 4. hot/cold: the ensemble served only, checked against the all-in-graph model
    (ensemble,) = hot_cold["results"]
    assert ensemble["file"] == "ensemble" and ensemble["in_process"] == {}
    assert ensemble["gate"]["checked_against"] == "onnx_fp32_in_graph" and ensemble["gate"]["passes"]
    assert {s["batch_size"] for s in ensemble["served"]} == {64, 256}
    # 5. the AOTInductor package (CUDA on a GPU host, the CPU here) served, gated against eager
    (package,) = aoti["results"]
    assert package["model"] == "dlrm_aoti" and package["file"] == "ensemble" and package["gate"]["passes"]
    assert {s["batch_size"] for s in package["served"]} == {1, 256}
    assert all(s["samples_per_s"] > 0 and s["errors"] == 0 for s in package["served"])
    assert "./exports/repo-gpu-dlrm_onnx.json" in names and "./machine.txt" in names
    assert "GPU / CPU throughput" in (out / "gpu_vs_cpu.md").read_text()


def test_parts_copied_one_by_one_join_into_the_payload(tmp_path: Path) -> None:
    pack_dir, parts, payload = tmp_path / "pack", tmp_path / "parts", tmp_path / "payload"
    wheels, models = pack_dir / "stage" / "wheels", pack_dir / "stage" / "wide_deep" / "gpu"
    wheels.mkdir(parents=True)
    models.mkdir(parents=True)
    blob = os.urandom(2_500_000)
    (wheels / "big-1.0-py3-none-any.whl").write_bytes(blob)
    (models / "model.onnx").write_bytes(b"onnx")
    env = {"PACK_DIR": str(pack_dir), "PARTS": str(parts), "PAYLOAD": str(payload), "PART_MIB": "1"}
    packed = _bash("transfer.sh", "pack", env=env, timeout=60)
    assert packed.returncode == 0, packed.stderr
    pieces = sorted(pack_dir.glob("part.*"))
    assert len(pieces) == 3 and all(p.stat().st_size <= 2**20 for p in pieces)
    manifest = pack_dir / "parts.sha256"
    # what to copy: every part and the checksums, then the run
    listed = [line.strip() for line in packed.stdout.splitlines() if line.startswith("  ")]
    assert listed == [*map(str, pieces), str(manifest)]
    assert "bash benchmarks/gpu/run.sh" in packed.stdout
    assert not (pack_dir / "stage").exists()
    for file in [*pieces, manifest]:  # copied over one by one, each moved into PARTS
        assert _bash("transfer.sh", "stash", str(file), env=env, timeout=60).returncode == 0
    (parts / "part.99").write_bytes(b"a stray part of an earlier pack")
    joined = _bash("transfer.sh", "join", env=env, timeout=60)
    assert joined.returncode == 0, joined.stderr
    assert (payload / "wheels" / "big-1.0-py3-none-any.whl").read_bytes() == blob
    assert (payload / "wide_deep" / "gpu" / "model.onnx").read_bytes() == b"onnx"
    # a damaged part is refused before anything is unpacked
    (payload / ".joined").unlink()
    with (parts / "part.01").open("r+b") as handle:
        handle.write(b"x")
    assert _bash("transfer.sh", "join", env=env, timeout=60).returncode != 0
    # and so is a join without the checksums
    (parts / "parts.sha256").unlink()
    missing = _bash("transfer.sh", "join", env=env, timeout=60)
    assert missing.returncode != 0 and "parts.sha256" in missing.stderr


def test_parts_in_place_need_no_stash(tmp_path: Path) -> None:
    """By default the GPU host joins the parts where pack wrote them (PARTS is PACK_DIR)."""
    pack_dir, payload = tmp_path / "pack", tmp_path / "payload"
    (pack_dir / "stage" / "wheels").mkdir(parents=True)
    (pack_dir / "stage" / "wide_deep").mkdir(parents=True)
    (pack_dir / "stage" / "wheels" / "small-1.0-py3-none-any.whl").write_bytes(b"wheel")
    env = {"PACK_DIR": str(pack_dir), "PAYLOAD": str(payload)}
    assert _bash("transfer.sh", "pack", env=env, timeout=60).returncode == 0
    stashed = _bash("transfer.sh", "stash", *map(str, sorted(pack_dir.glob("part.*"))), env=env, timeout=60)
    assert stashed.returncode == 0, stashed.stderr  # already in place: nothing moves
    joined = _bash("transfer.sh", "join", env=env, timeout=60)
    assert joined.returncode == 0, joined.stderr
    assert (payload / "wheels" / "small-1.0-py3-none-any.whl").read_bytes() == b"wheel"
