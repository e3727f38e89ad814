"""Damaged files, served by the real local tritonserver: refused in one line, the rest keeps serving.

The repository is built here without training, small enough to start in seconds:

- ``dlrm_onnx``: a hot/cold ensemble of ``dlrm_embedding`` (the stage, its row store
  inside its model folder) and ``dlrm_dense`` (a stand-in dense ONNX model that reads
  every tier);
- ``wide_deep_onnx`` and ``dlrm_small``: plain ONNX models of the schema;
- ``dlrm_torch``: a TorchScript model of the schema.

Each fault of :data:`lab.faults.damaged.DAMAGES` is made in a copy of it
(:func:`lab.faults.damaged.run_damage`); the damaged model must be refused with
the launcher's one start-up line naming the file, and every other model must load and
answer what it answers undamaged (ONNX Runtime in this process for the ONNX models;
the ensemble and the TorchScript model checked here against numpy/ONNX Runtime and
torch in this process first).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    TORCHSCRIPT_FILE,
    ServingConfig,
    add_model,
    add_torch_model,
    read_config,
    version_dir,
)
from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
)
from clients.verify import sample_rows
from criteo.tsv import Batch
from export.stage.hot_cold_lookup import PARAM_ROW_STORE_FINGERPRINT, HotColdLookup
from export.tables.ensemble import (
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    write_dense_config,
    write_embedding_stage,
    write_ensemble,
)
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays
from lab.faults import FaultResult
from lab.faults.damaged import DAMAGES, ROWS, Damage, healthy_answers, run_damage
from server import TritonInstallation

pytestmark = pytest.mark.integration

FAMILY = "dlrm"
ENSEMBLE = ensemble_model_name(FAMILY)
STAGE = embedding_model_name(FAMILY)
PLAIN_MODELS = ("wide_deep_onnx", "dlrm_small")
TORCH_MODEL = "dlrm_torch"
WIDTH = 4
TABLE_SIZES = tuple(3 + 2 * t for t in range(NUM_CATEGORICAL))
OPSET = 17
#: One instance, one thread, no warm-up: the repository loads in seconds on two cores.
SERVING = ServingConfig(instances=1, intra_op_threads=1, warmup_batch_sizes=())
#: What each fault's line must say besides naming the file.
SAYS = {
    "row store truncated": "truncated",
    "row store with one bit flipped": "is damaged",
    "row store of another content": "does not match this stage's hot set",
    "model.onnx truncated": "onnxruntime could not load",
    "model.pt truncated": "torch.jit.load could not load",
    "config.pbtxt that does not parse": "config.pbtxt",
}


def _model(nodes: list, inputs: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "stand_in",
        inputs,
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["B", 1])],
        initializer=initializers,
    )
    opset = helper.make_opsetid("", OPSET)
    # This onnx writes a newer IR version than ONNX Runtime here reads: the opset's own suffices.
    model = helper.make_model(
        graph, opset_imports=[opset], ir_version=helper.find_min_ir_version_for([opset])
    )
    onnx.checker.check_model(model)
    return model


def _plain_model(seed: int) -> onnx.ModelProto:
    """``sigmoid(dense @ w + (ids mod 97) @ v)``: a model of the schema's tensors."""
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.3, (NUM_DENSE, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.01, (NUM_CATEGORICAL, 1)).astype(np.float32), "v"),
        numpy_helper.from_array(np.array(97, dtype=np.int64), "modulus"),
    ]
    nodes = [
        helper.make_node("Mod", [CATEGORICAL_INPUT, "modulus"], ["reduced"]),
        helper.make_node("Cast", ["reduced"], ["ids"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["ids", "v"], ["id_logit"]),
        helper.make_node("MatMul", [DENSE_INPUT, "w"], ["dense_logit"]),
        helper.make_node("Add", ["id_logit", "dense_logit"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    inputs = [
        helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["B", NUM_DENSE]),
        helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["B", NUM_CATEGORICAL]),
    ]
    return _model(nodes, inputs, initializers)


def _dense_model() -> onnx.ModelProto:
    """``sigmoid(dense @ w + 0.01 * sum(hot_slots) + sum(cold_rows))`` per row: every tier counts.

    The cold rows' sum is over the whole request, so a served ensemble whose cold rows
    differ from the store's answers differently for every row.
    """
    rng = np.random.default_rng(5)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.3, (NUM_DENSE, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(0.01, dtype=np.float32), "hot_scale"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_1"),
    ]
    nodes = [
        helper.make_node("Cast", [HOT_SLOTS], ["slots"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["slots", "axis_1"], ["slot_sum"], keepdims=1),
        helper.make_node("Mul", ["slot_sum", "hot_scale"], ["hot_logit"]),
        helper.make_node("ReduceSum", [COLD_ROWS], ["cold_logit"], keepdims=0),
        helper.make_node("MatMul", [DENSE_INPUT, "w"], ["dense_logit"]),
        helper.make_node("Add", ["hot_logit", "dense_logit"], ["partial"]),
        helper.make_node("Add", ["partial", "cold_logit"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    inputs = [
        helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["B", NUM_DENSE]),
        helper.make_tensor_value_info(HOT_SLOTS, TensorProto.INT64, ["B", NUM_CATEGORICAL]),
        helper.make_tensor_value_info(COLD_POSITIONS, TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info(COLD_ROWS, TensorProto.FLOAT, ["N", WIDTH]),
    ]
    return _model(nodes, inputs, initializers)


def _write_torchscript(path: Path) -> None:
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(3)
            self.w = torch.nn.Parameter(torch.randn(NUM_DENSE, 1, generator=generator) * 0.3)
            self.v = torch.nn.Parameter(torch.randn(NUM_CATEGORICAL, 1, generator=generator) * 0.01)

        def forward(self, dense_features: torch.Tensor, categorical_ids: torch.Tensor) -> torch.Tensor:
            ids = torch.remainder(categorical_ids, 97).to(torch.float32)
            return torch.sigmoid(dense_features @ self.w + ids @ self.v)

    torch.jit.script(Tiny()).save(str(path))


def _run_torchscript(path: Path, batch: Batch) -> np.ndarray:
    import torch

    module = torch.jit.load(str(path))
    with torch.inference_mode():
        inputs = batch.inputs()
        out = module(torch.from_numpy(inputs[DENSE_INPUT]), torch.from_numpy(inputs[CATEGORICAL_INPUT]))
    return out.numpy()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("damaged_files")
    repository = root / "model_repository"
    rng = np.random.default_rng(7)
    tables = [rng.normal(0, 0.5, (size, WIDTH)).astype(np.float32) for size in TABLE_SIZES]
    store_dir = repository / STAGE / "rows"
    write_arrays(store_dir, RowStoreSpec.for_dlrm(TABLE_SIZES, WIDTH), tables)
    hot_ids = tuple(rng.permutation(size)[: max(1, size // 3)].astype(np.int64) for size in TABLE_SIZES)
    hot_set = HotSet(
        table_sizes=TABLE_SIZES,
        row_bytes=(WIDTH * 4,) * NUM_CATEGORICAL,
        budget_bytes=10**6,
        ids=hot_ids,
        counts=tuple(np.ones(ids.size, dtype=np.int64) for ids in hot_ids),
        profiled_lookups=sum(ids.size for ids in hot_ids),
    )
    write_embedding_stage(repository, FAMILY, store_dir, hot_set.save(root / "hot.npz"), TABLE_SIZES, WIDTH)
    assert read_config(repository / STAGE / CONFIG_NAME).parameters[PARAM_ROW_STORE_FINGERPRINT].string_value
    dense_dir = version_dir(repository, dense_model_name(FAMILY))
    dense_dir.mkdir(parents=True)
    onnx.save(_dense_model(), dense_dir / MODEL_FILE)
    write_dense_config(repository, FAMILY, WIDTH, SERVING)
    write_ensemble(repository, FAMILY)
    for seed, name in enumerate(PLAIN_MODELS):
        version_dir(repository, name).mkdir(parents=True)
        onnx.save(_plain_model(seed), version_dir(repository, name) / MODEL_FILE)
        add_model(repository, name, SERVING)
    version_dir(repository, TORCH_MODEL).mkdir(parents=True)
    _write_torchscript(version_dir(repository, TORCH_MODEL) / TORCHSCRIPT_FILE)
    add_torch_model(repository, TORCH_MODEL, SERVING)
    return repository


@pytest.fixture(scope="module")
def batch() -> Batch:
    return sample_rows(None, ROWS)


@pytest.fixture(scope="module")
def expected(
    repository: Path,
    batch: Batch,
    triton_installation: TritonInstallation,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, np.ndarray]:
    """Every schema model's healthy answer (the ensemble and TorchScript model as served undamaged)."""
    return healthy_answers(repository, batch, tmp_path_factory.mktemp("healthy"), triton_installation)


def _ensemble_in_process(repository: Path, batch: Batch) -> np.ndarray:
    import onnxruntime as ort

    from export.tables.ensemble import stage_store_path

    inputs = batch.inputs()
    stage_dir = version_dir(repository, STAGE)
    lookup = HotColdLookup.open(
        stage_store_path(repository, STAGE, 1), stage_dir / "hot_set.npz", TABLE_SIZES
    )
    placement = lookup.place(inputs[CATEGORICAL_INPUT])
    session = ort.InferenceSession(
        str(version_dir(repository, dense_model_name(FAMILY)) / MODEL_FILE),
        providers=["CPUExecutionProvider"],
    )
    feeds = {
        DENSE_INPUT: inputs[DENSE_INPUT],
        HOT_SLOTS: placement.hot_slots,
        COLD_POSITIONS: placement.cold_positions,
        COLD_ROWS: placement.cold_rows,
    }
    return np.asarray(session.run([OUTPUT], feeds)[0])


def test_the_healthy_answers_are_right(
    repository: Path, batch: Batch, expected: dict[str, np.ndarray]
) -> None:
    """The undamaged repository serves every model: the ensemble's and the TorchScript model's
    served answers (the reference of the damaged runs) match this process's."""
    assert set(expected) == {ENSEMBLE, TORCH_MODEL, *PLAIN_MODELS}
    np.testing.assert_allclose(expected[ENSEMBLE], _ensemble_in_process(repository, batch), rtol=0, atol=1e-6)
    torch_file = version_dir(repository, TORCH_MODEL) / TORCHSCRIPT_FILE
    np.testing.assert_allclose(expected[TORCH_MODEL], _run_torchscript(torch_file, batch), rtol=0, atol=1e-6)


@pytest.mark.parametrize("damage", DAMAGES, ids=[damage.fault.split(" (")[0] for damage in DAMAGES])
def test_a_damaged_file_is_refused_and_the_rest_serves(
    repository: Path,
    batch: Batch,
    expected: dict[str, np.ndarray],
    triton_installation: TritonInstallation,
    tmp_path: Path,
    damage: Damage,
) -> None:
    result = run_damage(
        repository,
        damage,
        batch=batch,
        expected=expected,
        installation=triton_installation,
        work_dir=tmp_path,
    )
    assert isinstance(result, FaultResult)
    target = damage.find(repository)
    assert target is not None
    # The rest serves, and nothing wrong is answered, whatever the line says.
    assert result.requests > 0 and result.failed == 0 and result.wrong == 0, result
    says = next(text for prefix, text in SAYS.items() if damage.fault.startswith(prefix))
    # The file, as the copy's path (the run replaces the copy's folder with "COPY").
    relative = target.path.resolve().relative_to(repository.resolve())
    named = f"COPY/model_repository/{relative}" in result.seen
    assert "\n" not in result.seen and says in result.seen and named, result.seen
    assert result.ok, result
