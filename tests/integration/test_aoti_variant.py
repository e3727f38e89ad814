"""``dlrm_aoti`` (an AOTInductor package inside an ensemble with the schema's tensors) exported from
three PyTorch families and served by the real local tritonserver.

Families: the bundle's own tiny DLRM, a TorchRec DLRM state dict (``--feature-order``) and a
TorchRec ``DLRMTrain(DLRM_DCN)`` state dict built with the real ``torchrec`` package, exported as
a model of fixed-size multi-hot bags (``--hotness mlperf``). Each is exported once with the CLI
(``--aoti``, cpu profile: compiled for the CPU, KIND_CPU) into its own repository and served by its
own tritonserver, in turn; tritonserver 2.51 refuses the config's ``platform: "torch_aoti"``, so
the launcher serves it a view of the repository (:mod:`server.repository_view`), and the
repository keeps the config the NGC image serves.

Served answers, over HTTP and gRPC, at batch 1 and on 300 held-out rows whose ids lie far outside
the tables, must be PyTorch eager's within the export's gate (:data:`export.pipeline.AOTI_MAX_ABS_DIFF`):
the bundle's model's own forward for the first family, the test's own TorchRec-layout module and
TorchRec's ``DLRM_DCN`` forward, on ids reduced into their tables, for the others. A request of the
wrong dtype gets one error and the server keeps answering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.repository import AOTI_PLATFORM, CONFIG_NAME, aoti_model_name, aoti_package_name, read_config
from bundle.schema import DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from clients.triton import TritonClient
from criteo.multihot import MLPERF_HOTNESS, expand
from criteo.tsv import Batch
from export.importers.onnx_dlrm import DLRMExporter
from export.pipeline import AOTI_MAX_ABS_DIFF
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm
from server import LocalServer
from tests.byom_torch import (
    TABLE_SIZES,
    TorchRecDLRM,
    in_range,
    torchrec_feature_order,
    torchrec_logits,
    torchrec_sizes,
)
from tests.torchrec_dcn import dcn_logits, make_dcn, train_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODEL, PACKAGE = aoti_model_name("dlrm"), aoti_package_name("dlrm")
INT64 = np.iinfo(np.int64)
EXTREME_IDS = np.array([INT64.min, INT64.max, -1, 10**12, -(10**15), 2**62 + 5], dtype=np.int64)


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)


@dataclass(frozen=True)
class Family:
    """One model a user may bring: the CLI arguments that name it, its rows and PyTorch eager's answer.

    Args:
        args: ``python -m export dlrm`` arguments for the model.
        request: held-out rows in the model's form (``seed``, ``rows``); ids far outside the tables.
        expected: PyTorch eager's probabilities for such rows (``B x 1`` float32).
    """

    args: tuple[str, ...]
    request: Callable[[int, int], Batch]
    expected: Callable[[Batch], np.ndarray]


def _single_hot(rows: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (rows, NUM_DENSE))).astype(np.float32)
    ids = rng.integers(-(2**40), 2**40, (rows, NUM_CATEGORICAL), dtype=np.int64)
    ids[::3] = np.resize(EXTREME_IDS, ids[::3].shape)
    return Batch(dense, ids, None)


def _multi_hot(rows: int, seed: int) -> Batch:
    single = _single_hot(rows, seed)
    return Batch(single.dense, expand(single.categorical, MLPERF_HOTNESS, seed=seed), None)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> dict[str, Family]:
    root = tmp_path_factory.mktemp("aoti_families")
    train_dlrm(
        labeled_file, root / "dlrm", DLRMConfig.preset("tiny", table_size=500), TrainConfig(batch_size=256)
    )
    own = DLRMExporter(root / "dlrm")
    torch.manual_seed(41)
    torchrec = TorchRecDLRM(torchrec_sizes()).eval()
    torch.save({f"model.{k}": v for k, v in torchrec.state_dict().items()}, root / "torchrec.pt")
    dcn = make_dcn(seed=43)
    torch.save(train_state(dcn), root / "dlrm_dcn.pt")
    bag_sizes = np.repeat(np.asarray(TABLE_SIZES, dtype=np.int64), MLPERF_HOTNESS)[None, :]
    order = ",".join(torchrec_feature_order())
    return {
        "bundle_dlrm": Family(("--checkpoint", str(root / "dlrm")), _single_hot, own.predict),
        "torchrec_dlrm": Family(
            ("--checkpoint", str(root / "torchrec.pt"), "--feature-order", order),
            _single_hot,
            lambda b: _sigmoid(torchrec_logits(torchrec, b.dense, in_range(b.categorical))),
        ),
        "torchrec_dcn_multihot": Family(
            ("--checkpoint", str(root / "dlrm_dcn.pt"), "--hotness", "mlperf"),
            _multi_hot,
            lambda b: _sigmoid(dcn_logits(dcn, b.dense, np.mod(b.categorical, bag_sizes), MLPERF_HOTNESS)),
        ),
    }


@dataclass(frozen=True)
class Served:
    family: Family
    repository: Path
    server: LocalServer


@pytest.fixture(scope="module", params=["bundle_dlrm", "torchrec_dlrm", "torchrec_dcn_multihot"])
def served(
    request: pytest.FixtureRequest,
    families: dict[str, Family],
    start_triton,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """One family exported with ``--aoti`` into its own repository, served by its own tritonserver."""
    family = families[request.param]
    repository = tmp_path_factory.mktemp(f"aoti_{request.param}") / "model_repository"
    done = subprocess.run(
        [sys.executable, "-m", "export", "dlrm", *family.args, "--repository", str(repository), "--aoti",
         "--no-fp16", "--no-int8", "--no-raw-rows", "--check-rows", "1024"],
        capture_output=True, text=True, check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    server = start_triton(repository)
    yield Served(family, repository, server)
    server.stop()


def _infer(served: Served, protocol: str, batch: Batch) -> np.ndarray:
    url = served.server.http_url if protocol == "http" else served.server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        return client.infer(MODEL, batch.inputs())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_answers_are_pytorch_eagers_within_the_gate(served: Served, protocol: str) -> None:
    batch = served.family.request(300, 7)
    expected = served.family.expected(batch)
    assert float(np.std(expected)) > 1e-3  # the rows tell the tables apart: not a constant model
    answer = _infer(served, protocol, batch)
    assert answer.shape == (300, 1) and answer.dtype == np.float32
    assert float(np.max(np.abs(answer.astype(np.float64) - expected))) <= AOTI_MAX_ABS_DIFF
    one = _infer(served, protocol, batch.slice(0, 1))
    assert float(np.max(np.abs(one.astype(np.float64) - expected[:1]))) <= AOTI_MAX_ABS_DIFF


def test_a_wrong_dtype_gets_one_error_and_the_server_keeps_answering(served: Served) -> None:
    batch = served.family.request(4, 8)
    inputs = batch.inputs()
    bad = {**inputs, DENSE_INPUT: inputs[DENSE_INPUT].astype(np.float64)}

    def tensors(arrays: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
        out = []
        for name, array in arrays.items():
            kind = {"float32": "FP32", "float64": "FP64", "int64": "INT64"}[array.dtype.name]
            tensor = httpclient.InferInput(name, list(array.shape), kind)
            tensor.set_data_from_numpy(np.ascontiguousarray(array))
            out.append(tensor)
        return out

    client = httpclient.InferenceServerClient(served.server.http_url)
    try:
        with pytest.raises(
            InferenceServerException, match=rf"FP64.*'{DENSE_INPUT}'|'{DENSE_INPUT}'.*FP64"
        ) as error:
            client.infer(MODEL, tensors(bad))
        assert "\n" not in str(error.value.message())
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        answer = client.infer(MODEL, tensors(inputs)).as_numpy(OUTPUT)
    finally:
        client.close()
    assert (
        float(np.max(np.abs(answer.astype(np.float64) - served.family.expected(batch)))) <= AOTI_MAX_ABS_DIFF
    )


def test_the_repository_keeps_the_config_the_ngc_image_serves(served: Served) -> None:
    assert read_config(served.repository / PACKAGE / CONFIG_NAME).platform == AOTI_PLATFORM
    report = json.loads((served.repository / MODEL / "export_report.json").read_text())
    assert report["torch_version"] == torch.__version__ and report["device"] == "cpu"
    assert report["parity"]["max_abs_diff"] <= AOTI_MAX_ABS_DIFF
