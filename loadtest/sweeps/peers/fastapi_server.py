"""A minimal FastAPI + ONNX Runtime server: the peer a team might write instead of Triton.

One uvicorn worker, one ONNX Runtime session set up like the Triton backend's
(:mod:`loadtest.engine.session`), the binary wire format of :mod:`loadtest.sweeps.peers.wire`.
Each request runs on its own (no batching across requests); ONNX Runtime
runs in uvicorn's thread pool so that the event loop keeps reading requests
while one computes. Run::

    python -m loadtest.sweeps.peers.fastapi_server serve --model-file model.onnx --model dlrm_onnx --port 8100
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from fastapi import FastAPI, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from bundle.cli import new_app, run
from bundle.errors import DataError
from bundle.options import Model, OrtThreads
from bundle.schema import OUTPUT
from loadtest.engine.session import ort_session
from loadtest.options import ModelFile
from loadtest.sweeps.peers import wire

app = new_app("A minimal FastAPI + ONNX Runtime inference server (benchmark peer).")


def build_app(session: Any, model: str) -> FastAPI:
    """The FastAPI application serving ``session`` as ``model``."""
    # FastAPI reads the handlers' annotations (``Request``) from this module's globals.
    api = FastAPI(title=f"{model} (ONNX Runtime)", docs_url=None, redoc_url=None, openapi_url=None)

    @api.get(wire.READY_PATH)
    async def ready() -> dict[str, str]:
        return {"model": model, "state": "READY"}

    @api.post(wire.infer_path(model))
    async def infer(request: Request) -> Response:
        try:
            batch = int(request.headers.get(wire.BATCH_HEADER, "0"))
            inputs = wire.decode_inputs(await request.body(), batch)
        except (ValueError, DataError) as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        outputs = await run_in_threadpool(session.run, [OUTPUT], inputs)
        return Response(content=outputs[0].astype("<f4", copy=False).tobytes(), media_type=wire.CONTENT_TYPE)

    return api


@app.command()
def serve(
    model_file: ModelFile,
    model: Model[str] = "dlrm_onnx",
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8100,
    threads: OrtThreads = 0,
) -> None:
    """Serve ``model_file`` on 127.0.0.1:PORT until SIGINT or SIGTERM."""
    import uvicorn

    api = build_app(ort_session(model_file, threads), model)
    uvicorn.run(api, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    run(app)
