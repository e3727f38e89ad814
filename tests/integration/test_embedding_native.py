"""The embedding stage (the C++ backend ``embedding`` that ``make stages`` builds), as the export
writes it, loaded by the real local tritonserver and held to its reference in Python.

Two stages are written by :func:`export.tables.ensemble.write_embedding_stage`: ``dlrm_embedding``
(a float32 store, one id per table, two instances reading cold rows by ``io_uring``) and
``wide_deep_embedding`` (an int8 store of two columns, bags of 1 to 3 ids per table, read the
``prefetch`` way). Over HTTP and gRPC, for real rows and wild ids (negative, huge, the int64
extremes), all-hot and all-cold requests at batch 1, 64 and 1024, each answers the tensors of
:class:`~export.stage.hot_cold_lookup.HotColdLookup` over the same files, bit for bit; a
request the stage refuses (an empty batch) gets the reference's error text, and one of another
type or shape Triton's own error naming the input; a bad parameter or a damaged store fails only
that model's load, in the words the tests pin and the file named; an unverified store and an
absent fingerprint load with a warning; each instance logs its load line; and the counters
appear on the metrics page under their family and labels. Until the python stage was removed,
the same tests held the compiled stage to it, bit for bit and word for word. Skips when the
compiled stages are not built.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.repository import CONFIG_NAME, read_config, write_config
from bundle.schema import CATEGORICAL_INPUT, COLD_POSITIONS, COLD_ROWS, HOT_SLOTS, NUM_CATEGORICAL
from export.stage.hot_cold_lookup import (
    COLD_READ_FAULT,
    PARAM_COLD_CACHE_BYTES,
    PARAM_COLD_READ_HINT_ROWS,
    PARAM_COLD_READS,
    PARAM_HOT_SET,
    PARAM_HOTNESS,
    PARAM_ROW_STORE_FINGERPRINT,
    PARAM_TABLE_SIZES,
    STORE_CHECKSUMS_KEY,
    STORE_FINGERPRINT_KEY,
    STORE_META_FILE,
    STORE_ROWS_FILE,
    HotColdLookup,
    StageError,
)
from export.tables.ensemble import HOT_SET_FILE, embedding_model_name, write_embedding_stage
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays
from server import LocalServer
from server.config import ModelControlMode
from server.installation import COMPILED_STAGES
from tests.native_stages import ids_reference

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (COMPILED_STAGES / "embedding" / "libtriton_embedding.so").is_file(),
        reason=f"the compiled stages are not built ({COMPILED_STAGES} has no embedding): run `make stages`",
    ),
]

PROTOCOLS = ("http", "grpc")
#: Rows of the cache of the cached copy of the dlrm stage.
CACHE_ROWS = 40
OUTPUTS = (HOT_SLOTS, COLD_POSITIONS, COLD_ROWS)
INT64 = np.iinfo(np.int64)
METRIC = re.compile(r"^ctr_embedding_lookups_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$", re.MULTILINE)
ROWS_METRIC = re.compile(
    r"^ctr_embedding_cold_rows_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$", re.MULTILINE
)


@dataclass(frozen=True)
class Stage:
    """One exported stage: its model, what the ids must fit, and its reference in process."""

    model: str
    sizes: tuple[int, ...]
    hotness: tuple[int, ...]
    hot_ids: tuple[np.ndarray, ...]
    lookup: HotColdLookup

    @property
    def positions(self) -> int:
        return sum(self.hotness)


def _write_stage(
    repository: Path,
    root: Path,
    family: str,
    dtype: str,
    hotness: tuple[int, ...] | None,
    cold_reads: str,
    seed: int,
) -> Stage:
    rng = np.random.default_rng(seed)
    sizes = tuple(int(size) for size in rng.integers(1, 120, NUM_CATEGORICAL))
    if family == "wide_deep":
        spec = RowStoreSpec.for_wide_deep(sizes, 5, dtype)
    else:
        spec = RowStoreSpec.for_dlrm(sizes, 4, dtype)
    tables = [rng.normal(0, 1, (size, spec.width)).astype(np.float32) for size in sizes]
    name = embedding_model_name(family)
    # Inside the stage's model folder (written as a relative path): the copy takes its own.
    store = repository / name / "rows"
    write_arrays(store, spec, tables)
    # At least one hot row a table: an all-hot request reads no cold row at all (N = 0).
    hot_ids = tuple(rng.permutation(size)[: max(1, size // 3)].astype(np.int64) for size in sizes)
    hot = HotSet(
        table_sizes=sizes,
        row_bytes=(spec.row_bytes,) * NUM_CATEGORICAL,
        budget_bytes=10**9,
        ids=hot_ids,
        counts=tuple(np.ones(ids.size, dtype=np.int64) for ids in hot_ids),
        profiled_lookups=1,
    )
    write_embedding_stage(
        repository, family, store, hot.save(root / f"hot-{family}.npz"), sizes, spec.width,
        instances=2, cold_reads=cold_reads, hotness=hotness,
    )  # fmt: skip
    counts = hotness if hotness is not None else (1,) * NUM_CATEGORICAL
    hot_set = repository / name / "1" / HOT_SET_FILE
    lookup = HotColdLookup.open(store, hot_set, sizes, cold_reads=COLD_READ_FAULT, hotness=hotness)
    return Stage(name, sizes, counts, hot_ids, lookup)


def _copy_changed(
    repository: Path, name: str, copy: str, change: Callable[[Any], None] | None = None
) -> None:
    """The stage's folder as ``copy``, its config changed by ``change``."""
    shutil.copytree(repository / name, repository / copy)
    config = read_config(repository / copy / CONFIG_NAME)
    config.name = copy
    if change is not None:
        change(config)
    write_config(repository / copy, config)


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Stage]]]:
    root = tmp_path_factory.mktemp("native-embedding")
    repository = root / "model_repository"
    hotness = tuple(int(count) for count in np.random.default_rng(3).integers(1, 4, NUM_CATEGORICAL))
    written = [
        _write_stage(repository, root, "dlrm", "float32", None, "io_uring", seed=1),
        _write_stage(repository, root, "wide_deep", "int8", hotness, "prefetch", seed=2),
    ]
    # The dlrm stage again with a cache of cold rows its two instances share, so small that
    # requests keep evicting rows from it (its rows: 4 float32 values).
    cached = f"{written[0].model}_cached"
    _copy_changed(
        repository, written[0].model, cached, _bad_parameter(PARAM_COLD_CACHE_BYTES, str(CACHE_ROWS * 16))
    )
    yield repository, [*written, replace(written[0], model=cached)]
    for stage in written:
        stage.lookup.close()


