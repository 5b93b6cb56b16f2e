# One AMQP call without a running broker client: `probe` (check-config, the tests' fixtures) and
# `delete_queue` (tests and benchmarks), each over a connection and an asyncio thread of its own.
#
# Why apart: the client (daemon/broker/client.py) keeps one connection alive for the daemon's
# life; these open one, do one thing, and close it, and must not touch the client's state.
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from daemon.broker import aio
from daemon.broker.asyncio_thread import open_asyncio_thread
from daemon.broker.rules import BrokerUnavailable, describe, redact_url


async def probe(url: str, *, timeout: float = 3.0) -> None:
    """Open and close one AMQP connection; raises BrokerUnavailable if that fails."""
    error = await _run_alone(aio.probe, url, timeout)
    if error is not None:
        raise BrokerUnavailable(f"{redact_url(url)}: {describe(error)}") from error


async def delete_queue(url: str, queue: str, *, timeout: float = 5.0) -> None:
    """Delete `queue` (absent is fine), over a connection of its own. For tests and tools."""
    error = await _run_alone(aio.delete_queue, url, queue, timeout)
    if error is not None:
        raise BrokerUnavailable(f"delete queue {queue!r}: {describe(error)}") from error


async def _run_alone(
    fn: Callable[..., Coroutine[Any, Any, None]], *args: Any
) -> BaseException | None:
    """Run one asyncio helper on a loop thread of its own; return its error instead of raising."""
    aio.route_client_logs()
    async with open_asyncio_thread("crawld-amqp-once") as thread:
        try:
            await thread.run(fn, *args)
        except (Exception, asyncio.CancelledError) as exc:
            return exc
    return None
