"""The open loop's gRPC client on a socket (loadtest.engine.grpc_socket) against a scripted HTTP/2
peer: the parts of HTTP/2 that Triton's server happened not to exercise in the integration test
(small flow-control windows, PING, padding, priority, CONTINUATION, GOAWAY, RST_STREAM,
trailers-only errors, bytes that are no HTTP/2), each ending in an answer or one ClientError line.
The header blocks the peer sends are encoded by hpack's own encoder, with its dynamic table and
Huffman strings; the request's block is read back by hpack's decoder."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import hpack
import pytest
from tritonclient.grpc import service_pb2

from bundle.errors import ClientError, ConfigError, DataError
from loadtest.engine import grpc_socket as h2
from loadtest.engine.grpc_socket import GrpcSockets, SocketGrpcInfer, frame, hpack_integer, request_headers
from loadtest.engine.wire import MODEL_INFER

ROWS = 4
REQUEST = b"a serialised request " * 300  # 6,300 bytes: several windows of 1,000


def _answer(rows: int = ROWS) -> bytes:
    message = service_pb2.ModelInferResponse(model_name="m")
    message.raw_output_contents.append(b"\0" * (4 * rows))
    body = message.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


class Conn:
    """The peer's end of one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.encoder = hpack.Encoder()
        self.buffer = b""
        self.window = h2.DEFAULT_WINDOW  # what the peer lets the client send on a new stream

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the client closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:count], self.buffer[count:]
        return out

    def start(self, settings: bytes = b"") -> None:
        assert self._read(len(h2.PREFACE)) == h2.PREFACE
        self.send(h2.SETTINGS, 0, 0, settings)

    def frame(self) -> tuple[int, int, int, bytes]:
        high, low, kind, flags, stream = struct.unpack(">HBBBI", self._read(9))
        return kind, flags, stream, self._read(high << 8 | low)

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.sock.sendall(frame(kind, flags, stream, payload))

    def headers(self, fields: list[tuple[str, str]]) -> bytes:
        return bytes(self.encoder.encode(fields, huffman=True))

    def request(self, grant: int = 0) -> tuple[int, dict[str, str], bytes, list[bytes]]:
        """One call: its stream, headers, message and the frames that were not DATA or HEADERS;
        with ``grant``, a WINDOW_UPDATE of that many bytes for the stream each time its window
        runs out, checking that no DATA frame overran it."""
        decoder, fields, body, others, window = hpack.Decoder(), {}, b"", [], self.window
        while True:
            kind, flags, stream, payload = self.frame()
            if kind == h2.HEADERS:
                fields = dict(decoder.decode(payload))
            elif kind == h2.DATA:
                assert len(payload) <= window, f"a DATA frame of {len(payload)} bytes in a window of {window}"
                body, window = body + payload, window - len(payload)
                if flags & h2.END_STREAM:
                    return stream, fields, body, others
                if window == 0 and grant:
                    self.send(h2.WINDOW_UPDATE, 0, stream, struct.pack(">I", grant))
                    window += grant
            else:
                others.append(frame(kind, flags, stream, payload))

    def trailers(self, stream: int, status: int = 0, message: str = "") -> None:
        fields = [("grpc-status", str(status))] + ([("grpc-message", message)] if message else [])
        self.send(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream, self.headers(fields))

    def ok_headers(self, stream: int) -> None:
        self.send(
            h2.HEADERS,
            h2.END_HEADERS,
            stream,
            self.headers([(":status", "200"), ("content-type", "application/grpc")]),
        )

    def answer(self, stream: int, body: bytes | None = None) -> None:
        self.ok_headers(stream)
        self.send(h2.DATA, 0, stream, _answer() if body is None else body)
        self.trailers(stream)


