"""The embedding stage of a hot/cold model: a python-backend Triton model.

A model whose embedding tables are larger than memory is served as an ensemble
``<family>_onnx`` of two steps: this stage (``<family>_embedding``), then the
dense ONNX model (``<family>_dense``) that holds only the hot rows. For each
request's ``B x 26`` raw ids this stage answers, with numpy alone
(:mod:`hot_cold_lookup`):

- ``hot_slots``      ``B x 26`` int64: 0 where a lookup is cold, else 1 + its row in
  its table's hot rows;
- ``cold_positions`` ``N`` int64: ``b * 26 + t`` of each cold lookup, ascending;
- ``cold_rows``      ``N x W`` float32: the row store's row of each cold lookup.

The tensors have no batch semantics (``N`` varies per request), so the config
says ``max_batch_size: 0`` and dims ``[-1, 26]``, ``[-1]``, ``[-1, W]``; the
input comes first, the outputs in the order above (``export.tables.ensemble`` writes
the config and every name in it from ``bundle.schema``).

Config ``parameters`` (string values), written by ``export.tables.ensemble``:
``row_store`` (the store's folder) and ``hot_set`` (the hot-set ``.npz``), each
absolute or relative to this model's version folder, ``table_sizes`` (26
comma-separated sizes, checked against both files) and, optionally,
``row_store_fingerprint`` (the store's fingerprint when the stage was exported:
another store under the same path fails the load; absent, one warning),
``cold_reads`` (how cold rows are read from the store: ``io_uring``, the default,
``prefetch``, ``threads`` or ``fault``; see :class:`hot_cold_lookup.ColdReads`),
``cold_read_threads`` (threads of the ``threads`` way) and ``hotness`` (a multi-hot
model's ids per bag of each table, 26 comma-separated counts: its ids are then
``B x H``, ``H`` their sum, C1's bag first, and ``26`` above reads ``H``: each position
is placed in its bag's table).

At load every byte of the store is checked against the checksums in its
``store.json`` (in parallel threads, see :mod:`hot_cold_lookup`); a damaged
or truncated ``rows.bin`` fails this model's load with one line naming the file,
and the repository's other models load as usual. A store written before the
checksums is checked against its SHA-256, or, written without one, loaded with a
warning that it is unverified.

Each request is checked on its own: one with a wrong dtype or shape gets an
INVALID_ARGUMENT response naming the input, and the others are answered.

Metrics: the counter family ``ctr_embedding_lookups_total`` (python backend custom
metrics, on the server's Prometheus page), labelled ``model``, ``version``,
``tier`` (``hot`` or ``cold``) and ``stub`` (one per stub process, see
:class:`_LookupCounters`): the hot-hit rate is
``sum by (model) (rate(..{tier="hot"})) / sum by (model) (rate(..))`` and the cold
rows read per second ``sum by (model) (rate(..{tier="cold"}))``. A python backend without the metrics API
serves without them (one warning at load).

This file, ``hot_cold_lookup.py`` and ``uring.py`` are copied into the model's version folder
(the python backend puts that folder on ``sys.path``); they run in the local
server's stub and in the NGC image's, and import only numpy, the standard
library and ``triton_python_backend_utils``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from hot_cold_lookup import (
    COLD_READS,
    DEFAULT_COLD_READ_HINT_ROWS,
    DEFAULT_COLD_READ_THREADS,
    DEFAULT_COLD_READS,
    PARAM_COLD_READ_HINT_ROWS,
    PARAM_COLD_READ_THREADS,
    PARAM_COLD_READS,
    PARAM_HOT_SET,
    PARAM_HOTNESS,
    PARAM_ROW_STORE,
    PARAM_ROW_STORE_FINGERPRINT,
    PARAM_TABLE_SIZES,
    HotColdLookup,
    RequestError,
    StageError,
)

#: The counter family of lookups by tier.
METRIC_FAMILY = "ctr_embedding_lookups_total"


def _error_response(error: RequestError) -> Any:
    code = pb_utils.TritonError.INVALID_ARG if error.invalid_argument else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(error), code))


def _parameter(parameters: dict[str, Any], key: str, model: str) -> str:
    """A required string parameter of the config."""
    raw = str(parameters.get(key, {}).get("string_value", "")).strip()
    if not raw:
        raise pb_utils.TritonModelException(f"model '{model}': config parameter '{key}' is missing")
    return raw


def _table_sizes(raw: str, model: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise pb_utils.TritonModelException(
            f"model '{model}': parameter '{PARAM_TABLE_SIZES}' must be comma-separated integers, got {raw!r}"
        ) from None
    if any(size < 1 for size in sizes):
        raise pb_utils.TritonModelException(
            f"model '{model}': every table needs at least 1 row, got {PARAM_TABLE_SIZES}={raw!r}"
        )
    return sizes


def _cold_reads(parameters: dict[str, Any], model: str) -> tuple[str, int, int]:
    """The config's way of reading cold rows, its threads and its hint rows (defaults where absent)."""
    how = str(parameters.get(PARAM_COLD_READS, {}).get("string_value", "")).strip() or DEFAULT_COLD_READS
    if how not in COLD_READS:
        raise pb_utils.TritonModelException(
            f"model '{model}': parameter '{PARAM_COLD_READS}' must be one of {', '.join(COLD_READS)}, "
            f"got {how!r}"
        )
    threads = _int_parameter(parameters, PARAM_COLD_READ_THREADS, DEFAULT_COLD_READ_THREADS, 1, model)
    hint_rows = _int_parameter(parameters, PARAM_COLD_READ_HINT_ROWS, DEFAULT_COLD_READ_HINT_ROWS, 0, model)
    return how, threads, hint_rows


