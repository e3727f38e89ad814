"""PyTriton serving one ONNX Runtime session: the peer that binds a Python function into Triton.

PyTriton starts the same tritonserver binary as the bundle's local server,
but runs the model in this Python process: Triton's python backend passes
each batch the dynamic batcher formed to ``infer`` here (over ZeroMQ and
shared memory), and ``@batch`` concatenates the requests. The session is set
up like the bundle backend's (:mod:`loadtest.engine.session`), with the same
``max_batch_size`` and dynamic batcher delay. Run::

    python -m loadtest.sweeps.peers.pytriton_server serve --model-file model.onnx --model dlrm_onnx \\
        --http-port 8200 --grpc-port 8201 --metrics-port 8202
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bundle.cli import new_app, run
from bundle.options import GrpcPort, HttpPort, MaxBatchSize, MaxQueueDelay, MetricsPort, Model, OrtThreads
from bundle.schema import INPUTS, OUTPUT, OUTPUTS
from loadtest.engine.session import ort_session
from loadtest.options import ModelFile

app = new_app("PyTriton binding an ONNX Runtime session (benchmark peer).")


def infer_function(session: Any) -> Any:
    """The ``@batch`` inference callable of ``session``: named ``B x ...`` inputs -> ``{output: B x 1}``."""
    from pytriton.decorators import batch

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return {OUTPUT: session.run([OUTPUT], inputs)[0]}

    return infer


@app.command()
def serve(
    model_file: ModelFile,
    model: Model[str] = "dlrm_onnx",
    http_port: HttpPort = 8200,
    grpc_port: GrpcPort = 8201,
    metrics_port: MetricsPort = 8202,
    max_batch_size: MaxBatchSize = 4096,
    max_queue_delay_us: MaxQueueDelay[int] = 100,
    threads: OrtThreads = 0,
) -> None:
    """Serve ``model_file`` through PyTriton on 127.0.0.1 until SIGINT or SIGTERM."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    session = ort_session(model_file, threads)
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=http_port,
        grpc_address="127.0.0.1",
        grpc_port=grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=metrics_port,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=model,
            infer_func=infer_function(session),
            inputs=[Tensor(name=spec.name, dtype=spec.dtype, shape=spec.shape) for spec in INPUTS],
            outputs=[Tensor(name=spec.name, dtype=spec.dtype, shape=spec.shape) for spec in OUTPUTS],
            config=ModelConfig(
                max_batch_size=max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=max_queue_delay_us),
            ),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    run(app)
