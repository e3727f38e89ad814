"""Triton's gRPC inference call on a plain socket: the HTTP/2 frames written and read here.

A call through grpcio's Python API costs the client time of its own (its completion queue,
the interpreter lock taken back and forth, its objects), and the open loop, which times each
request from its send, counts that time in every latency it reports: over gRPC its p50 and p99
sat above perf_analyzer's at the same rate, while over HTTP, sent on a plain socket
(:class:`~loadtest.engine.wire.RawHttpInfer`), they agreed (benchmarks/open_loop). Here a gRPC
call is sent the same way: one HTTP/2 connection per sender, one call on it at a time, on a
blocking socket of the sender's thread. A request is one ``sendmsg`` of frames built with a few
byte operations (its header block is encoded once per connection, without the dynamic table,
so it never changes), and the answer's frames are read until its stream ends.

What HTTP/2 (RFC 9113) asks of a client is done:
- the connection preface and SETTINGS, the server's acknowledged;
- PING answered;
- flow control both ways: the server's windows and its largest frame respected when sending
  (a request larger than its window waits for WINDOW_UPDATE), and the client's own receive
  windows opened wide at the start and topped up as answers arrive;
- GOAWAY and RST_STREAM end the call with the server's reason; the next request opens a new
  connection, as it does after any failure.

Header blocks are decoded with ``hpack`` (RFC 7541: the connection's dynamic table, Huffman
strings), every block of the connection in order; a block of indexed fields only, the form
gRPC servers send once their headers are in the table, is decoded once and then looked up.
The answer's gRPC status comes from its trailers (or a trailers-only answer) and fails the call
as grpcio does, with the status's name and the server's message.
"""

from __future__ import annotations

import _socket
import struct
import time
import urllib.parse

import grpc
import hpack
from tritonclient.grpc import service_pb2

from bundle.errors import ClientError, DataError
from loadtest.engine.wire import MODEL_INFER, check_scores

#: The client connection preface (RFC 9113 section 3.4).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Frame types (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
#: Frame flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
#: SETTINGS parameters.
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 2, 4, 5
#: The flow-control window before SETTINGS or WINDOW_UPDATE say otherwise, and the largest one.
DEFAULT_WINDOW, MAX_WINDOW = 65_535, 2**31 - 1
#: The largest frame payload before the server's SETTINGS say otherwise.
DEFAULT_MAX_FRAME = 16_384
#: HTTP/2 error codes by number (RFC 9113 section 7), for the messages.
ERROR_CODES = (
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
    "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
    "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
)  # fmt: skip
#: gRPC status codes by number, named as grpcio names them.
GRPC_STATUS = {code.value[0]: code.name for code in grpc.StatusCode}
#: A frame's 9-byte header: length (24 bits, as 16 + 8), type, flags, stream.
_FRAME = struct.Struct(">HBBBI")
#: The 5-byte prefix of a gRPC message: compressed flag, length.
_MESSAGE = struct.Struct(">BI")
#: The client's receive windows are topped up once this much of them is used.
_TOP_UP = 2**30
#: Bytes read from the socket at most per call.
_RECEIVE_BYTES = 1 << 16
#: Decoded header blocks kept per connection (blocks of indexed fields only).
_CACHED_BLOCKS = 64


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: its 9-byte header, then ``payload``."""
    return _FRAME.pack(len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream) + payload


def hpack_integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """``value`` as an HPACK integer (RFC 7541 section 5.1) in a ``prefix_bits``-bit prefix, the
    first byte's other bits ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = bytearray([first | limit]), value - limit
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    """An HPACK string literal, not Huffman-coded."""
    raw = text.encode("latin-1")
    return hpack_integer(len(raw), 7) + raw


def request_headers(authority: str, path: str = MODEL_INFER, timeout_s: float | None = None) -> bytes:
    """The header block of a gRPC call to ``path`` (RFC 7541), the same for every call: fields
    from the static table by index, the others as literals that the server's table never
    takes in, so the block never depends on what came before."""
    block = bytearray(b"\x83\x86")  # :method POST, :scheme http (static table 3 and 6)
    block += hpack_integer(4, 4) + _string(path)  # :path (static 4), literal, not indexed
    block += hpack_integer(1, 4) + _string(authority)  # :authority (static 1)
    block += hpack_integer(31, 4) + _string("application/grpc")  # content-type (static 31)
    block += b"\x00" + _string("te") + _string("trailers")
    if timeout_s is not None:
        block += (
            b"\x00" + _string("grpc-timeout") + _string(f"{max(1, min(round(timeout_s * 1e3), 99_999_999))}m")
        )
    return bytes(block)


class _Call:
    """What the answer to one call has brought so far."""

    __slots__ = ("body", "ended", "headers", "received", "trailers", "window")

    def __init__(self, window: int) -> None:
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.body = bytearray()
        self.ended = False
        #: The server's send window for this stream, as far as the client can tell.
        self.window = window
        #: DATA bytes received on this stream since its receive window was last topped up.
        self.received = 0


