"""``lab client-cost`` reads the server's time per request from its statistics between requests:
a request the server counted beside this client's own (another client loading the same model)
would be added to it, so the measurement refuses it in one line instead of reporting a sum."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bundle.errors import ClientError
from lab.client_cost import measure


class _Statistics:
    """The server's counters: each read after a request shows ``per_request`` more requests, of
    1 ms each (1 is this client's own; 2: another client's request came in between)."""

    def __init__(self, per_request: int) -> None:
        self.per_request = per_request
        self.count = 0

    def statistics(self, model: str) -> list[Any]:
        return [SimpleNamespace(success_count=self.count, success_ns=self.count * 1_000_000)]


class _Counting:
    """The measured client: every call returns at once; each send moves the server's counters."""

    def __init__(self, stats: _Statistics) -> None:
        self.stats = stats

    def prepare(self, model: str, inputs: dict[str, np.ndarray]) -> Any:
        return inputs

    def send(self, prepared: Any) -> Any:
        self.stats.count += self.stats.per_request
        return prepared

    def decode(self, prepared: Any, result: Any) -> None:
        return None


INPUTS = {"dense": np.zeros((1, 13), np.float32)}


def test_each_request_gets_the_server_time_of_its_own_request() -> None:
    stats = _Statistics(per_request=1)
    samples = measure(_Counting(stats), stats, "m", INPUTS, 5)  # type: ignore[arg-type]
    assert samples.shape == (5, 6)
    assert np.allclose(samples[:, 1], 0.001)  # one request's 1 ms each


def test_a_request_counted_beside_this_clients_own_is_refused() -> None:
    stats = _Statistics(per_request=2)
    with pytest.raises(ClientError, match="counted 2 requests of m while this client sent one") as error:
        measure(_Counting(stats), stats, "m", INPUTS, 3)  # type: ignore[arg-type]
    assert "another client is sending to it" in str(error.value) and "\n" not in str(error.value)
