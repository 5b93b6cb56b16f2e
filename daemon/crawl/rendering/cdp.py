# The Chrome DevTools Protocol over Chromium's `--remote-debugging-pipe`, on trio. A pipe, not a
# port: no other process of the machine can attach to the browser (a DevTools port on loopback is
# a remote-control socket for any local user or any page that reaches it), and there is no
# handshake, no WebSocket library and no second event loop (Playwright's asyncio API plus its Node
# driver process; see docs/explanations/cdp-pipe.md for the figures that chose this).
#
# Wire format: JSON messages terminated by a NUL byte; Chromium reads commands on its fd 3 and
# writes answers and events on its fd 4. One reader task routes answers to the waiting caller (by
# id) and events to the subscribers of their session (flat sessions, `Target.attachToTarget
# {flatten: true}`). When the pipe closes (the browser died), every waiting call fails with
# CdpClosed at once, so a crashed browser fails only the pages it was rendering.
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import msgspec
import trio

__all__ = ["CdpClosed", "CdpError", "Connection", "Session"]

_EVENT_BUFFER = 4096
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class CdpError(Exception):
    """A command the browser answered with an error."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.method = method
        self.code = error.get("code")
        self.message = str(error.get("message", "error"))
        super().__init__(f"{method}: {self.message}")


class CdpClosed(Exception):
    """The browser went away (crashed, killed or closed) or the target was detached."""


class _Call:
    __slots__ = ("done", "error", "result", "session")

    def __init__(self, session: str | None) -> None:
        self.done = trio.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.session = session


class Connection:
    """One browser's DevTools pipe. `run()` reads it until it closes."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send = send
        self._receive = receive
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._subs: dict[str | None, list[tuple[frozenset[str], trio.MemorySendChannel[Any]]]] = {}
        self._write_lock = trio.Lock()
        self._detached: set[str] = set()
        self._observers: dict[str | None, list[Callable[[dict[str, Any]], None]]] = {}
        self.closed = trio.Event()

    async def run(self) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = await self._receive.receive_some(1 << 16)
                if not chunk:
                    return
                buffer += chunk
                while (end := buffer.find(0)) >= 0:
                    raw = bytes(buffer[:end])
                    del buffer[: end + 1]
                    self._dispatch(_decode(raw))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        finally:
            self._close()

    def _close(self) -> None:
        self.closed.set()
        for call in self._calls.values():
            call.error = CdpClosed("the browser closed its DevTools pipe")
            call.done.set()
        self._calls.clear()
        for subs in self._subs.values():
            for _, channel in subs:
                channel.close()

    def _dispatch(self, message: dict[str, Any]) -> None:
        ident = message.get("id")
        if ident is not None:
            call = self._calls.pop(ident, None)
            if call is not None:
                if "error" in message:
                    call.error = CdpError(str(message.get("method", "")), message["error"])
                else:
                    call.result = message.get("result", {})
                call.done.set()
            return
        method = message.get("method", "")
        if method in ("Target.detachedFromTarget", "Inspector.detached", "Inspector.targetCrashed"):
            gone = message.get("params", {}).get("sessionId") or message.get("sessionId")
            if gone:
                self._detach(gone, method)
        for observer in self._observers.get(message.get("sessionId"), ()):
            observer(message)
        for methods, channel in self._subs.get(message.get("sessionId"), ()):
            if method in methods or "*" in methods:
                with suppress(trio.WouldBlock, trio.ClosedResourceError):
                    channel.send_nowait(message)

    def _detach(self, session: str, why: str) -> None:
        self._detached.add(session)
        for ident, call in list(self._calls.items()):
            if call.session == session:
                call.error = CdpClosed(f"target gone ({why})")
                call.done.set()
                del self._calls[ident]

    async def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        if self.closed.is_set():
            raise CdpClosed("the browser is not running")
        if session is not None and session in self._detached:
            raise CdpClosed("target gone")
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        call = self._calls[ident] = _Call(session)
        try:
            async with self._write_lock:
                await self._send.send_all(_encode(message) + b"\0")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._calls.pop(ident, None)
            raise CdpClosed("the browser closed its DevTools pipe") from None
        try:
            await call.done.wait()
        finally:
            self._calls.pop(ident, None)
        if call.error is not None:
            if isinstance(call.error, CdpError):
                call.error.method = method
            raise call.error
        assert call.result is not None
        return call.result

    @contextmanager
    def subscribe(
        self, session: str | None, *methods: str
    ) -> Iterator[trio.MemoryReceiveChannel[dict[str, Any]]]:
        """Events of `session` with one of `methods` ("*": all), from now until the block ends."""
        send, receive = trio.open_memory_channel[dict[str, Any]](_EVENT_BUFFER)
        entry = (frozenset(methods), send)
        self._subs.setdefault(session, []).append(entry)
        if self.closed.is_set():
            send.close()
        try:
            yield receive
        finally:
            subs = self._subs.get(session, [])
            if entry in subs:
                subs.remove(entry)
            if not subs:
                self._subs.pop(session, None)
            send.close()

    def observe(self, session: str | None, observer: Callable[[dict[str, Any]], None]) -> None:
        """Call `observer` with every event of `session` (None: the browser's own), in order and
        none dropped (unlike a subscription's bounded channel), until `forget(session)`. It
        runs inside the reader: it must not block or raise."""
        self._observers.setdefault(session, []).append(observer)

    def is_detached(self, session: str) -> bool:
        """Whether the target of `session` is gone (closed or crashed) or the browser is."""
        return session in self._detached or self.closed.is_set()

    def forget(self, session: str) -> None:
        self._detached.discard(session)
        self._subs.pop(session, None)
        self._observers.pop(session, None)


class Session:
    """A flat session attached to one target (a tab)."""

    def __init__(self, conn: Connection, session_id: str, target_id: str) -> None:
        self.conn = conn
        self.id = session_id
        self.target_id = target_id

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.conn.call(method, params, self.id)

    def subscribe(self, *methods: str) -> Any:
        return self.conn.subscribe(self.id, *methods)
