"""The model repository writer: configs are ModelConfig messages that parse back."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.repository import ServingConfig, add_model, read_config, version_dir
from bundle.schema import INPUTS, OUTPUTS


def test_config_round_trip(tmp_path: Path) -> None:
    onnx_file = version_dir(tmp_path, "dlrm_onnx") / "model.onnx"
    onnx_file.parent.mkdir(parents=True)
    onnx_file.write_bytes(b"graph")
    serving = ServingConfig(
        max_batch_size=2048, instances=2, preferred_batch_sizes=(512,), intra_op_threads=2
    )
    path = add_model(tmp_path, "dlrm_onnx", serving, report={"ok": True})
    config = read_config(path)
    assert config.name == "dlrm_onnx" and config.backend == "onnxruntime"
    assert config.max_batch_size == 2048
    assert [(t.name, list(t.dims)) for t in config.input] == [(s.name, list(s.shape)) for s in INPUTS]
    assert [t.name for t in config.output] == [s.name for s in OUTPUTS]
    assert config.input[1].data_type == mc.TYPE_INT64
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count == 2
    assert list(config.dynamic_batching.preferred_batch_size) == [512]
    assert config.parameters["intra_op_thread_count"].string_value == "2"
    assert [w.batch_size for w in config.model_warmup] == [1, 64]
    assert (tmp_path / "dlrm_onnx" / "export_report.json").is_file()


def test_missing_onnx_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        add_model(tmp_path, "wide_deep_onnx", ServingConfig())
    with pytest.raises(ConfigError):
        ServingConfig(max_batch_size=0)
    with pytest.raises(ConfigError):
        ServingConfig(max_batch_size=8, warmup_batch_sizes=(16,))
    with pytest.raises(ConfigError):
        ServingConfig(profile="tpu")  # type: ignore[arg-type]
    bad = tmp_path / "config.pbtxt"
    bad.write_text('name: "x"\nno_such_field: 1\n')
    with pytest.raises(ConfigError):
        read_config(bad)


def test_profile_default_preferred_batch_sizes() -> None:
    assert ServingConfig().preferred_batch_sizes == ()
    assert ServingConfig(max_batch_size=512).preferred_batch_sizes == ()
    assert ServingConfig(profile="gpu").preferred_batch_sizes == ()
    assert ServingConfig(preferred_batch_sizes=()).preferred_batch_sizes == ()
    assert ServingConfig(preferred_batch_sizes=(64,)).preferred_batch_sizes == (64,)
    with pytest.raises(ConfigError):
        ServingConfig(max_batch_size=512, preferred_batch_sizes=(1024,))