class SocketGrpcInfer:
    """One HTTP/2 connection to Triton's gRPC endpoint, one inference call at a time, serialised
    ``ModelInferRequest`` bytes in, the answer's length out (the module's docstring says how).

    The socket is the C one (``_socket``), which gevent never patches: call this from a native
    thread. A connection that failed, that the server closed or said GOAWAY on is opened again
    by the next request.

    Args:
        url: ``host:port``.
        timeout_s: a request slower than this fails (and the server is told the deadline).
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        host, _, port = url.rpartition(":")
        if not port.isdigit():
            raise ClientError(f"{url}: expected host:port")
        self.url = url
        self._address = (host.strip("[]") or "127.0.0.1", int(port))
        self._timeout_s = timeout_s
        self._block = request_headers(url, timeout_s=timeout_s)
        self._socket: _socket.socket | None = None
        self._buffer = bytearray()

    # -- the connection ---------------------------------------------------------------------

    def _connect(self) -> _socket.socket:
        try:
            family, kind, protocol, _, address = _socket.getaddrinfo(*self._address, 0, _socket.SOCK_STREAM)[
                0
            ]
            sock = _socket.socket(family, kind, protocol)
            sock.settimeout(self._timeout_s)
            sock.connect(address)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
            sock.sendall(
                PREFACE
                + frame(SETTINGS, 0, 0, settings)
                + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))
            )
        except OSError as exc:
            raise ClientError(f"{self.url}: {exc}") from None
        self._buffer.clear()
        self._decoder = hpack.Decoder()
        self._blocks: dict[bytes, dict[str, str]] = {}
        self._next_stream = 1
        self._send_window = DEFAULT_WINDOW
        self._initial_window = DEFAULT_WINDOW
        self._max_frame = DEFAULT_MAX_FRAME
        self._received = 0
        self._going_away: str | None = None
        self._socket = sock
        return sock

    def close(self) -> None:
        """Close the connection (the next request opens another)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    # -- one call ---------------------------------------------------------------------------

    def __call__(self, request: bytes, rows: int) -> int:
        """Send one serialised request of ``rows`` rows; the answer's size in bytes.

        Raises:
            ClientError: no answer (the connection failed, the stream was reset), an HTTP status
                other than 200, or a gRPC status other than OK (its name and the server's message).
            DataError: the answer does not hold ``rows`` scores.
        """
        sock = self._socket or self._connect()
        stream = self._next_stream
        if stream > MAX_WINDOW - 2:  # the stream ids of this connection are used up
            self.close()
            sock, stream = self._connect(), 1
        self._next_stream = stream + 2
        call = _Call(self._initial_window)
        deadline = time.monotonic() + self._timeout_s
        try:
            self._send(sock, stream, call, _MESSAGE.pack(0, len(request)) + request, deadline)
            while not call.ended:
                self._read_frame(sock, stream, call, deadline)
        except (OSError, ValueError, IndexError, struct.error, hpack.HPACKError) as exc:
            self.close()
            raise ClientError(f"{self.url}: {exc or type(exc).__name__}") from None
        if self._going_away is not None:
            self.close()
        return self._answer(call, rows)

    def _send(self, sock: _socket.socket, stream: int, call: _Call, message: bytes, deadline: float) -> None:
        """The call's HEADERS, then its message in DATA frames as the server's windows allow."""
        frames = [frame(HEADERS, END_HEADERS, stream, self._block)]
        sent = 0
        while True:
            room = min(self._send_window, call.window)
            while room > 0 and sent < len(message):
                size = min(room, self._max_frame, len(message) - sent)
                last = sent + size == len(message)
                frames.append(frame(DATA, END_STREAM if last else 0, stream, message[sent : sent + size]))
                sent, room = sent + size, room - size
                self._send_window -= size
                call.window -= size
            if frames:
                sock.sendmsg(frames)
                frames = []
            if sent == len(message) or call.ended:
                return
            self._read_frame(sock, stream, call, deadline)  # until a WINDOW_UPDATE makes room

    def _answer(self, call: _Call, rows: int) -> int:
        """The call's answer checked: HTTP 200, gRPC OK, one message of ``rows`` scores."""
        headers = call.headers or {}
        status = headers.get(":status")
        if status != "200":
            raise ClientError(
                f"{self.url}: HTTP {status or 'status missing'} ({headers.get('content-type', '')})"
            )
        trailers = call.trailers if call.trailers is not None else {}
        code = trailers.get("grpc-status")
        if code is None:
            raise ClientError(f"{self.url}: the server ended the call without a gRPC status")
        if code != "0":
            name = GRPC_STATUS.get(int(code), code) if code.isdigit() else code
            raise ClientError(f"{self.url}: {name} {urllib.parse.unquote(trailers.get('grpc-message', ''))}")
        body = call.body
        if len(body) < _MESSAGE.size:
            raise DataError(f"{self.url}: an answer of {len(body)} bytes holds no gRPC message")
        compressed, length = _MESSAGE.unpack_from(body)
        if compressed or len(body) != _MESSAGE.size + length:
            raise DataError(
                f"{self.url}: the answer is not one uncompressed gRPC message "
                f"(flag {compressed}, {length} bytes said, {len(body) - _MESSAGE.size} read)"
            )
        response = service_pb2.ModelInferResponse.FromString(bytes(body[_MESSAGE.size :]))
        check_scores([len(c) for c in response.raw_output_contents], rows)
        return length

    # -- frames in ------------------------------------------------------------------------

    def _receive(self, sock: _socket.socket, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {self._timeout_s:g} s")
        sock.settimeout(left)
        chunk = sock.recv(_RECEIVE_BYTES)
        if not chunk:
            raise OSError(self._going_away or "the server closed the connection")
        self._buffer += chunk

    def _next_frame(self, sock: _socket.socket, deadline: float) -> tuple[int, int, int, bytes]:
        """The next frame off the connection: type, flags, stream, payload."""
        buffer = self._buffer
        while len(buffer) < _FRAME.size:
            self._receive(sock, deadline)
        high, low, kind, flags, stream = _FRAME.unpack_from(buffer)
        length = high << 8 | low
        if length > DEFAULT_MAX_FRAME:  # the client never allows more (its SETTINGS keep the default)
            raise ValueError(
                f"a frame of {length} bytes, more than the {DEFAULT_MAX_FRAME} the client allows"
            )
        end = _FRAME.size + length
        while len(buffer) < end:
            self._receive(sock, deadline)
        payload = bytes(buffer[_FRAME.size : end])
        del buffer[:end]
        return kind, flags, stream & MAX_WINDOW, payload

    def _read_frame(self, sock: _socket.socket, stream: int, call: _Call, deadline: float) -> None:
        """Read one frame (with its CONTINUATIONs) and do what it asks: for ``stream``, add it to
        ``call``; for the connection, answer or apply it."""
        kind, flags, on, payload = self._next_frame(sock, deadline)
        if kind == DATA:
            self._received += len(payload)
            if self._received >= _TOP_UP:
                sock.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
                self._received = 0
            if on == stream:
                call.received += len(payload)
                if call.received >= _TOP_UP and not flags & END_STREAM:
                    sock.sendall(frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", call.received)))
                    call.received = 0
                call.body += _unpadded(payload, flags)
                call.ended = bool(flags & END_STREAM)
        elif kind == HEADERS:
            block = _header_block(payload, flags)
            while not flags & END_HEADERS:
                kind, flags, _, payload = self._next_frame(sock, deadline)
                if kind != CONTINUATION:
                    raise ValueError(f"a header block broken off by a frame of type {kind}")
                block += payload
            headers = self._decode(block)  # every block, in order: the table depends on them all
            if on == stream:
                if call.headers is None:
                    call.headers = headers
                    if flags & END_STREAM:  # trailers-only: the status is among the headers
                        call.trailers = headers
                else:
                    call.trailers = headers
                call.ended = call.ended or bool(flags & END_STREAM)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._apply_settings(payload, call)
                sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if not flags & ACK:
                sock.sendall(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            (increment,) = struct.unpack(">I", payload[:4])
            if on == 0:
                self._send_window += increment & MAX_WINDOW
            elif on == stream:
                call.window += increment & MAX_WINDOW
        elif kind == RST_STREAM and on == stream:
            (code,) = struct.unpack(">I", payload[:4])
            raise ValueError(f"the server reset the call's stream ({_error_name(code)})")
        elif kind == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            reason = payload[8:].decode("utf-8", "replace")
            self._going_away = (
                f"the server is closing the connection: GOAWAY {_error_name(code)} {reason}".strip()
            )
            if (last & MAX_WINDOW) < stream:
                raise ValueError(self._going_away + " (before this call)")
        elif kind == PUSH_PROMISE:
            raise ValueError("a PUSH_PROMISE, which the client's SETTINGS refused")

    def _apply_settings(self, payload: bytes, call: _Call) -> None:
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                call.window += value - self._initial_window  # open streams move with it
                self._initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value

    def _decode(self, block: bytes) -> dict[str, str]:
        """A header block's fields (names lower-case), through the connection's decoder."""
        cached = self._blocks.get(block)
        if cached is not None:
            return cached
        headers = {str(name): str(value) for name, value in self._decoder.decode(block)}
        if all(0x80 < byte < 0xFF for byte in block):  # indexed fields only: the table unchanged
            if len(self._blocks) < _CACHED_BLOCKS:
                self._blocks[block] = headers
        else:  # the table may have changed: what the cached blocks point at too
            self._blocks.clear()
        return headers


def _unpadded(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its padding."""
    if not flags & PADDED:
        return payload
    pad = payload[0]
    if pad >= len(payload):
        raise ValueError("a frame's padding is longer than the frame")
    return payload[1 : len(payload) - pad]


def _header_block(payload: bytes, flags: int) -> bytes:
    """A HEADERS frame's header block fragment (without padding and priority)."""
    fragment = _unpadded(payload, flags)
    return fragment[5:] if flags & PRIORITY_FLAG else fragment


def _error_name(code: int) -> str:
    return ERROR_CODES[code] if code < len(ERROR_CODES) else f"error {code}"