class Peer:
    """A local port whose connections each run ``script`` on a thread of their own."""

    def __init__(self, script: Callable[[Conn], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.script, self.connections, self.errors = script, 0, []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(sock,), daemon=True).start()

    def _run(self, sock: socket.socket) -> None:
        with sock:
            try:
                self.script(Conn(sock))
            except EOFError:
                pass
            except Exception as exc:  # the test fails on it below
                self.errors.append(exc)

    def close(self) -> None:
        self.listener.close()
        assert not self.errors, self.errors


@pytest.fixture
def peer() -> Iterator[Callable[[Callable[[Conn], None]], Peer]]:
    started: list[Peer] = []

    def start(script: Callable[[Conn], None]) -> Peer:
        started.append(Peer(script))
        return started[-1]

    yield start
    for each in started:
        each.close()


def test_hpack_integers_as_rfc_7541_writes_them() -> None:
    assert hpack_integer(10, 5) == b"\x0a"
    assert hpack_integer(1337, 5) == b"\x1f\x9a\x0a"
    assert hpack_integer(42, 8) == b"\x2a"
    assert hpack_integer(31, 4, 0x00) == b"\x0f\x10"


def test_the_request_header_block_decodes_to_a_grpc_call_and_leaves_no_table_entry() -> None:
    decoder = hpack.Decoder()
    block = request_headers("example:8001", timeout_s=2.5)
    for _ in range(2):  # the same block twice reads the same: it never used the dynamic table
        assert decoder.decode(block) == [
            (":method", "POST"), (":scheme", "http"), (":path", MODEL_INFER), (":authority", "example:8001"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "2500m"),
        ]  # fmt: skip
    assert len(decoder.header_table.dynamic_entries) == 0


def test_a_call_through_small_windows_with_ping_padding_priority_and_continuation(peer) -> None:
    seen: dict[str, object] = {}

    def script(conn: Conn) -> None:
        conn.start(struct.pack(">HI", h2.SETTINGS_INITIAL_WINDOW_SIZE, 1000))
        stream, fields, body, others = conn.request()  # sent before the client read the SETTINGS
        seen.update(fields=fields, body=body)
        conn.send(h2.PING, 0, 0, b"12345678")
        block = conn.headers(
            [(":status", "200"), ("content-type", "application/grpc"), ("x-long", "v" * 300)]
        )
        padded = bytes([3]) + struct.pack(">IB", 0, 15) + block[:100] + b"\0\0\0"  # pad 3, priority
        conn.send(h2.HEADERS, h2.PADDED | h2.PRIORITY_FLAG, stream, padded)
        conn.send(h2.CONTINUATION, h2.END_HEADERS, stream, block[100:])
        answer = _answer()
        conn.send(h2.DATA, h2.PADDED, stream, bytes([2]) + answer[:7] + b"\0\0")
        conn.send(h2.DATA, 0, stream, answer[7:])
        conn.trailers(stream)
        kind, flags, _, payload = conn.frame()
        while kind != h2.PING:
            others.append(frame(kind, flags, 0, payload))
            kind, flags, _, payload = conn.frame()
        seen.update(ping=(flags, payload), others=others)
        conn.window = 1000  # the second call's stream starts with the window of the SETTINGS
        stream, _, body, _ = conn.request(grant=1000)
        seen["second"] = (stream, body)
        conn.answer(stream)
        conn.frame()  # until the client closes

    server = peer(script)
    client = SocketGrpcInfer(server.url, timeout_s=10)
    message = struct.pack(">BI", 0, len(REQUEST)) + REQUEST
    assert client(REQUEST, ROWS) == len(_answer()) - 5
    assert client(REQUEST, ROWS) == len(_answer()) - 5
    client.close()
    server.thread.join(0.5)
    assert seen["body"] == message and seen["second"] == (3, message)
    assert seen["fields"][":path"] == MODEL_INFER and seen["fields"]["te"] == "trailers"
    assert seen["ping"] == (h2.ACK, b"12345678")
    assert frame(h2.SETTINGS, h2.ACK, 0) in seen["others"]  # the peer's SETTINGS acknowledged
    assert server.connections == 1


@pytest.mark.parametrize(
    ("reply", "raises", "match"),
    [
        ("trailers-only", ClientError, r"NOT_FOUND no such model$"),
        ("reset", ClientError, r"reset the call's stream \(CANCEL\)"),
        ("goaway", ClientError, r"GOAWAY ENHANCE_YOUR_CALM too many pings \(before this call\)"),
        ("close", ClientError, r"the server closed the connection|Connection reset by peer"),
        ("silence", ClientError, r"no answer within 0.5 s|timed out"),
        ("http-503", ClientError, r"HTTP 503 \(text/plain\)"),
        ("no-status", ClientError, r"ended the call without a gRPC status"),
        ("wrong-size", DataError, rf"expected {ROWS * 4} \({ROWS} scores\)"),
        ("compressed", DataError, r"not one uncompressed gRPC message"),
        ("huge-frame", ClientError, r"a frame of 16777215 bytes, more than the 16384"),
    ],
)
def test_each_failed_call_is_one_line_and_the_next_one_is_answered(peer, reply, raises, match) -> None:
    misbehaved = threading.Event()
    cancelled: list[int] = []

    def script(conn: Conn) -> None:
        conn.start()
        while True:
            stream, *_ = conn.request()
            if misbehaved.is_set():
                conn.answer(stream)
                continue
            misbehaved.set()
            if reply == "close":
                return
            if reply == "silence":  # the client gives up on the call and resets its stream
                kind, _, on, payload = conn.frame()
                while (kind, on) != (h2.RST_STREAM, stream):
                    kind, _, on, payload = conn.frame()
                cancelled.append(struct.unpack(">I", payload)[0])
            if reply == "trailers-only":
                fields = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "5"),
                          ("grpc-message", "no%20such model")]  # fmt: skip
                conn.send(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream, conn.headers(fields))
            elif reply == "reset":
                conn.send(h2.RST_STREAM, 0, stream, struct.pack(">I", 8))
            elif reply == "goaway":
                conn.send(h2.GOAWAY, 0, 0, struct.pack(">II", 0, 11) + b"too many pings")
            elif reply == "http-503":
                conn.send(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream,
                          conn.headers([(":status", "503"), ("content-type", "text/plain")]))  # fmt: skip
            elif reply == "no-status":
                conn.ok_headers(stream)
                conn.send(h2.DATA, h2.END_STREAM, stream, _answer())
            elif reply == "wrong-size":
                conn.answer(stream, _answer(ROWS + 1))
            elif reply == "compressed":
                conn.answer(stream, b"\x01" + _answer()[1:])
            elif reply == "huge-frame":
                conn.sock.sendall(b"\xff\xff\xff\x00\x00\x00\x00\x00\x01")

    server = peer(script)
    client = SocketGrpcInfer(server.url, timeout_s=0.5)
    with pytest.raises(raises, match=match) as error:
        client(REQUEST, ROWS)
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(server.url) or reply == "wrong-size"  # as grpcio's client says it
    client._timeout_s = 10
    assert client(REQUEST, ROWS) == len(_answer()) - 5
    client.close()
    if reply == "silence":  # the stream was reset (CANCEL), the connection kept
        assert cancelled == [8] and server.connections == 1


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_from_the_server_fail_the_call_in_one_line(peer, seed: int) -> None:
    noise = random.Random(seed).randbytes(2000)

    def script(conn: Conn) -> None:
        conn.start()
        conn.request()
        conn.sock.sendall(noise)

    server = peer(script)
    client = SocketGrpcInfer(server.url, timeout_s=2)
    with pytest.raises(ClientError) as error:
        client(REQUEST, ROWS)
    assert "\n" not in str(error.value)
    client.close()


