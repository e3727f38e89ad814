"""Where one call's time goes: each kernel's share of a model call, by name.

``python -m lab kernels --repository DIR --model NAME ...`` runs each model on
one batch and lists where ``calls`` calls spent their time:

- on the GPU (``--device gpu``, the default): ONNX models through ONNX Runtime's
  CUDA provider with IOBinding, TorchScript on ``cuda:0``, the batch already on
  the device; the kernels are recorded with CUPTI through ``torch.profiler``,
  which sees every kernel of the process, ONNX Runtime's included. It answers
  "why is FP16 not faster" (benchmarks/gpu/kernels.txt: the Casts around FP32
  islands of the FP16 DLRM, which is why the gpu profile's FP16 graph has none);
- on the CPU (``--device cpu``): ONNX models through ONNX Runtime's own profiler
  (each node's time, summed by operator type), TorchScript through
  ``torch.profiler``'s CPU activity (each operator's self time).

It prints, per model, the kernels by their time per call, and writes the same
as ``kernels.txt`` and ``kernels.json``. ``--device gpu`` needs a GPU and torch
with CUDA; elsewhere it stops with one line.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.onnx_session import inference_session
from loadtest.engine.baseline import load_torchscript
from loadtest.engine.payload import build_pool
from loadtest.engine.session import device_binding

#: Kernels listed per model (the rest are summed into the total).
TOP = 14
#: Where the models run: ``gpu`` (CUDA kernels) or ``cpu`` (operators).
DEVICES = ("gpu", "cpu")
#: Calls run before the profiled ones.
WARMUP_CALLS = 5


@dataclass(frozen=True)
class KernelTime:
    """One kernel name's time per call (GPU time on the GPU; on the CPU an operator's)."""

    name: str
    ms_per_call: float
    launches_per_call: int


def _runner(path: Path, batch: dict[str, Any]) -> Any:
    """A callable running ``path`` once on ``batch`` with inputs and output on ``cuda:0``."""
    import torch

    if path.suffix == ".pt":
        module, order = load_torchscript(path, torch.device("cuda", 0))
        inputs = [torch.from_numpy(batch[name]).cuda() for name in order]

        def run_torch() -> None:
            with torch.inference_mode():
                module(*inputs)

        return run_torch
    session = inference_session(path, device="gpu")
    binding = device_binding(session, batch)
    return lambda: session.run_with_iobinding(binding)


def kernel_times(path: Path, batch: dict[str, Any], calls: int = 10, device: str = "gpu") -> list[KernelTime]:
    """The kernels of ``calls`` calls of the model at ``path`` on ``batch``, by time per call.

    Args:
        path: a ``model.onnx`` or a TorchScript ``model.pt``.
        batch: the inputs, by name.
        calls: profiled calls, after :data:`WARMUP_CALLS` unprofiled ones.
        device: ``gpu``: CUDA kernels by GPU time; ``cpu``: operators by CPU time.

    Raises:
        ConfigError: an unknown device, or ``gpu`` where torch sees no CUDA GPU.
    """
    if device not in DEVICES:
        raise ConfigError(f"--device must be {' or '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return _cpu_operator_times(path, batch, calls)
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise ConfigError(f"lab kernels needs a CUDA GPU; torch {torch.__version__} sees none")
    run = _runner(path, batch)
    for _ in range(WARMUP_CALLS):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as recorded:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    times = []
    for event in recorded.key_averages():
        total = float(
            getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0) or 0
        )
        if total > 0:
            times.append(KernelTime(event.key, total / calls / 1000, event.count // calls))
    return sorted(times, key=lambda kernel: kernel.ms_per_call, reverse=True)


def _cpu_operator_times(path: Path, batch: dict[str, Any], calls: int) -> list[KernelTime]:
    """Each operator's CPU time per call: ONNX Runtime's node times by op type (only the last
    ``calls`` runs of the session's profile count), or torch.profiler's self CPU time."""
    if path.suffix == ".pt":
        import torch
        from torch.profiler import ProfilerActivity, profile

        module, order = load_torchscript(path, torch.device("cpu"))
        inputs = [torch.from_numpy(batch[name]) for name in order]
        with torch.inference_mode():
            for _ in range(WARMUP_CALLS):
                module(*inputs)
            with profile(activities=[ProfilerActivity.CPU]) as recorded:
                for _ in range(calls):
                    module(*inputs)
        times = [
            KernelTime(event.key, event.self_cpu_time_total / calls / 1000, event.count // calls)
            for event in recorded.key_averages()
            if event.self_cpu_time_total > 0
        ]
        return sorted(times, key=lambda kernel: kernel.ms_per_call, reverse=True)
    with tempfile.TemporaryDirectory() as scratch:
        session = inference_session(path, device="cpu", profile_prefix=Path(scratch) / "profile")
        for _ in range(WARMUP_CALLS + calls):
            session.run(None, batch)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted(
        (int(e["ts"]), int(e["ts"]) + int(e["dur"]))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )[-calls:]
    if len(runs) < calls:
        raise ConfigError(f"ONNX Runtime's profile of {path} holds {len(runs)} runs, not {calls}")
    time_us: Counter[str] = Counter()
    launches: Counter[str] = Counter()
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        start = int(event["ts"])
        if any(begin <= start <= end for begin, end in runs):
            op = str(event.get("args", {}).get("op_name", "?"))
            time_us[op] += int(event.get("dur", 0))
            launches[op] += 1
    times = [KernelTime(op, us / calls / 1000, launches[op] // calls) for op, us in time_us.items()]
    return sorted(times, key=lambda kernel: kernel.ms_per_call, reverse=True)


def describe(model: str, kernels: list[KernelTime], top: int = TOP) -> list[str]:
    """Lines: the model's kernel time per call, then its ``top`` kernels with their shares."""
    total = sum(kernel.ms_per_call for kernel in kernels)
    lines = [f"== {model}: {total:.3f} ms of kernels per call"]
    for kernel in kernels[:top]:
        share = kernel.ms_per_call / total if total else 0.0
        lines.append(
            f"  {kernel.ms_per_call:7.3f} ms {share:5.1%} x{kernel.launches_per_call:<3d} {kernel.name[:110]}"
        )
    return lines


def run_kernels(
    models: dict[str, Path], data: Path | None, batch_size: int, calls: int, out: Path, device: str = "gpu"
) -> dict[str, Path]:
    """Profile each of ``models`` (name -> model file) at ``batch_size`` on ``device``; write
    kernels.{txt,json}."""
    if batch_size < 1 or calls < 1:
        raise ConfigError("batch size and calls must be >= 1")
    batch = build_pool(batch_size, data=data, batches=1).batch(0)
    lines: list[str] = []
    document: dict[str, Any] = {"batch_size": batch_size, "calls": calls, "device": device, "models": {}}
    for name, path in models.items():
        kernels = kernel_times(path, batch, calls, device)
        lines += describe(name, kernels)
        document["models"][name] = [kernel.__dict__ for kernel in kernels]
        print("\n".join(describe(name, kernels)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.txt").write_text("\n".join(lines) + "\n")
    (out / "kernels.json").write_text(json.dumps(document, indent=1) + "\n")
    return {"text": out / "kernels.txt", "json": out / "kernels.json"}
