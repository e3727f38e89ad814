"""The open loop's shared gRPC channel (loadtest.engine.wire.SharedChannel): opened by the first
sender, the same channel for every sender after it, closed by the last one to leave."""

from __future__ import annotations

import grpc
import pytest

from loadtest.engine.wire import MODEL_INFER, SharedChannel


def test_senders_share_one_channel_which_the_last_one_closes() -> None:
    shared = SharedChannel("127.0.0.1:1")
    first, second = shared.open(), shared.open()
    assert first is second
    shared.release()
    # Still open: a call goes out, and fails only for want of a server.
    with pytest.raises(grpc.RpcError):
        second.unary_unary(MODEL_INFER)(b"", timeout=0.1)
    shared.release()
    with pytest.raises(ValueError, match="closed channel"):
        first.unary_unary(MODEL_INFER)(b"", timeout=0.1)
    again = shared.open()  # a later sender opens a new one
    assert again is not first
    shared.release()
