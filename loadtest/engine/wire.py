"""The least work per request: inference requests serialised once, sent as bytes.

A load generator that builds ``InferInput`` objects, copies tensors and
checks metadata on every request measures its own Python, not the server. Here
each batch of a payload pool becomes one serialised request before the load
starts: a gRPC ``ModelInferRequest``, or an HTTP body in Triton's binary-data
extension (JSON header, then the raw tensors). A request is then one call
with those bytes, and the answer is checked by one length (``B`` FP32
scores), so a wrong or empty answer still fails the request. The server sees
the bytes tritonclient would send. Both protocols go out on plain sockets: HTTP/1.1 here
(:class:`RawHttpInfer`), gRPC as HTTP/2 frames
(:class:`~loadtest.engine.grpc_socket.SocketGrpcInfer`); every load engine of the bundle sends
through them (the closed-loop driver, locust's users, the open loop). Each sender also measures
its serial client time (:class:`Turnaround`).
"""

from __future__ import annotations

import _socket
import json
import math
import time

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from bundle.errors import ClientError, DataError
from bundle.schema import OUTPUT, VALUES_INPUT
from clients.validation import triton_dtype
from loadtest.engine.payload import PayloadPool, RequestForm, request_form

#: Triton's gRPC inference method.
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
#: Bytes an HTTP answer is read by, at most, per call.
_RECEIVE_BYTES = 1 << 16
#: Bytes per score of the output (FP32).
_SCORE_BYTES = 4


def tensor_bytes(array: np.ndarray) -> bytes:
    """A tensor's contents as Triton takes them raw: the array's bytes, or for BYTES (an object
    array of ``bytes``) each element's 4-byte little-endian length, then the element."""
    if array.dtype == np.object_:
        return bytes(serialize_byte_tensor(array).item())
    return np.ascontiguousarray(array).tobytes()


def serialised_request(model: str, batch: dict[str, np.ndarray], version: str = "") -> bytes:
    """One batch as a serialised ``ModelInferRequest`` for ``model`` (tensors raw)."""
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in batch.items():
        tensor = message.inputs.add()
        tensor.name, tensor.datatype = name, triton_dtype(array.dtype)
        tensor.shape.extend(array.shape)
        message.raw_input_contents.append(tensor_bytes(array))
    message.outputs.add().name = OUTPUT
    return bytes(message.SerializeToString())


def serialised_requests(model: str, pool: PayloadPool, version: str = "") -> list[bytes]:
    """Every batch of ``pool`` as a serialised ``ModelInferRequest`` for ``model`` (its rows' text
    for a raw-row model, one user's request for a ranking model: :func:`request_form`)."""
    return [serialised_request(model, batch, version) for batch in pool.batches(request_form(model))]


def check_scores(output_bytes: list[int], rows: int) -> None:
    """One output of ``rows`` FP32 scores, or :class:`DataError`."""
    if output_bytes != [rows * _SCORE_BYTES]:
        raise DataError(
            f"answer holds {output_bytes} output bytes, expected {rows * _SCORE_BYTES} ({rows} scores)"
        )


def check_answer(answer: bytes, rows: int, url: str) -> None:
    """A serialised ``ModelInferResponse`` from ``url`` holding one output of ``rows`` FP32 scores,
    or :class:`DataError`."""
    try:
        response = service_pb2.ModelInferResponse.FromString(answer)
    except Exception as exc:  # protobuf's DecodeError, or what its C implementation raises
        raise DataError(f"{url}: the answer is no ModelInferResponse ({exc})") from None
    check_scores([len(c) for c in response.raw_output_contents], rows)


def answer_scores(answer: bytes) -> np.ndarray:
    """The scores of a serialised ``ModelInferResponse`` (its one output, FP32)."""
    response = service_pb2.ModelInferResponse.FromString(answer)
    return np.frombuffer(response.raw_output_contents[0], dtype="<f4")


