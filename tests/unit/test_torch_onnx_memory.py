"""torch.onnx's graph-wide shape inference without the tables' values writes the same graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from export.importers import torch_onnx
from export.importers.torch_onnx import export_module, lean_shape_inference
from models.config import DLRMConfig
from models.dlrm import DLRM


@pytest.mark.parametrize("preset", ["tiny", "dcnv2-tiny"])
def test_leaving_weights_out_of_shape_inference_writes_the_same_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str
) -> None:
    torch.manual_seed(0)
    module = DLRM(DLRMConfig.preset(preset)).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = (torch.rand(8, 13, generator=generator), torch.randint(0, 2**40, (8, 26), generator=generator))

    calls: list[int] = []
    original = torch._C._jit_pass_onnx_graph_shape_type_inference

    def counting(graph: object, params: dict[str, torch.Tensor], opset: int) -> object:
        calls.append(len(params))
        return original(graph, params, opset)

    monkeypatch.setattr(torch._C, "_jit_pass_onnx_graph_shape_type_inference", counting)
    full = export_module(module, inputs, tmp_path / "full" / "model.onnx", 17, "tiny DLRM")
    everything = calls[-1]
    # Every weight of the tiny model counts as a table here.
    monkeypatch.setattr(torch_onnx, "SHAPE_INFERENCE_MAX_BYTES", 1)
    lean = export_module(module, inputs, tmp_path / "lean" / "model.onnx", 17, "tiny DLRM")
    assert everything > 0 and calls[-1] == 0  # the pass ran, and ran without a single weight
    assert torch._C._jit_pass_onnx_graph_shape_type_inference is counting  # put back after the export
    for model in (full, lean):
        model.graph.ClearField("initializer")
    assert lean.graph == full.graph
    assert (tmp_path / "full" / "model.onnx").read_bytes() == (tmp_path / "lean" / "model.onnx").read_bytes()


def test_the_pass_is_put_back_when_the_export_fails() -> None:
    original = torch._C._jit_pass_onnx_graph_shape_type_inference
    with pytest.raises(RuntimeError), lean_shape_inference():
        assert torch._C._jit_pass_onnx_graph_shape_type_inference is not original
        raise RuntimeError("export failed")
    assert torch._C._jit_pass_onnx_graph_shape_type_inference is original
