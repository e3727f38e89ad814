"""A model with the bundle's inputs that answers zeros in about a millisecond, one request at a
time, and stalls once on demand: when the file ``stall`` appears in its version folder, it sleeps
:data:`STALL_S` on the next request (and removes the file). The open-loop tests and the lab's
open-loop test serve it."""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from bundle.repository import write_config
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT

MODEL = "stall"
STALL_S = 0.2

MODEL_PY = f'''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._flag = os.path.join(args["model_repository"], args["model_version"], "stall")

    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "{DENSE_INPUT}").as_numpy().shape[0]
            if os.path.exists(self._flag):
                os.remove(self._flag)
                time.sleep({STALL_S})
            output = pb_utils.Tensor("{OUTPUT}", np.zeros((rows, 1), dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
'''


def write_stall_model(root: Path) -> Path:
    """The model in the repository ``root`` (created); ``root``."""
    config = mc.ModelConfig(name=MODEL, backend="python", max_batch_size=64)
    config.input.add(name=DENSE_INPUT, data_type=mc.TYPE_FP32, dims=[NUM_DENSE])
    config.input.add(name=CATEGORICAL_INPUT, data_type=mc.TYPE_INT64, dims=[NUM_CATEGORICAL])
    config.output.add(name=OUTPUT, data_type=mc.TYPE_FP32, dims=[1])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    write_config(root / MODEL, config)
    return root
