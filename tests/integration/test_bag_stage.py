"""A multi-hot model's embedding stage in the real tritonserver: ``B x H`` bags placed id by id.

The stage's own files run in the local server's python stub with the config's ``hotness``;
its answers are compared with the contract computed one id at a time, over HTTP and gRPC,
and a request shaped for one id per table gets one error line while the server stays up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.schema import CATEGORICAL_INPUT, COLD_POSITIONS, COLD_ROWS, HOT_SLOTS, NUM_CATEGORICAL
from export.tables.ensemble import embedding_model_name, write_embedding_stage
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays
from server import LocalServer
from tests.stage_contract import stage_contract

FAMILY = "dlrm"
STAGE = embedding_model_name(FAMILY)
WIDTH = 8
SIZES = tuple(5 + 3 * t for t in range(NUM_CATEGORICAL))
#: 1 to 3 ids per bag: 52 ids a row.
HOTNESS = tuple(1 + t % 3 for t in range(NUM_CATEGORICAL))
TABLES = [
    np.random.default_rng(t).normal(0, 1, (size, WIDTH)).astype(np.float16) for t, size in enumerate(SIZES)
]
HOT_IDS = tuple(np.random.default_rng(100 + t).permutation(size)[: size // 2] for t, size in enumerate(SIZES))


@pytest.fixture(scope="module")
def server(start_triton: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("bag_stage")
    store = root / "rows"
    write_arrays(store, RowStoreSpec.for_dlrm(SIZES, WIDTH, "float16"), TABLES)
    hot = HotSet(
        SIZES, (WIDTH * 4,) * NUM_CATEGORICAL, 10**6, HOT_IDS,
        tuple(np.ones(ids.size, dtype=np.int64) for ids in HOT_IDS), sum(ids.size for ids in HOT_IDS),
    )  # fmt: skip
    write_embedding_stage(root / "repository", FAMILY, store, hot.save(root / "hot.npz"), hotness=HOTNESS)
    started = start_triton(root / "repository")
    yield started
    started.stop()


def _infer(server: LocalServer, protocol: str, ids: np.ndarray) -> Any:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    tensor = module.InferInput(CATEGORICAL_INPUT, list(ids.shape), "INT64")
    tensor.set_data_from_numpy(ids)
    try:
        return client.infer(STAGE, [tensor])
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bags_are_placed_id_by_id(server: LocalServer, protocol: str) -> None:
    rng = np.random.default_rng(["http", "grpc"].index(protocol))
    info = np.iinfo(np.int64)
    ids = rng.integers(-1000, 1000, (16, sum(HOTNESS)), dtype=np.int64)
    ids[0, :4] = [info.min, info.max, -1, 0]
    answer = _infer(server, protocol, ids)
    slots, positions, rows = stage_contract(ids, HOT_IDS, SIZES, TABLES, HOTNESS)
    np.testing.assert_array_equal(answer.as_numpy(HOT_SLOTS), slots)
    np.testing.assert_array_equal(answer.as_numpy(COLD_POSITIONS), positions)
    assert answer.as_numpy(COLD_ROWS).tobytes() == rows.tobytes()
    assert 0 < positions.size < ids.size  # both tiers answered


def test_ids_shaped_for_one_id_per_table_get_one_error(server: LocalServer) -> None:
    ids = np.zeros((2, NUM_CATEGORICAL), dtype=np.int64)
    with pytest.raises(
        InferenceServerException, match=rf"expected \[-1,\s*{sum(HOTNESS)}\]|unexpected shape"
    ):
        _infer(server, "grpc", ids)
    # Still answering.
    assert _infer(server, "http", np.ones((1, sum(HOTNESS)), dtype=np.int64)).as_numpy(HOT_SLOTS).shape == (
        1,
        sum(HOTNESS),
    )
