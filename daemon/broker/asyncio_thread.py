# A plain asyncio event loop in a thread of its own, driven from trio. aiormq (the user's AMQP
# client) is asyncio-only; run under trio-asyncio it cost ~4x the CPU per message, because that
# loop pays a trio checkpoint, a cancel scope and a channel receive for every asyncio callback and
# aiormq makes several per message. Here asyncio runs at its own speed and trio pays one hand-over
# per call: a call is a whole unit of work (a window of publishes, a take of N messages), not a
# message. docs/explanations/amqp-thread.md has the figures.
#
# Rules: every asyncio object lives on the loop's thread and is only touched by coroutines
# submitted here; trio waits for a call's outcome without blocking; a trio cancel cancels the
# asyncio task and waits until it has really ended, so nothing a cancelled call started keeps
# running behind its caller's back.
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Generic, TypeVar

import trio

from daemon.logs import get_logger

T = TypeVar("T")

log = get_logger("asyncio")

CANCEL_GRACE = 10.0
"""Seconds a cancelled call may take to end before its caller stops waiting for it."""


class LoopClosed(RuntimeError):
    """The asyncio thread is closed; no call can start."""


class Call(Generic[T]):
    """One coroutine running on the loop thread. Wait for it with `outcome()`; `cancel()` may be
    called from the trio thread at any time (also before the task started)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self._loop = loop
        self._token = token
        self._task: asyncio.Task[T] | None = None
        self._cancelled = False
        self._done = trio.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Ask the task to stop (asyncio cancellation); `outcome()` then raises CancelledError
        unless the task finished first."""
        if self._done.is_set():
            return
        self._cancelled = True
        with contextlib.suppress(RuntimeError):  # loop already closed: the call ended with it
            self._loop.call_soon_threadsafe(self._cancel_on_loop)

    async def outcome(self) -> T:
        """The coroutine's result (or its exception). If the waiting trio task is cancelled,
        the asyncio task is cancelled too and waited for, then trio.Cancelled propagates."""
        try:
            await self._done.wait()
        except trio.Cancelled:
            self.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_GRACE) as late:
                await self._done.wait()
            if late.cancelled_caught:
                log.warning("an asyncio call ignored its cancellation", task=repr(self._task))
            raise
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    # -- on the loop thread ---------------------------------------------------------------------

    def _start(self, coroutine: Coroutine[Any, Any, T]) -> None:
        if self._cancelled:
            coroutine.close()
            self._finish(None, asyncio.CancelledError())
            return
        task = self._task = self._loop.create_task(coroutine)
        task.add_done_callback(self._task_done)

    def _cancel_on_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _task_done(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self._finish(None, asyncio.CancelledError())
        elif (error := task.exception()) is not None:
            self._finish(None, error)
        else:
            self._finish(task.result(), None)

    def _finish(self, result: T | None, error: BaseException | None) -> None:
        self._result, self._error = result, error
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._done.set)


class AsyncioThread:
    """A stock `asyncio.SelectorEventLoop` running forever in a daemon thread.
    Create with `open_asyncio_thread`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.SelectorEventLoop()
        self.loop.set_exception_handler(_exception_to_debug_log)
        self._token = trio.lowlevel.current_trio_token()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> Call[T]:
        """Start `fn(*args)` as a task on the loop; returns at once (no checkpoint)."""
        if self._closed:
            raise LoopClosed("the asyncio thread is closed")
        call: Call[T] = Call(self.loop, self._token)
        coroutine = fn(*args)
        try:
            self.loop.call_soon_threadsafe(call._start, coroutine)
        except RuntimeError as exc:  # the loop stopped under us
            coroutine.close()
            raise LoopClosed("the asyncio thread is closed") from exc
        return call

    async def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """`fn(*args)` on the loop, awaited from trio (see `Call.outcome` for cancellation)."""
        return await self.submit(fn, *args).outcome()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(LoopClosed):
            await self.run(_cancel_other_tasks)
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        with trio.move_on_after(CANCEL_GRACE) as late:
            await trio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
        if late.cancelled_caught:  # a daemon thread: it cannot keep the process alive
            log.warning("the asyncio thread did not stop in time", thread=self._thread.name)


async def _cancel_other_tasks() -> None:
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=CANCEL_GRACE)


def _exception_to_debug_log(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    error = context.get("exception")
    log.debug(
        "asyncio: " + str(context.get("message", "unhandled error")),
        error=f"{type(error).__name__}: {error}" if error else None,
    )


@contextlib.asynccontextmanager
async def open_asyncio_thread(name: str = "asyncio") -> AsyncIterator[AsyncioThread]:
    """Run an asyncio loop thread for the block; leaving cancels what still runs on it, stops
    the loop and joins the thread."""
    thread = AsyncioThread(name)
    thread._thread.start()
    try:
        yield thread
    finally:
        with trio.CancelScope(shield=True):
            await thread._close()
