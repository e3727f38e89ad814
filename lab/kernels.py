"""Where one call's GPU time goes: each CUDA kernel's share of a model call, by name.

``python -m lab kernels --repository DIR --model NAME ...`` runs each model
(ONNX through ONNX Runtime's CUDA provider with IOBinding, TorchScript on
``cuda:0``) on one batch already on the device, and records the kernels of
``calls`` calls with CUPTI through ``torch.profiler``, which sees every kernel
of the process, ONNX Runtime's included. It prints, per model, the kernels
by their GPU time per call, and writes the same as ``kernels.txt`` and
``kernels.json``. It answers "why is FP16 not faster": on an H100 the FP16
DLRM with its interaction kept in FP32 spent 0.18 ms of its 0.80 ms in Casts
(benchmarks/gpu/kernels.txt), which is why the gpu profile's FP16 graph has no
FP32 islands.

It needs a GPU and torch with CUDA; elsewhere it stops with one line.
"""

from __future__ import annotations

import json
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


@dataclass(frozen=True)
class KernelTime:
    """One kernel name's GPU time per call."""

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


def kernel_times(path: Path, batch: dict[str, Any], calls: int = 10) -> list[KernelTime]:
    """The kernels of ``calls`` calls of the model at ``path`` on ``batch``, by GPU time per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise ConfigError(f"lab kernels needs a CUDA GPU; torch {torch.__version__} sees none")
    run = _runner(path, batch)
    for _ in range(5):
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
    models: dict[str, Path], data: Path | None, batch_size: int, calls: int, out: Path
) -> dict[str, Path]:
    """Profile each of ``models`` (name -> model file) at ``batch_size``; write kernels.{txt,json}."""
    if batch_size < 1 or calls < 1:
        raise ConfigError("batch size and calls must be >= 1")
    batch = build_pool(batch_size, data=data, batches=1).batch(0)
    lines: list[str] = []
    document: dict[str, Any] = {"batch_size": batch_size, "calls": calls, "models": {}}
    for name, path in models.items():
        kernels = kernel_times(path, batch, calls)
        lines += describe(name, kernels)
        document["models"][name] = [kernel.__dict__ for kernel in kernels]
        print("\n".join(describe(name, kernels)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.txt").write_text("\n".join(lines) + "\n")
    (out / "kernels.json").write_text(json.dumps(document, indent=1) + "\n")
    return {"text": out / "kernels.txt", "json": out / "kernels.json"}
