"""Raw-row models: Criteo rows in, as the client has them, a served model's scores out.

For each model an export serves (``dlrm_onnx``, ``dlrm_onnx_int8``, a hot/cold
ensemble, ``dlrm_torch``, ...), :func:`write_raw_models` writes ``<model>_raw``:
a Triton ensemble of two steps,

1. ``criteo_rows``: the raw-row stage (``backends/raw_rows``), which parses
   ``raw_rows`` (``B x 1`` BYTES, one unlabeled TSV row per element) into
   ``dense_features`` and ``categorical_ids`` by the rules of :mod:`criteo.rows`. It is
   the compiled stage, the Triton C++ backend ``raw_rows`` (``backend.cc``, built by
   ``make stages``; in compose, by the image's build stage), whose parse a differential
   test holds to :mod:`criteo.rows`; its version folder holds only a note that keeps it
   in object storage;
2. the model itself, whose ``click_probability`` is the ensemble's output.

A client picks the precision by the name, as it does without raw rows:
``dlrm_onnx_int8_raw`` scores with ``dlrm_onnx_int8``. The family's own,
``<family>_raw`` (``dlrm_raw``), scores with the model to call by default: the
INT8 variant where the export wrote it, else FP32. One stage serves every
family: its dynamic batcher gathers the rows of concurrent requests into one
vectorised parse.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.repository import (
    CONFIG_NAME,
    make_compiled_stage_version,
    make_ensemble_version,
    read_config,
    version_dir,
    write_config,
)
from bundle.schema import (
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
    RAW_ROWS_INPUT,
    raw_model_name,
)

#: The raw-row stage's model name (one for every family).
STAGE_MODEL = "criteo_rows"
#: Rows the stage takes in one execution at most (a served model's max batch size may not exceed it).
STAGE_MAX_BATCH = 65536
#: Instances of the stage.
STAGE_INSTANCES = 1
#: The stage's backend: tritonserver opens ``<backends>/raw_rows/libtriton_raw_rows.so``.
STAGE_BACKEND = "raw_rows"


def build_stage_config() -> mc.ModelConfig:
    """The stage's config: ``raw_rows`` BYTES ``[1]`` in, the schema's two input tensors out, a
    dynamic batcher that gathers concurrent requests (no delay added)."""
    config = mc.ModelConfig(name=STAGE_MODEL, backend=STAGE_BACKEND, max_batch_size=STAGE_MAX_BATCH)
    config.input.add(name=RAW_ROWS_INPUT, data_type=mc.TYPE_STRING, dims=[1])
    config.output.add(name=DENSE_INPUT, data_type=mc.TYPE_FP32, dims=[NUM_DENSE])
    config.output.add(name=CATEGORICAL_INPUT, data_type=mc.TYPE_INT64, dims=[NUM_CATEGORICAL])
    config.dynamic_batching.SetInParent()
    group = config.instance_group.add()
    group.count = STAGE_INSTANCES
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    return config


def write_stage(repository: Path) -> Path:
    """Write the stage ``criteo_rows``: its config and its version folder, which holds a file
    that keeps the folder in object storage (the code is the backend's library); the config's
    path."""
    shutil.rmtree(version_dir(repository, STAGE_MODEL, 1), ignore_errors=True)
    make_compiled_stage_version(repository, STAGE_MODEL, STAGE_BACKEND)
    return write_config(repository / STAGE_MODEL, build_stage_config())


def build_raw_config(model: str, served: mc.ModelConfig, name: str = "") -> mc.ModelConfig:
    """The ensemble ``<model>_raw`` (or ``name``) over ``model`` (whose config is ``served``).

    A batching model (``max_batch_size`` > 0) gives a batching ensemble of the same
    maximum; a model without batching (a hot/cold ensemble) one without, its
    tensors then ``[-1, 1]``.

    Raises:
        ConfigError: the model batches more rows than the stage takes.
    """
    batch = int(served.max_batch_size)
    if batch > STAGE_MAX_BATCH:
        raise ConfigError(f"{model}: max_batch_size {batch} exceeds the raw-row stage's {STAGE_MAX_BATCH}")
    config = mc.ModelConfig(name=name or raw_model_name(model), platform="ensemble", max_batch_size=batch)
    leading = [] if batch else [-1]
    config.input.add(name=RAW_ROWS_INPUT, data_type=mc.TYPE_STRING, dims=[*leading, 1])
    config.output.add(name=OUTPUT, data_type=mc.TYPE_FP32, dims=[*leading, 1])
    stage = config.ensemble_scheduling.step.add(model_name=STAGE_MODEL, model_version=-1)
    stage.input_map[RAW_ROWS_INPUT] = RAW_ROWS_INPUT
    step = config.ensemble_scheduling.step.add(model_name=model, model_version=-1)
    for tensor in (DENSE_INPUT, CATEGORICAL_INPUT):
        stage.output_map[tensor] = tensor
        step.input_map[tensor] = tensor
    step.output_map[OUTPUT] = OUTPUT
    return config


def write_raw_models(repository: Path, models: list[str], family: str = "") -> list[str]:
    """Write the stage and ``<model>_raw`` for each of ``models`` (each in ``repository``), and with
    ``family`` the family's own raw-row model, ``<family>_raw``, over the first of ``models``
    (the one to call by default); their names."""
    if not models:
        return []
    write_stage(repository)
    written = []
    targets = [(model, raw_model_name(model)) for model in models]
    if family:
        targets.append((models[0], raw_model_name(family)))
    for model, name in targets:
        served = read_config(repository / model / CONFIG_NAME)
        shutil.rmtree(repository / name, ignore_errors=True)
        make_ensemble_version(repository, name)
        write_config(repository / name, build_raw_config(model, served, name))
        written.append(name)
    return written