def _int_parameter(parameters: dict[str, Any], key: str, default: int, minimum: int, model: str) -> int:
    """The config's integer parameter ``key`` (``default`` where absent), at least ``minimum``."""
    raw = str(parameters.get(key, {}).get("string_value", "")).strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise pb_utils.TritonModelException(
            f"model '{model}': parameter '{key}' must be an integer >= {minimum}, got {raw!r}"
        )
    return value


def _hotness(parameters: dict[str, Any], tables: int, model: str) -> tuple[int, ...] | None:
    """The config's ids per bag of each table (None where absent: one id per table)."""
    raw = str(parameters.get(PARAM_HOTNESS, {}).get("string_value", "")).strip()
    if not raw:
        return None
    try:
        counts = tuple(int(part) for part in raw.split(","))
    except ValueError:
        counts = ()
    if len(counts) != tables or min(counts) < 1:
        raise pb_utils.TritonModelException(
            f"model '{model}': parameter '{PARAM_HOTNESS}' must be {tables} comma-separated counts >= 1, "
            f"got {raw!r}"
        )
    return counts


def _check_tensors(config: dict[str, Any], tables: int, width: int) -> list[str]:
    """Problems of the config's tensors against what the stage answers (empty when none);
    ``tables``: ids per request row (26, or the sum of the bags' sizes)."""
    inputs, outputs = config.get("input", []), config.get("output", [])
    if len(inputs) != 1 or len(outputs) != 3:
        return [f"1 input and 3 outputs expected, the config has {len(inputs)} and {len(outputs)}"]
    expected = [
        (inputs[0], "TYPE_INT64", [-1, tables]),
        (outputs[0], "TYPE_INT64", [-1, tables]),
        (outputs[1], "TYPE_INT64", [-1]),
        (outputs[2], "TYPE_FP32", [-1, width]),
    ]
    problems = []
    for entry, data_type, dims in expected:
        got = [int(dim) for dim in entry.get("dims", [])]
        if str(entry.get("data_type")) != data_type or got != dims:
            problems.append(
                f"'{entry.get('name')}' is {entry.get('data_type')} {got}, "
                f"the stage answers {data_type} {dims}"
            )
    return problems


class _LookupCounters:
    """Hot and cold lookup counters of one model instance (no-ops without the metrics API).

    Each stub process counts under its own ``stub`` label (instance name and pid).
    Two stubs that create a metric of the same labels share it inside tritonserver,
    and when one of them unloads, the other's metric is freed under it: tritonserver
    2.51 then crashed on the next count (triton-inference-server/server#8663). That
    happens whenever a loaded version is loaded again, which a hot-set rollout does
    (:mod:`export.tables.rollout`). Sum over ``stub`` (``sum by (model, version, tier)``).
    """

    def __init__(self, model: str, version: str, instance: str) -> None:
        self._family: Any = None
        self._hot: Any = None
        self._cold: Any = None
        family_type = getattr(pb_utils, "MetricFamily", None)
        if family_type is None:
            pb_utils.Logger.log_warn(
                f"model '{model}': this python backend has no metrics API (pb_utils.MetricFamily); "
                "hot/cold lookup counters are off"
            )
            return
        try:
            self._family = family_type(
                name=METRIC_FAMILY,
                description="Embedding lookups of hot/cold models, by tier: hot rows in the "
                "dense model, cold rows read from the row store",
                kind=family_type.COUNTER,
            )
            labels = {"model": model, "version": version, "stub": f"{instance}/{os.getpid()}"}
            self._hot = self._family.Metric(labels={**labels, "tier": "hot"})
            self._cold = self._family.Metric(labels={**labels, "tier": "cold"})
        except pb_utils.TritonModelException as exc:
            self.close()
            pb_utils.Logger.log_warn(f"model '{model}': hot/cold lookup counters are off: {exc}")

    def add(self, hot: int, cold: int) -> None:
        """Count ``hot`` and ``cold`` lookups (one call each per ``execute``: each is an IPC)."""
        if self._hot is not None and hot:
            self._hot.increment(float(hot))
        if self._cold is not None and cold:
            self._cold.increment(float(cold))

    def close(self) -> None:
        """Drop the metrics (each before its family, as the python backend requires)."""
        self._hot = None
        self._cold = None
        self._family = None