@pytest.fixture(scope="module")
def server(start_triton: Callable[..., LocalServer], stages: tuple[Path, list[Stage]]) -> LocalServer:
    return start_triton(stages[0])


def _url(server: LocalServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def _infer(
    server: LocalServer, protocol: str, model: str, ids: np.ndarray, datatype: str = "INT64"
) -> dict[str, np.ndarray] | tuple[str, str]:
    """The three outputs, or the error's status and text with the model's name taken out."""
    module: Any = grpcclient if protocol == "grpc" else httpclient
    with module.InferenceServerClient(_url(server, protocol)) as client:
        tensor = module.InferInput(CATEGORICAL_INPUT, list(ids.shape), datatype)
        tensor.set_data_from_numpy(ids)
        outputs = [module.InferRequestedOutput(name) for name in OUTPUTS]
        try:
            result = client.infer(model, [tensor], outputs=outputs)
        except InferenceServerException as exc:
            return str(exc.status()), str(exc.message()).replace(f"'{model}'", "'MODEL'")
        return {name: np.asarray(result.as_numpy(name)) for name in OUTPUTS}


def _ids(stage: Stage, rng: np.random.Generator, batch: int, case: str) -> np.ndarray:
    """``batch x H`` raw ids: in range, wild (any int64), or reducing to hot (cold) rows only."""
    columns = np.repeat(np.arange(NUM_CATEGORICAL), stage.hotness)
    sizes = np.asarray(stage.sizes, dtype=np.int64)[columns]
    ids = rng.integers(0, sizes, (batch, columns.size))
    if case == "wild":
        wild = rng.random(ids.shape) < 0.5
        ids[wild] = rng.integers(INT64.min, INT64.max, int(wild.sum()), dtype=np.int64, endpoint=True)
        ids[:1, :4] = [INT64.min, INT64.max, -1, -int(sizes[3])]
    elif case in ("hot", "cold"):
        for position, table in enumerate(columns):
            hot = stage.hot_ids[table]
            pool = hot if case == "hot" else np.setdiff1d(np.arange(stage.sizes[table]), hot)
            if pool.size == 0:  # a table without hot (or without cold) rows: its other tier
                pool = np.arange(stage.sizes[table])
            ids[:, position] = rng.choice(pool, batch) + stage.sizes[table] * rng.integers(-2, 3, batch)
    return ids


def _assert_same(answered: Any, expected: Any) -> None:
    assert isinstance(expected, dict), expected
    assert isinstance(answered, dict), answered
    for name in OUTPUTS:
        assert answered[name].dtype == expected[name].dtype, name
        assert answered[name].shape == expected[name].shape, name
        assert answered[name].tobytes() == expected[name].tobytes(), name


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("batch", [1, 64, 1024])
@pytest.mark.parametrize("case", ["real", "wild", "hot", "cold"])
def test_the_stage_answers_as_its_reference(
    server: LocalServer, stages: tuple[Path, list[Stage]], protocol: str, batch: int, case: str
) -> None:
    for index, stage in enumerate(stages[1]):
        ids = _ids(stage, np.random.default_rng([batch, index, len(case)]), batch, case)
        expected = ids_reference(stage.lookup, ids)
        answered = _infer(server, protocol, stage.model, ids)
        _assert_same(answered, expected)
        assert isinstance(answered, dict)
        cold = answered[COLD_POSITIONS].size
        assert answered[COLD_ROWS].shape[0] == cold
        if case == "hot":
            assert cold == 0
        if case == "cold":
            assert cold > 0


#: The status of a refused request, by protocol.
INVALID = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}


