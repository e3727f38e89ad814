"""tritonclient wrappers (HTTP and gRPC, sync and asyncio, shared memory) and a CLI.

Modules, one concern each:

- :mod:`clients.options`     ClientOptions: endpoint, protocol, timeout, shared memory, retries.
- :mod:`clients.connection`  Connection: what both clients share (options, tritonclient client).
- :mod:`clients.triton`      TritonClient: the sync client (``infer(model, inputs) -> B x 1``).
- :mod:`clients.aio`         AsyncTritonClient: the asyncio client, requests in flight in order.
- :mod:`clients.validation`  ModelSpec: checks a request against the model's metadata and config.
- :mod:`clients.shm`         system shared-memory regions (CUDA: a clear error, no GPU here).
- :mod:`clients.request`     building a request and reading its answer, for either protocol.
- :mod:`clients.protocol`    what differs between tritonclient's HTTP and gRPC clients.
- :mod:`clients.retry`       RetryPolicy: exponential backoff, on UNAVAILABLE only.
- :mod:`clients.failures`    tritonclient and transport errors as one-line ClientErrors.
- :mod:`clients.stats`       the server's inference statistics, parsed.
- :mod:`clients.batching`    a TSV file as request batches; async answers back in order.
- :mod:`clients.predict`     a whole file through the server, written as CSV in input order.
- :mod:`clients.evaluate`    AUC and logloss of served predictions, per model and reference.
- :mod:`clients.reference`   ONNX Runtime in-process, the reference for served predictions.
- :mod:`clients.verify`      served vs in-process for every model of a repository (demo).

The client-side cost per request is measured by ``python -m lab client-cost``
(:mod:`lab.client_cost`): it starts a server, and clients know nothing of the server.

``python -m clients --help`` lists the commands. Nothing here imports
TensorFlow or PyTorch; tritonclient's protocol modules load on first use.
"""
