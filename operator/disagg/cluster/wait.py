"""Polling helper for tests and tools that wait on the control plane."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not hold in time (an AssertionError, so a test fails rather than errors)."""


def wait_for(check: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.25, what: str = "") -> T:
    """Call ``check`` until it returns something truthy and return that; raise WaitTimeout naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f} s waiting for {what or check!r}")
        time.sleep(interval_s)


async def wait_for_async(
    check: Callable[[], Awaitable[T]], timeout_s: float = 60.0, interval_s: float = 0.2, what: str = ""
) -> T:
    """:func:`wait_for` for a coroutine ``check``, sleeping with asyncio between tries."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f} s waiting for {what or check!r}")
        await asyncio.sleep(interval_s)
