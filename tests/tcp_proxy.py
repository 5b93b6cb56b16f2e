"""A loopback TCP proxy the tests can cut: every connection through it dies at once, and new ones
are refused until it is resumed (a network failure between crawld and a server)."""

from __future__ import annotations

import trio


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        self._cut = False
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    def cut(self) -> None:
        """Close every open connection and refuse new ones."""
        self._cut = True
        for scope in list(self._scopes):
            scope.cancel()

    def resume(self) -> None:
        self._cut = False

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self._cut:
                return
            try:
                upstream = await trio.open_tcp_stream(*self.target)
            except OSError:
                return
            self.connections += 1
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
                        nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)
                finally:
                    self._scopes.discard(scope)


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()