def socket_address(url: str) -> tuple[str, int]:
    """``host:port`` as a socket address: no host is 127.0.0.1, an IPv6 host loses its brackets.

    Raises:
        ClientError: ``url`` names no port.
    """
    host, _, port = url.rpartition(":")
    if not port.isdigit():
        raise ClientError(f"{url}: expected host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def connected_socket(address: tuple[str, int], timeout_s: float) -> _socket.socket:
    """A TCP connection to ``address`` on the C socket (which gevent never patches), each
    operation bounded by ``timeout_s``, Nagle's delay off; closed again when it fails.

    Raises:
        OSError: the address does not resolve, or the connection fails.
    """
    family, kind, protocol, _, where = _socket.getaddrinfo(*address, 0, _socket.SOCK_STREAM)[0]
    sock = _socket.socket(family, kind, protocol)
    try:
        sock.settimeout(timeout_s)
        sock.connect(where)
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    except OSError:
        sock.close()
        raise
    return sock


def send_whole(sock: _socket.socket, parts: list[bytes]) -> None:
    """Write ``parts`` in one ``sendmsg``, and whatever of them it left (on a socket with a
    timeout, ``sendmsg`` may write part of them) after it.

    Raises:
        OSError: the connection failed.
    """
    sent = sock.sendmsg(parts)
    if sent < sum(map(len, parts)):
        sock.sendall(b"".join(parts)[sent:])


class Turnaround:
    """A sender's serial client time: from its last answer's arrival (its last byte read) to its
    next request going out (its first ``sendmsg``). In a closed loop that time is spent on the
    client alone, every request, at any concurrency: the answer's check, the engine's
    bookkeeping, the next request's bytes (:data:`~loadtest.engine.client_cpu.SERIAL_SHARE`).

    Attributes:
        serial_s: that time before the request last sent (NaN: no answer before it on this
            sender, or the one before it failed).
    """

    def __init__(self) -> None:
        self.serial_s = math.nan
        self._arrived = math.nan

    def sending(self, at: float) -> None:
        """A request goes out at ``at`` (``time.perf_counter()``)."""
        self.serial_s = at - self._arrived

    def arrived(self, at: float) -> None:
        """Its answer arrived whole at ``at`` and passed its checks."""
        self._arrived = at

    def failed(self) -> None:
        """Its request failed: the next one has no answer before it to count from."""
        self._arrived = math.nan


#: The HTTP header that says how long the JSON part of a binary-data body is.
HEADER_LENGTH = "Inference-Header-Content-Length"


def _http_header(tensors: list[tuple[str, list[int], str, int]]) -> bytes:
    """The JSON header of an HTTP body of ``(name, shape, datatype, bytes)`` tensors."""
    header = {
        "inputs": [
            {"name": name, "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}
            for name, shape, datatype, size in tensors
        ],
        "outputs": [{"name": OUTPUT, "parameters": {"binary_data": True}}],
    }
    return json.dumps(header, separators=(",", ":")).encode()


def _http_parts(batch: dict[str, np.ndarray]) -> tuple[bytes, list[bytes]]:
    """An HTTP body's JSON header and its tensors' bytes."""
    contents = [tensor_bytes(array) for array in batch.values()]
    tensors = [
        (name, list(array.shape), triton_dtype(array.dtype), len(content))
        for (name, array), content in zip(batch.items(), contents, strict=True)
    ]
    return _http_header(tensors), contents


def http_body(batch: dict[str, np.ndarray], header_length: int | None = None) -> bytes:
    """One batch as the body of an HTTP inference request (binary-data extension); with
    ``header_length``, its JSON header padded with spaces to that length, so that the bodies
    of a pool whose tensors' sizes vary (rows as text) share one header length."""
    header, contents = _http_parts(batch)
    if header_length is not None:
        if len(header) > header_length:
            raise DataError(f"an HTTP request header of {len(header)} bytes exceeds {header_length}")
        header = header.ljust(header_length)
    return header + b"".join(contents)


def http_bodies(pool: PayloadPool, form: RequestForm = "rows") -> list[bytes]:
    """Every batch of ``pool`` as an HTTP body in a model's ``form`` (:meth:`PayloadPool.batch`),
    its JSON header's length the same for every batch (:func:`http_header_length`)."""
    length = http_header_length(pool, form)
    return [http_body(batch, length) for batch in pool.batches(form)]


def http_header_length(pool: PayloadPool, form: RequestForm = "rows") -> int:
    """The length of the JSON header of :func:`http_body` for ``pool``'s batches in ``form``: one
    shape for tensors (a ranking request's too: every user of a pool has ``B`` candidates); the
    longest for rows as text, whose sizes vary; for bags of any size, the header of a request
    holding every id of the pool (any ``B`` rows of it, from any row, hold no more)."""
    if form == "text":
        return max(len(_http_parts(batch)[0]) for batch in pool.batches(form))
    batch = pool.batch(0, form)
    if not pool.variable_bags:
        return len(_http_parts(batch)[0])
    most = pool.categorical
    return len(
        _http_header(
            [
                (name, list(most.shape if name == VALUES_INPUT else array.shape), triton_dtype(array.dtype),
                 most.nbytes if name == VALUES_INPUT else array.nbytes)
                for name, array in batch.items()
            ]
        )
    )  # fmt: skip


#: Batches a request's mean size on the wire is taken over, at most.
_SIZED_BATCHES = 16


def request_bytes(pool: PayloadPool, model: str, protocol: str) -> float:
    """The mean size of ``model``'s requests of ``pool`` as the socket senders send them: the
    serialised ``ModelInferRequest`` (gRPC), or the HTTP body (its JSON header and binary
    tensors), over the pool's first batches."""
    form = request_form(model)
    count = min(len(pool), _SIZED_BATCHES)
    if protocol == "grpc":
        sizes = [len(serialised_request(model, pool.batch(index, form))) for index in range(count)]
    else:
        length = http_header_length(pool, form)
        sizes = [len(http_body(pool.batch(index, form), length)) for index in range(count)]
    return sum(sizes) / len(sizes)


class RawHttpInfer(Turnaround):
    """One keep-alive HTTP/1.1 connection to Triton's HTTP endpoint, bodies in, the answer's
    length out, on a plain blocking socket.

    The request's head is built once per body length, head and body go out in one
    ``sendmsg``, and the answer is read by its ``Content-Length``: at batch 1 a request costs
    the client a fraction of the CPU that geventhttpclient on gevent's loop takes (the load
    generators' CPU per request is measured in benchmarks/load_engines/dlrm/report.md). The socket
    is the C one (``_socket``), which gevent never patches: call this from a native thread,
    never from gevent's loop, where it would block every greenlet. A connection that failed
    or that the server closes is opened again by the next request.

    Args:
        url: ``host:port``.
        model: the model every request goes to.
        header_length: the JSON header length of every body (:func:`http_header_length`).
        timeout_s: a request slower than this fails.
    """

    def __init__(self, url: str, model: str, header_length: int, timeout_s: float) -> None:
        super().__init__()
        self.url = url
        self._address = socket_address(url)
        self._timeout_s = timeout_s
        self._prefix = (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {url}\r\n"
            f"{HEADER_LENGTH}: {header_length}\r\nContent-Type: application/octet-stream\r\n"
            "Content-Length: "
        ).encode()
        self._heads: dict[int, bytes] = {}
        self._socket: _socket.socket | None = None
        self._buffer = bytearray()
        #: When the last answer's last byte was read (``time.perf_counter()``).
        self._read_at = math.nan
        #: The last answer that passed its checks, and the length of its JSON header.
        self._last: tuple[bytes, int] = (b"", 0)

    def _connect(self) -> _socket.socket:
        try:
            sock = connected_socket(self._address, self._timeout_s)
        except OSError as exc:
            raise ClientError(f"{self.url}: {exc}") from None
        self._buffer.clear()
        self._socket = sock
        return sock

    def __call__(self, body: bytes, rows: int) -> int:
        """Send one body of ``rows`` rows; the answer's size in bytes.

        Raises:
            ClientError: no answer, or an error status (with the server's message).
            DataError: the answer does not hold ``rows`` scores.
        """
        sock = self._socket or self._connect()
        head = self._heads.get(len(body))
        if head is None:
            head = self._heads[len(body)] = self._prefix + b"%d\r\n\r\n" % len(body)
        self.sending(time.perf_counter())
        try:
            send_whole(sock, [head, body])
            status, headers, answer = self._read_answer(sock)
        except (OSError, ValueError) as exc:
            self.close()
            self.failed()
            raise ClientError(f"{self.url}: {exc or type(exc).__name__}") from None
        if headers.get("connection", "").lower() == "close":
            self.close()
        self.failed()  # until the answer has passed its checks
        if status != 200:
            raise ClientError(f"{self.url}: HTTP {status} {answer[:200].decode(errors='replace')}")
        json_length = int(headers.get(HEADER_LENGTH.lower(), len(answer)))
        check_scores([len(answer) - json_length], rows)
        self.arrived(self._read_at)
        self._last = (answer, json_length)
        return len(answer)

    def last_scores(self) -> np.ndarray:
        """The scores of the last answer that passed its checks (FP32, one per row)."""
        answer, json_length = self._last
        return np.frombuffer(answer, dtype="<f4", offset=json_length)

    def _read_answer(self, sock: _socket.socket) -> tuple[int, dict[str, str], bytes]:
        """One answer: its status, its headers (names lower-case) and its body.

        Raises:
            OSError: the connection closed or timed out first.
            ValueError: the answer is not an HTTP/1.1 answer this client reads.
        """
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        while end < 0:
            self._receive(sock)
            end = buffer.find(b"\r\n\r\n")
        lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        first = lines[0].split(" ", 2)
        if len(first) < 2 or not first[0].startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.1 answer: {lines[0][:60]!r}")
        status = int(first[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise ValueError(
                f"an answer without Content-Length ({headers.get('transfer-encoding', 'no length')})"
            )
        stop = end + 4 + int(headers["content-length"])
        while len(buffer) < stop:
            self._receive(sock)
        self._read_at = time.perf_counter()
        answer = bytes(buffer[end + 4 : stop])
        del buffer[:stop]
        return status, headers, answer

    def _receive(self, sock: _socket.socket) -> None:
        chunk = sock.recv(_RECEIVE_BYTES)
        if not chunk:
            raise OSError("the server closed the connection")
        self._buffer += chunk

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