def _bad_requests(stage: Stage) -> list[tuple[np.ndarray, str]]:
    """Ids of another type or shape: Triton's own checks refuse them before the stage."""
    good = np.zeros((2, stage.positions), dtype=np.int64)
    return [
        (good.astype(np.int32), "INT32"),
        (good.astype(np.float32), "FP32"),
        (good[:, :-1], "INT64"),
        (np.zeros((2, stage.positions + 1), dtype=np.int64), "INT64"),
        (good.reshape(-1), "INT64"),
        (good.reshape(1, 2, -1), "INT64"),
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_request_gets_its_own_error(
    server: LocalServer, stages: tuple[Path, list[Stage]], protocol: str
) -> None:
    for stage in stages[1]:
        for ids, datatype in _bad_requests(stage):
            error = _infer(server, protocol, stage.model, ids, datatype)
            assert isinstance(error, tuple), (ids.shape, datatype)
            assert error[0] == INVALID[protocol] and f"'{CATEGORICAL_INPUT}'" in error[1], error
        # An empty batch passes Triton's own checks: the stage refuses it as its reference does.
        empty = np.zeros((0, stage.positions), dtype=np.int64)
        expected = ids_reference(stage.lookup, empty)
        assert expected == f"input '{CATEGORICAL_INPUT}' is an empty batch (shape [0, {stage.positions}])"
        assert _infer(server, protocol, stage.model, empty) == (INVALID[protocol], expected)


def test_a_missing_input_is_refused_naming_it(server: LocalServer, stages: tuple[Path, list[Stage]]) -> None:
    stage = stages[1][0]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("not_" + CATEGORICAL_INPUT, [1, stage.positions], "INT64")
        tensor.set_data_from_numpy(np.zeros((1, stage.positions), dtype=np.int64))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(stage.model, [tensor])
        with pytest.raises(InferenceServerException) as nothing:
            client.infer(stage.model, [])
        assert client.is_model_ready(stage.model)
    for error in (caught, nothing):
        assert error.value.status() == INVALID["grpc"] and stage.model in str(error.value.message())
    assert f"'not_{CATEGORICAL_INPUT}'" in str(caught.value.message())


def test_bad_requests_in_flight_cost_the_others_nothing(
    server: LocalServer, stages: tuple[Path, list[Stage]]
) -> None:
    """Good and empty requests at once, over both instances: each good one answered as the
    reference answers it, each empty one refused."""
    stage = stages[1][0]
    rng = np.random.default_rng(6)
    requests = [_ids(stage, rng, 0 if index % 3 == 0 else 16, "wild") for index in range(24)]

    def send(ids: np.ndarray) -> Any:
        return _infer(server, "grpc", stage.model, ids)

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(send, requests))
    for ids, answer in zip(requests, answers, strict=True):
        if ids.shape[0] == 0:
            assert isinstance(answer, tuple) and "empty batch" in answer[1], answer
        else:
            _assert_same(answer, ids_reference(stage.lookup, ids))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready(stage.model)


