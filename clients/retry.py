"""Retries with exponential backoff, on UNAVAILABLE only.

A server that is starting, restarting or overloaded answers UNAVAILABLE (gRPC),
503 (HTTP) or refuses the connection; such a call may succeed a moment later.
Every other failure (INVALID_ARGUMENT, NOT_FOUND, a timeout, ...) is final:
retrying a bad request only repeats its error, and a timed-out inference may
still be running on the server.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from bundle.errors import ConfigError
from clients.failures import is_unavailable, message

logger = logging.getLogger(__name__)

T = TypeVar("T")

_jitter_source = random.Random()


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a call that failed with UNAVAILABLE.

    The n-th retry waits ``min(initial_backoff_s * multiplier**(n-1), max_backoff_s)``
    plus up to ``jitter`` of that at random (so many clients do not retry in step).

    Args:
        max_tries: attempts in all, the first included (1 = never retry).
        initial_backoff_s: wait before the first retry.
        max_backoff_s: cap of any one wait.
        multiplier: growth of the wait from one retry to the next.
        jitter: random extra wait, as a fraction of the wait (0 = none).
    """

    max_tries: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.max_tries, bool) or not isinstance(self.max_tries, int) or self.max_tries < 1:
            raise ConfigError(f"max_tries must be an integer >= 1, got {self.max_tries!r}")
        if not self.initial_backoff_s >= 0:
            raise ConfigError(f"initial_backoff_s must be >= 0, got {self.initial_backoff_s!r}")
        if not self.max_backoff_s >= self.initial_backoff_s:
            raise ConfigError(
                f"max_backoff_s must be >= initial_backoff_s ({self.initial_backoff_s}), "
                f"got {self.max_backoff_s!r}"
            )
        if not self.multiplier >= 1:
            raise ConfigError(f"multiplier must be >= 1, got {self.multiplier!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"jitter must be in [0, 1], got {self.jitter!r}")

    def backoff_s(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1-based), without jitter."""
        if retry < 1:
            raise ConfigError(f"retry numbers start at 1, got {retry}")
        return min(self.initial_backoff_s * self.multiplier ** (retry - 1), self.max_backoff_s)

    def _wait_s(self, retry: int) -> float:
        base = self.backoff_s(retry)
        return base + base * self.jitter * _jitter_source.random()


def _log_retry(what: str, exc: BaseException, attempt: int, policy: RetryPolicy, wait_s: float) -> None:
    # DEBUG, not INFO: a command's stderr stays one line when it finally fails.
    logger.debug(
        "%s: unavailable (%s); try %d of %d in %.2f s",
        what,
        message(exc),
        attempt + 1,
        policy.max_tries,
        wait_s,
    )


def call(fn: Callable[[], T], policy: RetryPolicy, what: str = "call") -> T:
    """Call ``fn`` until it succeeds, fails with something other than UNAVAILABLE,
    or ``policy.max_tries`` attempts are spent; then raise its last exception.

    Args:
        fn: the call, without arguments.
        policy: how often and how long to wait.
        what: names the call in debug logs.

    Returns:
        What ``fn`` returned.
    """
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as exc:  # classified below; anything not UNAVAILABLE propagates unchanged
            if attempt >= policy.max_tries or not is_unavailable(exc):
                raise
            wait_s = policy._wait_s(attempt)
            _log_retry(what, exc, attempt, policy, wait_s)
            time.sleep(wait_s)
            attempt += 1


async def acall(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, what: str = "call") -> T:
    """The asyncio form of :func:`call`: ``fn`` returns a new awaitable per attempt."""
    attempt = 1
    while True:
        try:
            return await fn()
        except Exception as exc:  # classified below; anything not UNAVAILABLE propagates unchanged
            if attempt >= policy.max_tries or not is_unavailable(exc):
                raise
            wait_s = policy._wait_s(attempt)
            _log_retry(what, exc, attempt, policy, wait_s)
            await asyncio.sleep(wait_s)
            attempt += 1