class TritonPythonModel:
    """Places each lookup of a request hot or cold and gathers the cold rows (see the module)."""

    def initialize(self, args: dict[str, str]) -> None:
        """Map the row store, index the hot set and check the config against both.

        Args:
            args: from the python backend: ``model_config`` (JSON),
                ``model_repository`` (this model's folder), ``model_version``,
                ``model_name``, ``model_instance_name``.

        Raises:
            TritonModelException: a parameter missing, a file missing or invalid, or
                sizes that disagree between the config, the store and the hot set;
                fails this model's load.
        """
        config = json.loads(args["model_config"])
        self._name = args["model_name"]
        if int(config.get("max_batch_size", 0)) != 0:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': the embedding stage needs max_batch_size 0 (its outputs "
                "have no batch dimension)"
            )
        parameters = config.get("parameters", {})
        version_dir = Path(args["model_repository"]) / args["model_version"]
        # Resolved, so a load failure names the file as it lies on disk.
        store = (version_dir / _parameter(parameters, PARAM_ROW_STORE, self._name)).resolve()
        hot_set = (version_dir / _parameter(parameters, PARAM_HOT_SET, self._name)).resolve()
        sizes = _table_sizes(_parameter(parameters, PARAM_TABLE_SIZES, self._name), self._name)
        fingerprint = str(parameters.get(PARAM_ROW_STORE_FINGERPRINT, {}).get("string_value", "")).strip()
        how, threads, hint_rows = _cold_reads(parameters, self._name)
        hotness = _hotness(parameters, len(sizes), self._name)
        try:
            self._lookup = HotColdLookup.open(
                store,
                hot_set,
                sizes,
                fingerprint=fingerprint,
                cold_reads=how,
                threads=threads,
                hotness=hotness,
                hint_rows=hint_rows,
            )
        except StageError as exc:
            raise pb_utils.TritonModelException(f"model '{self._name}': {exc}") from exc
        checked = self._lookup.store
        fallback = self._lookup.reads.fallback
        if fallback:
            pb_utils.Logger.log_warn(f"model '{self._name}': io_uring is unavailable ({fallback})")
        if checked is not None and not checked.verified:
            pb_utils.Logger.log_warn(f"model '{self._name}': row store {store}: {checked.check}")
        if not fingerprint:
            pb_utils.Logger.log_warn(
                f"model '{self._name}': config parameter '{PARAM_ROW_STORE_FINGERPRINT}' is absent: "
                "a different store under the same path would not be noticed"
            )
        problems = _check_tensors(config, self._lookup.positions, self._lookup.width)
        if problems:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': config.pbtxt does not match the stage: " + "; ".join(problems)
            )
        self._input = str(config["input"][0]["name"])
        self._outputs = [str(entry["name"]) for entry in config["output"]]
        self._counters = _LookupCounters(self._name, args["model_version"], args["model_instance_name"])
        pb_utils.Logger.log_info(
            f"{args['model_instance_name']}: row store {store} "
            f"({sum(sizes)} rows x {self._lookup.width}; {checked.check if checked else 'not checked'}), "
            f"{self._lookup.hot_rows} hot rows from {hot_set}; cold reads: {how}"
            + (f" ({threads} threads)" if how == "threads" else "")
            + (f"; bags of {sum(hotness)} ids a row" if hotness else "")
        )

    def _answer(self, request: Any) -> tuple[Any, int, int]:
        """One request's response, with its hot and cold lookup counts.

        Raises:
            RequestError: the input is missing, or not ``B x 26`` (``B x H``) int64 with ``B >= 1``.
        """
        tensor = pb_utils.get_input_tensor_by_name(request, self._input)
        if tensor is None:
            raise RequestError(f"input '{self._input}' is missing; model '{self._name}' expects it")
        ids = self._lookup.check_ids(tensor.as_numpy(), self._input)
        placement = self._lookup.place(ids)
        arrays = (placement.hot_slots, placement.cold_positions, placement.cold_rows)
        tensors = [
            pb_utils.Tensor(name, np.ascontiguousarray(array))
            for name, array in zip(self._outputs, arrays, strict=True)
        ]
        response = pb_utils.InferenceResponse(output_tensors=tensors)
        return response, placement.hot_lookups, placement.cold_lookups

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer each request on its own; one bad request gets an error, the others their outputs.

        Args:
            requests: ``pb_utils.InferenceRequest`` objects, each with ``B_i x 26`` ids.

        Returns:
            One ``pb_utils.InferenceResponse`` per request, in order.
        """
        responses = []
        hot_total = cold_total = 0
        for request in requests:
            try:
                response, hot, cold = self._answer(request)
            except RequestError as exc:
                pb_utils.Logger.log_warn(f"model '{self._name}': {exc}")
                responses.append(_error_response(exc))
                continue
            responses.append(response)
            hot_total += hot
            cold_total += cold
        self._counters.add(hot_total, cold_total)
        return responses

    def finalize(self) -> None:
        """Drop the metrics and the store's mapping when the model unloads."""
        self._counters.close()
        if self._lookup is not None:
            self._lookup.close()
        self._lookup = None