def _counters(
    server: LocalServer, metric: re.Pattern[str] = METRIC, key: str = "tier"
) -> dict[tuple[str, ...], float]:
    """``{(model, version, tier, stub): value}`` of the stage counters on the metrics page
    (``(model, version, source, stub)`` of the cold row counters)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    counters: dict[tuple[str, ...], float] = {}
    for match in metric.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        assert set(labels) == {"model", "version", key, "stub"}, labels
        counters[(labels["model"], labels["version"], labels[key], labels["stub"])] = float(
            match.group("value")
        )
    return counters


def _by_tier(counters: dict[tuple[str, ...], float], model: str) -> dict[str, float]:
    tiers: dict[str, float] = {}
    for (name, _, tier, _), value in counters.items():
        if name == model:
            tiers[tier] = tiers.get(tier, 0.0) + value
    return tiers


@pytest.mark.parametrize("tier", ["default", "small"])
def test_a_tier_counts_the_cold_lookups_by_source(
    server: LocalServer, stages: tuple[Path, list[Stage]], tier: str
) -> None:
    """Each request's cold lookups by where their rows came from, the memory tier or the store:
    together every cold lookup. The same request twice: with the default tier (the whole store) the
    second time wholly from the tier, with a small one partly."""
    suffix = "_cached" if tier == "small" else ""
    stage = next(stage for stage in stages[1] if stage.model == f"dlrm_embedding{suffix}")
    ids = _ids(stage, np.random.default_rng(9), 1, "cold")
    cold = stage.lookup.place(ids).cold_lookups
    assert cold > 0
    sources = []
    for _ in range(2):
        before = _by_tier(_counters(server, ROWS_METRIC, "source"), stage.model)
        assert isinstance(_infer(server, "grpc", stage.model, ids), dict)
        after = _by_tier(_counters(server, ROWS_METRIC, "source"), stage.model)
        sources.append(
            {source: after.get(source, 0.0) - before.get(source, 0.0) for source in ("cache", "store")}
        )
    assert all(counts["cache"] + counts["store"] == cold for counts in sources), (cold, sources)
    assert sources[1]["cache"] > 0, sources
    if tier == "default":
        assert sources[1] == {"cache": cold, "store": 0.0}, sources


def test_the_counters_appear_under_their_family_and_labels(
    server: LocalServer, stages: tuple[Path, list[Stage]]
) -> None:
    stage = stages[1][0]
    before = _counters(server)
    native = [key for key in before if key[0] == stage.model]
    # Two instances, two tiers: one counter each.
    assert {(key[1], key[2]) for key in native} == {("1", "hot"), ("1", "cold")}, before
    assert len({key[3] for key in native}) == 2 and all(re.fullmatch(r".+_\d+/\d+", key[3]) for key in native)
    ids = _ids(stage, np.random.default_rng(8), 64, "real")
    answer = _infer(server, "http", stage.model, ids)
    assert isinstance(answer, dict)
    cold = answer[COLD_POSITIONS].size
    after_native = _by_tier(_counters(server), stage.model)
    before_native = _by_tier(before, stage.model)
    assert after_native["hot"] - before_native["hot"] == ids.size - cold
    assert after_native["cold"] - before_native["cold"] == cold


def _bad_parameter(key: str, value: str | None) -> Callable[[Any], None]:
    def change(config: Any) -> None:
        if value is None:
            del config.parameters[key]
        else:
            config.parameters[key].string_value = value

    return change


def _bad_dims(config: Any) -> None:
    config.output[2].dims[:] = [-1, 5]


def _bad_batch(config: Any) -> None:
    config.max_batch_size = 4


def _cached_fault(config: Any) -> None:
    config.parameters[PARAM_COLD_READS].string_value = COLD_READ_FAULT
    config.parameters[PARAM_COLD_CACHE_BYTES].string_value = "4096"


#: A broken config of the dlrm stage, and the words the stage refuses it with.
BAD_CONFIGS: list[tuple[str, Callable[[Any], None], str]] = [
    ("cold_reads", _bad_parameter(PARAM_COLD_READS, "mmap"),
     "parameter 'cold_reads' must be one of io_uring, prefetch, threads, fault, got \"mmap\""),
    ("hint_rows", _bad_parameter(PARAM_COLD_READ_HINT_ROWS, "many"),
     "parameter 'cold_read_hint_rows' must be an integer >= 0, got \"many\""),
    ("no_hot_set", _bad_parameter(PARAM_HOT_SET, None), "config parameter 'hot_set' is missing"),
    ("sizes", _bad_parameter(PARAM_TABLE_SIZES, "1,x"),
     "parameter 'table_sizes' must be comma-separated integers, got \"1,x\""),
    ("zero_size", _bad_parameter(PARAM_TABLE_SIZES, "0,'1"),
     "parameter 'table_sizes' must be comma-separated integers, got \"0,'1\""),
    ("hotness", _bad_parameter(PARAM_HOTNESS, "1,2"),
     "parameter 'hotness' must be 26 comma-separated counts >= 1, got \"1,2\""),
    ("dims", _bad_dims,
     f"config.pbtxt does not match the stage: '{COLD_ROWS}' is TYPE_FP32 [-1, 5], "
     "the stage answers TYPE_FP32 [-1, 4]"),
    ("batch", _bad_batch, "the embedding stage needs max_batch_size 0 (its outputs have no batch dimension)"),
    ("cache_bytes", _bad_parameter(PARAM_COLD_CACHE_BYTES, "lots"),
     "parameter 'cold_cache_bytes' must be an integer >= 0, got \"lots\""),
    ("cache_small", _bad_parameter(PARAM_COLD_CACHE_BYTES, "15"),
     "parameter 'cold_cache_bytes': a cold row cache of 15 bytes holds no row of 16 bytes"),
    ("cache_fault", _cached_fault,
     "parameter 'cold_cache_bytes' needs cold_reads io_uring, prefetch or threads: 'fault' maps the store"),
]  # fmt: skip


def _load_error(server: LocalServer, model: str) -> str:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(model)
        assert client.is_server_live()
    return str(caught.value.message())


def test_a_bad_config_or_a_damaged_store_fails_only_that_models_load(
    start_triton: Callable[..., LocalServer], stages: tuple[Path, list[Stage]], tmp_path: Path
) -> None:
    source, [stage, *_] = stages
    repository = tmp_path / "model_repository"
    repository.mkdir()
    shutil.copytree(source / stage.model, repository / stage.model)
    for label, change, _ in BAD_CONFIGS:
        _copy_changed(repository, stage.model, label, change)
    # A store with one bit flipped.
    _copy_changed(repository, stage.model, "damaged")
    rows = repository / "damaged" / "rows" / STORE_ROWS_FILE
    data = bytearray(rows.read_bytes())
    data[len(data) // 2] ^= 0x10
    rows.write_bytes(bytes(data))
    # A store written before the checksums, and a config without the store's fingerprint: it
    # loads, warned about.
    _copy_changed(repository, stage.model, "unverified", _bad_parameter(PARAM_ROW_STORE_FINGERPRINT, None))
    meta_path = repository / "unverified" / "rows" / STORE_META_FILE
    meta = json.loads(meta_path.read_text())
    for key in (STORE_CHECKSUMS_KEY, STORE_FINGERPRINT_KEY, "sha256"):
        meta.pop(key, None)
    meta_path.write_text(json.dumps(meta))
    server = start_triton(repository, model_control_mode=ModelControlMode.EXPLICIT)
    for label, _, says in BAD_CONFIGS:
        message = _load_error(server, label)
        assert f"model '{label}': {says}" in message, (label, message)
    damaged = repository / "damaged" / "rows"
    with pytest.raises(StageError) as caught:
        HotColdLookup.open(damaged.resolve(), repository / "damaged" / "1" / "hot_set.npz", stage.sizes)
    expected = str(caught.value)
    assert str(damaged.resolve() / STORE_ROWS_FILE) in expected and "is damaged" in expected
    message = _load_error(server, "damaged")
    assert f"model 'damaged': {expected}" in message, message
    # The healthy stage loads and answers beside them; so does the unverified one.
    ids = _ids(stage, np.random.default_rng(1), 4, "wild")
    for name in (stage.model, "unverified"):
        server.load_model(name)
        assert isinstance(_infer(server, "grpc", name, ids), dict)
    server.stop()
    log = server.log_file.read_text(errors="replace")
    store = (repository / "unverified" / "rows").resolve()
    for warning in (
        f"model 'unverified': config parameter '{PARAM_ROW_STORE_FINGERPRINT}' is absent: "
        "a different store under the same path would not be noticed",
        f"model 'unverified': row store {store}: UNVERIFIED: {STORE_META_FILE} has no checksums",
    ):
        assert warning in log, warning


def test_warnings_and_the_load_line_are_logged(server: LocalServer, stages: tuple[Path, list[Stage]]) -> None:
    """The load line of each instance names the store, the hot set and the way of reading."""
    log = server.log_file.read_text(errors="replace")
    for stage in stages[1]:
        lines = [line for line in log.splitlines() if f"{stage.model}_0_" in line and ": row store " in line]
        assert len(lines) == 2, lines
        assert "hot rows from " in lines[0] and "; cold reads: " in lines[0], lines[0]
        if stage.model.endswith("_cached"):
            tier = (
                f"; a memory tier of {CACHE_ROWS} cold rows ({CACHE_ROWS * 16} bytes, "
                f"{PARAM_COLD_CACHE_BYTES} {CACHE_ROWS * 16}), its misses read "
            )
        else:
            rows = sum(stage.sizes)
            store = stage.lookup.store
            assert store is not None
            row_bytes = store.data.shape[1] * store.data.itemsize
            tier = (
                f"; a memory tier of the whole store, {rows} cold rows ({rows * row_bytes} bytes, "
                "by default: the store fits a quarter of the "
            )
        assert tier in lines[0], lines[0]
