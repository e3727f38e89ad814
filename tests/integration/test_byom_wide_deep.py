"""Bring your own TensorFlow/Keras model: exported with the CLI, served by the real local tritonserver.

Three models of our own (tests/byom_keras.py), none built with the bundle's model code:
a Keras functional Wide & Deep with one input per feature, saved both with
``model.export()`` (SavedModel) and ``model.save()`` (``.keras``), and a
``tf.Module`` SavedModel over two tensors named ``dense`` and ``sparse`` (int32
ids, a logit output), mapped with ``--input-map`` and ``--logits``. Each is
exported by ``python -m export wide-deep`` into its own repository and served by
its own server, one at a time; the served answer must equal the model's own
TensorFlow output, and ids no table holds must give valid probabilities.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from clients.triton import TritonClient
from criteo.tsv import Batch

pytestmark = pytest.mark.integration

ROWS = 64
#: Ids no table holds: the int64 limits, negative, far past every table.
EXTREME_IDS = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 10**12, -(10**12), 2**40])
#: Lines TensorFlow's native runtime writes to stderr when it loads (absl before its log init).
_TF_NATIVE_LOG = re.compile(r"^(WARNING: All log messages before absl|[IWE]\d{4} )")


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "export", "wide-deep", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _sizes(sizes: tuple[int, ...]) -> str:
    return ",".join(map(str, sizes))


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str], Callable]]:
    """Each case: the model path, its extra CLI arguments, and its own output on in-range rows."""
    from tests.byom_keras import (
        KERAS_TABLE_SIZES,
        TwoTensorModule,
        keras_probabilities,
        keras_wide_deep,
        module_probabilities,
        save_module,
    )

    root = tmp_path_factory.mktemp("byom_models")
    model = keras_wide_deep(seed=3)
    model.export(str(root / "keras_savedmodel"), verbose=False)
    model.save(str(root / "model.keras"))
    save_module(TwoTensorModule(seed=4), root / "module")
    # The Keras model does not reduce ids: the export reads its tables' sizes from the graph (the
    # SavedModel) or takes them from --table-sizes (the .keras file), and adds the reduction.
    keras_args = ["--table-sizes", _sizes(KERAS_TABLE_SIZES)]
    module_args = ["--input-map", "dense_features=dense", "--input-map", "categorical_ids=sparse", "--logits"]

    def keras_own(dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return keras_probabilities(model, dense, ids)

    def module_own(dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return module_probabilities(root / "module", dense, ids)

    return {
        "keras_savedmodel": (root / "keras_savedmodel", [], keras_own),
        "keras_file": (root / "model.keras", keras_args, keras_own),
        "module": (root / "module", module_args, module_own),
    }


@pytest.fixture(scope="module")
def repositories(
    tmp_path_factory: pytest.TempPathFactory, user_models: dict[str, tuple[Path, list[str], Callable]]
) -> dict[str, Path]:
    """Each case exported through the CLI into its own repository (FP32 and FP16, no INT8)."""
    root = tmp_path_factory.mktemp("byom_repositories")
    repositories = {}
    for case, (path, args, _) in user_models.items():
        repository = root / case
        check = ["--repository", str(repository), "--no-int8", "--check-rows", "1024"]
        completed = _export("--saved-model", str(path), *args, *check)
        assert completed.returncode == 0, completed.stderr[-3000:]
        repositories[case] = repository
    return repositories


def _rows(table_sizes: tuple[int, ...], seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 500, (ROWS, NUM_DENSE))).astype(np.float32)
    ids = rng.integers(0, np.asarray(table_sizes)[None, :], (ROWS, NUM_CATEGORICAL), dtype=np.int64)
    return Batch(dense, ids, None)


@pytest.mark.parametrize("case", ["keras_savedmodel", "keras_file", "module"])
def test_served_answer_is_the_users_own_model(
    case: str,
    start_triton: Callable,
    user_models: dict[str, tuple[Path, list[str], Callable]],
    repositories: dict[str, Path],
) -> None:
    from tests.byom_keras import KERAS_TABLE_SIZES, MODULE_TABLE_SIZES

    _, _, own = user_models[case]
    rows = _rows(MODULE_TABLE_SIZES if case == "module" else KERAS_TABLE_SIZES, seed=len(case))
    expected = own(rows.dense, rows.categorical)
    assert expected.shape == (ROWS, 1) and np.ptp(expected) > 1e-3  # a model whose answers vary
    extreme = Batch(rows.dense[:16], np.resize(EXTREME_IDS, (16, NUM_CATEGORICAL)).astype(np.int64), None)
    server = start_triton(repositories[case])
    try:
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
                served = client.infer("wide_deep_onnx", rows.inputs())
                assert served.shape == (ROWS, 1) and served.dtype == np.float32
                np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
                for model in ("wide_deep_onnx", "wide_deep_onnx_fp16"):
                    answer = client.infer(model, extreme.inputs())
                    assert answer.shape == (16, 1)
                    valid = np.isfinite(answer) & (answer >= 0) & (answer <= 1)
                    assert np.all(valid), (model, answer)
    finally:
        server.stop()


def test_export_report_records_the_format_and_the_mapping(repositories: dict[str, Path]) -> None:
    from tests.byom_keras import KERAS_TABLE_SIZES

    reports = {
        case: json.loads((repository / "wide_deep_onnx" / "export_report.json").read_text())["source"]
        for case, repository in repositories.items()
    }
    keras_saved, keras_file, module = reports["keras_savedmodel"], reports["keras_file"], reports["module"]
    assert keras_saved["format"] == "savedmodel" and keras_saved["signature"] == "serving_default"
    assert keras_file["format"] == "keras" and keras_file["signature"] is None
    for report in (keras_saved, keras_file):
        assert report["inputs"]["I1"] == "dense_features[:, 0]"
        assert report["inputs"]["C26"] == "categorical_ids[:, 25]"
        assert report["table_sizes"] == list(KERAS_TABLE_SIZES)
        assert report["id_reduction_added"] is True
    assert keras_saved["table_sizes_from"] == "the graph's embedding tables"
    assert keras_file["table_sizes_from"] == "--table-sizes"
    assert module["format"] == "savedmodel"
    assert module["inputs"] == {"dense": "dense_features", "sparse": "categorical_ids"}
    assert module["output"] == "logit" and module["logits"] is True
    assert module["id_reduction_added"] is False  # it reduces ids itself (floormod)


def _error_line(completed: subprocess.CompletedProcess[str]) -> str:
    """The CLI's one error line (TensorFlow's native start-up lines aside)."""
    assert completed.returncode == 1, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines() if line and not _TF_NATIVE_LOG.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), completed.stderr[-2000:]
    return lines[0]


def test_one_line_errors_for_no_model_and_unmappable_inputs(tmp_path: Path) -> None:
    from tests.byom_keras import UnmappableModule, save_module

    text = tmp_path / "model.txt"
    text.write_text("not a model\n")
    line = _error_line(_export("--saved-model", str(text), "--repository", str(tmp_path / "repository")))
    assert "is a file of 12 bytes, not a model" in line and "SavedModel" in line and ".keras" in line

    saved = save_module(UnmappableModule(), tmp_path / "unmappable")
    line = _error_line(_export("--saved-model", str(saved), "--repository", str(tmp_path / "repository")))
    assert "has inputs that cannot be mapped" in line
    assert "x float32 [None, 3]" in line and "y int64 [None]" in line and "--input-map" in line
    assert not (tmp_path / "repository" / "wide_deep_onnx").exists()
