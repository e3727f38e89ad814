"""Triton's gRPC inference call on a plain socket: the HTTP/2 frames written and read here.

A call through grpcio's Python API costs the client time of its own (its completion queue,
the interpreter lock taken back and forth, its objects), and the open loop, which times each
request from its send, counts that time in every latency it reports: over gRPC its p50 and p99
sat above perf_analyzer's at the same rate, while over HTTP, sent on a plain socket
(:class:`~loadtest.engine.wire.RawHttpInfer`), they agreed (benchmarks/open_loop). Here a gRPC
call is sent the same way, from the sender's own thread on a blocking socket: a request is one
``sendmsg`` of frames built with a few byte operations (its header block is encoded once, without
the dynamic table, so it never changes), and the answer's frames are read until its stream ends.
A connection carries the calls of up to :data:`SHARE` senders (:class:`GrpcSockets`), as
perf_analyzer's client shares a channel; whichever of them is waiting reads the connection and
hands each answer to its sender (:class:`Connection`).

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
import contextlib
import math
import struct
import threading
import time
import urllib.parse

import grpc
import hpack
import numpy as np

from bundle.errors import ClientError, ConfigError, DataError
from loadtest.engine.wire import (
    MODEL_INFER,
    Turnaround,
    answer_scores,
    check_answer,
    connected_socket,
    send_whole,
    socket_address,
)

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
#: Senders per connection by default: tritonclient's C++ client shares a gRPC channel among this
#: many clients (``TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT``), so perf_analyzer's threads do.
SHARE = 6


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
    """One call on a connection: what of its message is left to send, and what its answer has
    brought so far."""

    __slots__ = (
        "arrived_at", "body", "ended", "error", "headers", "message", "received", "sent", "sent_at",
        "trailers", "window",
    )  # fmt: skip

    def __init__(self, message: bytes, window: int) -> None:
        self.message = message
        #: When its first frames went out, and when its stream's end was read (``perf_counter``).
        self.sent_at = self.arrived_at = math.nan
        #: Bytes of ``message`` sent so far.
        self.sent = 0
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.body = bytearray()
        self.ended = False
        #: Why the call failed before its answer ended (a reset, a GOAWAY before it).
        self.error: str | None = None
        #: The server's send window for this stream, as far as the client can tell.
        self.window = window
        #: DATA bytes received on this stream since its receive window was last topped up.
        self.received = 0

    @property
    def unsent(self) -> bool:
        return self.sent < len(self.message)


class _Broken(Exception):
    """The connection failed: every call on it fails with this reason."""


class Connection:
    """One HTTP/2 connection to a gRPC endpoint, carrying the calls of several threads at once.

    A thread's call goes out under the write lock (its HEADERS and as much of its message as the
    windows allow, in one ``sendmsg``). Answers are read by whichever waiting thread finds no one
    reading: it reads frames and hands each to its call until its own call has ended, then
    leaves reading to the next one, so a thread alone on its connection reads its own answer
    with no hand-over between threads. Locks are taken write then state, never the other way.

    Raises (from :meth:`call`): :class:`_Broken` when the connection fails; ``TimeoutError``
    when the call's deadline passes (the call's stream is reset, the connection kept).
    """

    def __init__(self, address: tuple[str, int], block: bytes, timeout_s: float) -> None:
        sock = connected_socket(address, timeout_s)
        try:
            settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
            sock.sendall(
                PREFACE
                + frame(SETTINGS, 0, 0, settings)
                + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))
            )
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._block = block
        self._write = threading.Lock()
        self._state = threading.Condition(threading.Lock())
        self._calls: dict[int, _Call] = {}
        self._reading = False
        self._buffer = bytearray()
        self._decoder = hpack.Decoder()
        self._blocks: dict[bytes, dict[str, str]] = {}
        self._next_stream = 1
        self._send_window = DEFAULT_WINDOW
        self._initial_window = DEFAULT_WINDOW
        self._max_frame = DEFAULT_MAX_FRAME
        self._received = 0
        #: Why the connection cannot carry calls any more (failed, or the server said GOAWAY).
        self.failed: str | None = None
        self.going_away = False

    @property
    def usable(self) -> bool:
        """Whether a new call may go out on it."""
        return self.failed is None and not self.going_away and self._next_stream < MAX_WINDOW - 2

    def close(self, reason: str = "the connection was closed") -> None:
        with self._state:
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        """Mark the connection failed and wake every call on it (the state lock held)."""
        if self.failed is None:
            self.failed = reason
            with contextlib.suppress(OSError):  # wakes a reader blocked in recv, as close does not
                self._socket.shutdown(_socket.SHUT_RDWR)
            self._socket.close()
        self._state.notify_all()

    # -- one call ---------------------------------------------------------------------------

    def call(self, message: bytes, deadline: float) -> _Call:
        """Send ``message`` (a gRPC message: prefix and bytes) and wait until its answer ends."""
        with self._write:
            with self._state:
                if self.failed is not None:
                    raise _Broken(self.failed)
                stream = self._next_stream
                self._next_stream += 2
                call = self._calls[stream] = _Call(message, self._initial_window)
                frames = [frame(HEADERS, END_HEADERS, stream, self._block), *self._data_frames(stream, call)]
            call.sent_at = time.perf_counter()
            self._send_frames(frames)
        try:
            while not call.ended:
                if call.unsent:
                    with self._write:
                        with self._state:
                            frames = self._data_frames(stream, call)
                        if frames:
                            self._send_frames(frames)
                self._wait(call, deadline)
        except TimeoutError:
            self._cancel(stream)
            raise
        finally:
            with self._state:
                self._calls.pop(stream, None)
                if not self._calls and self.failed is None and not self.usable:  # its last call
                    self._fail("the connection was retired (GOAWAY, or its stream ids used up)")
        return call

    def _data_frames(self, stream: int, call: _Call) -> list[bytes]:
        """The DATA frames of ``call`` that the windows let go out now, their room taken (the
        state lock held)."""
        frames, message = [], call.message
        room = min(self._send_window, call.window)
        while room > 0 and call.unsent:
            size = min(room, self._max_frame, len(message) - call.sent)
            last = call.sent + size == len(message)
            frames.append(
                frame(DATA, END_STREAM if last else 0, stream, message[call.sent : call.sent + size])
            )
            call.sent += size
            room -= size
            self._send_window -= size
            call.window -= size
        return frames

    def _send_frames(self, frames: list[bytes]) -> None:
        """Write ``frames`` whole (the write lock held); a failed write fails the connection."""
        try:
            send_whole(self._socket, frames)
        except OSError as exc:  # part of a frame may be out: nothing more can follow it
            with self._state:
                self._fail(str(exc) or type(exc).__name__)
            raise _Broken(self.failed or str(exc)) from None

    def _cancel(self, stream: int) -> None:
        """Reset a call's stream whose deadline passed; the connection carries on."""
        with self._write:
            if self.failed is None:
                with contextlib.suppress(_Broken):
                    self._send_frames([frame(RST_STREAM, 0, stream, struct.pack(">I", 8))])  # CANCEL

    def _wait(self, call: _Call, deadline: float) -> None:
        """Until ``call`` has ended, or has data to send and room for it: read frames if no
        other thread does, else wait for the one that does."""
        with self._state:
            while True:
                if self.failed is not None:
                    raise _Broken(self.failed)
                if call.ended or (call.unsent and min(self._send_window, call.window) > 0):
                    return
                if not self._reading:
                    self._reading = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no answer in time")
                self._state.wait(left)
        try:
            while not call.ended and not (call.unsent and min(self._send_window, call.window) > 0):
                self._read_frame(deadline)
        except TimeoutError:
            raise
        except (OSError, ValueError, IndexError, struct.error, hpack.HPACKError) as exc:
            with self._state:
                self._fail(str(exc) or type(exc).__name__)
            raise _Broken(self.failed or str(exc)) from None
        finally:
            with self._state:
                self._reading = False
                self._state.notify_all()

    # -- frames in ------------------------------------------------------------------------

    def _receive(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        self._socket.settimeout(left)
        chunk = self._socket.recv(_RECEIVE_BYTES)
        if not chunk:
            raise OSError("the server closed the connection")
        self._buffer += chunk

    def _next_frame(self, deadline: float) -> tuple[int, int, int, bytes]:
        """The next frame off the connection: type, flags, stream, payload (a frame read in part
        stays in the buffer for the next reader)."""
        buffer = self._buffer
        while len(buffer) < _FRAME.size:
            self._receive(deadline)
        high, low, kind, flags, stream = _FRAME.unpack_from(buffer)
        length = high << 8 | low
        if length > DEFAULT_MAX_FRAME:  # the client never allows more (its SETTINGS keep the default)
            raise ValueError(
                f"a frame of {length} bytes, more than the {DEFAULT_MAX_FRAME} the client allows"
            )
        end = _FRAME.size + length
        while len(buffer) < end:
            self._receive(deadline)
        payload = bytes(buffer[_FRAME.size : end])
        del buffer[:end]
        return kind, flags, stream & MAX_WINDOW, payload

    def _read_frame(self, deadline: float) -> None:
        """Read one frame (with its CONTINUATIONs) and do what it asks: add it to its call, or
        answer or apply it for the connection. Only the reading thread calls this."""
        kind, flags, on, payload = self._next_frame(deadline)
        if kind == HEADERS:
            block = _header_block(payload, flags)
            while not flags & END_HEADERS:
                try:
                    kind, flags, _, payload = self._next_frame(deadline)
                except TimeoutError:  # the block's first part is read: no later reader can decode it
                    raise ValueError("a header block was cut off by a call's deadline") from None
                if kind != CONTINUATION:
                    raise ValueError(f"a header block broken off by a frame of type {kind}")
                block += payload
            headers = self._decode(block)  # every block, in order: the table depends on them all
            with self._state:
                call = self._calls.get(on)
                if call is not None:
                    if call.headers is None:
                        call.headers = headers
                        if flags & END_STREAM:  # trailers-only: the status is among the headers
                            call.trailers = headers
                    else:
                        call.trailers = headers
                    self._end(call, flags)
            return
        replies: list[bytes] = []
        with self._state:
            if kind == DATA:
                self._received += len(payload)
                if self._received >= _TOP_UP:
                    replies.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
                    self._received = 0
                call = self._calls.get(on)
                if call is not None:
                    call.body += _unpadded(payload, flags)
                    call.received += len(payload)
                    if call.received >= _TOP_UP and not flags & END_STREAM:
                        replies.append(frame(WINDOW_UPDATE, 0, on, struct.pack(">I", call.received)))
                        call.received = 0
                    self._end(call, flags)
            elif kind == SETTINGS:
                if not flags & ACK:
                    self._apply_settings(payload)
                    replies.append(frame(SETTINGS, ACK, 0))
            elif kind == PING:
                if not flags & ACK:
                    replies.append(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                (increment,) = struct.unpack(">I", payload[:4])
                if on == 0:
                    self._send_window += increment & MAX_WINDOW
                elif on in self._calls:
                    self._calls[on].window += increment & MAX_WINDOW
                self._state.notify_all()  # a sender may have room now
            elif kind == RST_STREAM:
                (code,) = struct.unpack(">I", payload[:4])
                call = self._calls.get(on)
                if call is not None:
                    call.error = f"the server reset the call's stream ({_error_name(code)})"
                    self._end(call, END_STREAM)
            elif kind == GOAWAY:
                last, code = struct.unpack(">II", payload[:8])
                reason = payload[8:].decode("utf-8", "replace")
                said = f"the server closes the connection: GOAWAY {_error_name(code)} {reason}".strip()
                self.going_away = True
                for stream, call in self._calls.items():
                    if stream > (last & MAX_WINDOW):
                        call.error = said + " (before this call)"
                        self._end(call, END_STREAM)
            elif kind == PUSH_PROMISE:
                raise ValueError("a PUSH_PROMISE, which the client's SETTINGS refused")
        if replies:
            with self._write:
                self._send_frames(replies)

    def _end(self, call: _Call, flags: int) -> None:
        """End ``call`` if ``flags`` say its stream ended, and wake its thread (state lock held)."""
        if flags & END_STREAM:
            call.ended = True
            call.arrived_at = time.perf_counter()
            self._state.notify_all()

    def _apply_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                for call in self._calls.values():  # open streams move with it
                    call.window += value - self._initial_window
                self._initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value
        self._state.notify_all()

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


class _Slot:
    """A connection and the senders that share it; the connection is opened by the first call
    that finds none usable, and closed when the last sender leaves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.connection: Connection | None = None


class SocketGrpcInfer(Turnaround):
    """A sender's inference calls to Triton's gRPC endpoint, on an HTTP/2 connection it may share
    with other senders (:class:`GrpcSockets`), serialised ``ModelInferRequest`` bytes in, the
    answer's length out (the module's docstring says how).

    The socket is the C one (``_socket``), which gevent never patches: call this from a native
    thread. A connection that failed, or that the server said GOAWAY on, is replaced by the next
    call; a call whose deadline passed resets its own stream only.

    Args:
        url: ``host:port``.
        timeout_s: a request slower than this fails (and the server is told the deadline).
        slot: the connection this sender shares (:meth:`GrpcSockets.open`); one of its own if None.
    """

    def __init__(self, url: str, timeout_s: float, slot: _Slot | None = None) -> None:
        super().__init__()
        self.url = url
        self._address = socket_address(url)
        self._timeout_s = timeout_s
        self._block = request_headers(url, timeout_s=timeout_s)
        self._own = slot is None
        self._last = b""
        self._slot = _Slot() if slot is None else slot
        if self._own:
            self._slot.users = 1

    def _connection(self) -> Connection:
        slot = self._slot
        with slot.lock:
            connection = slot.connection
            if connection is None or not connection.usable:
                # One that failed is closed; one going away closes after its last call.
                try:
                    connection = slot.connection = Connection(self._address, self._block, self._timeout_s)
                except OSError as exc:
                    raise ClientError(f"{self.url}: {exc}") from None
            return connection

    def __call__(self, request: bytes, rows: int) -> int:
        """Send one serialised request of ``rows`` rows; the answer's size in bytes.

        Raises:
            ClientError: no answer (the connection failed, the stream was reset, the deadline
                passed), an HTTP status other than 200, or a gRPC status other than OK (its name
                and the server's message).
            DataError: the answer does not hold ``rows`` scores.
        """
        try:
            connection = self._connection()
        except ClientError:
            self.failed()
            raise
        deadline = time.monotonic() + self._timeout_s
        try:
            call = connection.call(_MESSAGE.pack(0, len(request)) + request, deadline)
        except _Broken as exc:
            self.failed()
            raise ClientError(f"{self.url}: {exc}") from None
        except TimeoutError:
            self.failed()
            raise ClientError(f"{self.url}: no answer within {self._timeout_s:g} s") from None
        self.sending(call.sent_at)
        self.failed()  # until the answer has passed its checks
        length = self._answer(call, rows)
        self.arrived(call.arrived_at)
        return length

    def _answer(self, call: _Call, rows: int) -> int:
        """The call's answer checked: HTTP 200, gRPC OK, one message of ``rows`` scores."""
        if call.error is not None:
            raise ClientError(f"{self.url}: {call.error}")
        headers = call.headers or {}
        status = headers.get(":status")
        if status != "200":
            kind = headers.get("content-type", "no content-type")
            raise ClientError(f"{self.url}: HTTP {status or 'status missing'} ({kind})")
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
        answer = bytes(body[_MESSAGE.size :])
        check_answer(answer, rows, self.url)
        self._last = answer
        return length

    def last_scores(self) -> np.ndarray:
        """The scores of the last answer that passed its checks (FP32, one per row)."""
        return answer_scores(self._last)

    def close(self) -> None:
        """Leave the connection: a sender of its own closes it (the next request opens another),
        the last sender of a shared one closes it."""
        slot = self._slot
        with slot.lock:
            if self._own or slot.users <= 1:
                if slot.connection is not None:
                    slot.connection.close()
                    slot.connection = None
                if not self._own:
                    slot.users = 0
            else:
                slot.users -= 1


class GrpcSockets:
    """Connections for a pool of senders, each carrying the calls of ``share`` senders at most,
    as tritonclient's C++ gRPC client (perf_analyzer's) shares a channel among up to 6 clients.

    Args:
        url: ``host:port``.
        timeout_s: each call's deadline.
        share: senders per connection.
    """

    def __init__(self, url: str, timeout_s: float, share: int = SHARE) -> None:
        if share < 1:
            raise ConfigError(f"senders per gRPC connection must be >= 1, got {share}")
        self.url, self._timeout_s, self._share = url, timeout_s, share
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []

    def open(self) -> SocketGrpcInfer:
        """A sender's calls, on the first connection with room for another sender."""
        with self._lock:
            slot = next((s for s in self._slots if 0 < s.users < self._share), None)
            if slot is None:
                slot = next((s for s in self._slots if s.users == 0), None) or _Slot()
                if slot not in self._slots:
                    self._slots.append(slot)
            slot.users += 1
        return SocketGrpcInfer(self.url, self._timeout_s, slot)


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