def test_senders_sharing_a_connection_get_their_own_answers_in_any_order(peer) -> None:
    """Three senders on one connection: the peer takes all three calls, then answers them last
    first, frames interleaved; each sender gets its own answer (its rows), on one connection."""

    def script(conn: Conn) -> None:
        conn.start()
        streams = [conn.request()[0] for _ in range(3)]
        for stream in reversed(streams):
            conn.ok_headers(stream)
        for rows, stream in zip((3, 2, 1), reversed(streams), strict=True):
            conn.send(h2.DATA, 0, stream, _answer(rows))
        for stream in streams:
            conn.trailers(stream)
        while True:
            conn.frame()

    server = peer(script)
    sockets = GrpcSockets(server.url, timeout_s=10, share=3)
    senders = [sockets.open() for _ in range(3)]
    results: dict[int, object] = {}
    barrier = threading.Barrier(3)

    def send(index: int) -> None:
        barrier.wait()
        time.sleep(0.05 * index)  # streams 1, 3, 5 in this order
        try:
            results[index] = senders[index](REQUEST, index + 1)
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {i: len(_answer(i + 1)) - 5 for i in range(3)}
    assert server.connections == 1
    for sender in senders:
        sender.close()
    assert sockets.open()._slot.connection is None  # the last sender closed it


def test_a_goaway_fails_the_calls_after_its_last_stream_and_lets_the_others_finish(peer) -> None:
    """The server says GOAWAY with the first of two calls as its last stream: the second fails
    at once, its sender's next call opens a new connection, and the first is still answered on
    the old one, which closes after it."""
    said, reopened = threading.Event(), threading.Event()

    def script(conn: Conn) -> None:
        conn.start()
        if said.is_set():  # a later connection answers every call
            reopened.set()
            while True:
                conn.answer(conn.request()[0])
        said.set()
        first, _ = conn.request()[0], conn.request()[0]
        conn.send(h2.GOAWAY, 0, 0, struct.pack(">II", first, 0))
        assert reopened.wait(5)  # the first call is still in flight when the next one goes out
        conn.answer(first)
        while True:
            conn.frame()

    server = peer(script)
    sockets = GrpcSockets(server.url, timeout_s=5, share=2)
    senders = [sockets.open(), sockets.open()]
    results: dict[int, list[object]] = {0: [], 1: []}

    def send(index: int) -> None:
        time.sleep(0.1 * index)
        for _ in range(index + 1):  # the second sender calls again after its call failed
            try:
                results[index].append(senders[index](REQUEST, ROWS))
            except ClientError as exc:
                results[index].append(str(exc))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results[0] == [len(_answer()) - 5]
    assert "GOAWAY NO_ERROR (before this call)" in str(results[1][0])
    assert results[1][1] == len(_answer()) - 5
    assert server.connections == 2
    for sender in senders:
        sender.close()


def test_senders_per_connection_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError, match="senders per gRPC connection"):
        GrpcSockets("127.0.0.1:1", timeout_s=1, share=0)
