# The crawl watcher: `GET /v2/crawl/{id}` (and /v2/batch/scrape/{id}) opened as a WebSocket, in
# the messages firecrawl-js's `watcher()` reads (Firecrawl's crawl-status-ws.ts): one `catchup`
# with the status object and the first documents, one `document` per further page, then the
# final status and a close with code 1000 and reason `{"type":"done"}`. Anything that stops a
# watcher early (unknown job, storage error, a reader too slow) is an `error` message and a close.
#
# Documents are read from the store in pages after a cursor, exactly as `next` links page them,
# so a watcher costs the same at 10 pages or 10k and survives restarts of nothing but itself.
# They go through a bounded channel to the one task that writes to the socket: when the client
# does not take them within SLOW_READER_S, the socket is closed instead of buffering more. New
# documents are looked for every POLL_S (Firecrawl's server polls too, every second); that works
# the same on SQLite and on a PostgreSQL shared by several instances.
#
# The edge (daemon/api/edge.py) already checked the Host, the key (Authorization or
# Sec-WebSocket-Protocol) and the same-origin rule before this handler runs.
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from prometheus_client import Counter
from starlette.websockets import WebSocket, WebSocketDisconnect

from daemon import metrics
from daemon.api.jobs import DEFAULT_LIMIT, PAGE_BYTES, job_status
from daemon.api.server import is_disconnect
from daemon.logs import get_logger
from daemon.redact import cap_message, redact_text
from daemon.store import STORAGE_ERRORS, StoreClosed

if TYPE_CHECKING:
    from daemon.jobs.manager import JobManager
    from daemon.jobs.store import JobRecord

log = get_logger("http.watch")

POLL_S = 0.25
"""How often a running job's new documents are looked for."""
CATCHUP_BYTES = 512 * 1024
"""Documents in the catchup message at most: clients cap messages (Python's websockets at 1 MiB),
so the rest follow one `document` message each."""
QUEUE_MESSAGES = 32
"""Messages a socket may have waiting for the client."""
SLOW_READER_S = 30.0
"""A client that leaves the queue full this long is closed (1008)."""
CLOSE_TIMEOUT_S = 5.0
DONE = '{"type":"done"}'

watchers = Counter(
    "crawld_watchers",
    "Crawl watcher WebSockets by how they ended",
    ["outcome"],
    registry=metrics.REGISTRY,
)

_encode = msgspec.json.Encoder().encode
STOPPED_BY_STORE: tuple[type[BaseException], ...] = (*STORAGE_ERRORS, StoreClosed)


class SlowReader(Exception):
    """The client left the send queue full for SLOW_READER_S."""


class _Stop(Exception):
    """Ends a watcher early with an `error` message and this close code."""

    def __init__(self, code: int, error: str, outcome: str) -> None:
        super().__init__(error)
        self.code, self.error, self.outcome = code, error, outcome


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _gone(exc: BaseException) -> bool:
    return is_disconnect(exc) or isinstance(exc, WebSocketDisconnect)


def watcher(manager: JobManager) -> Any:
    async def watch(websocket: WebSocket) -> None:
        offered = websocket.scope.get("subprotocols") or []
        # The JS SDK sends its key as the only subprotocol; a client that offers one must see it
        # selected, or its WebSocket fails the handshake.
        await websocket.accept(subprotocol=offered[0] if offered else None)
        outcome, code, reason, error = "done", 1000, DONE, None
        try:
            await _run(manager, websocket)
        except BaseException as exc:
            leaves = _leaves(exc)
            stops = [e for e in leaves if isinstance(e, _Stop)]
            if stops:
                outcome, code, error = stops[0].outcome, stops[0].code, stops[0].error
            elif store_errors := [e for e in leaves if isinstance(e, STOPPED_BY_STORE)]:
                log.warning("watcher stopped: storage error", error=str(store_errors[0]))
                outcome, code, error = "storage_error", 1011, "storage unavailable"
            elif any(isinstance(e, SlowReader) for e in leaves):
                outcome, code, error = "slow_reader", 1008, "client too slow: closed"
            elif all(_gone(e) for e in leaves):
                outcome = "disconnected"
            else:
                raise
        watchers.labels(outcome).inc()
        if outcome == "disconnected":
            return
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                if error is not None:
                    reason = _encode({"type": "error", "error": error[:80]}).decode()
                    if outcome != "slow_reader":
                        await websocket.send_text(
                            _encode({"type": "error", "error": error}).decode()
                        )
                await websocket.close(code, reason)
            except Exception as exc:  # the client may be gone already
                if not _gone(exc) and not isinstance(exc, RuntimeError):
                    raise

    return watch


async def _run(manager: JobManager, websocket: WebSocket) -> None:
    raw = websocket.path_params["id"]
    try:
        job_id = str(uuid.UUID(raw))
    except ValueError:
        raise _Stop(1008, "invalid job id: expected a UUID", "refused") from None
    record = await manager.get_job(job_id)
    if record is None:
        raise _Stop(1008, "Job not found", "not_found")
    send, receive = trio.open_memory_channel[bytes](QUEUE_MESSAGES)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reader, websocket)
        nursery.start_soon(_produce, manager, record, send)
        async with receive:
            async for message in receive:  # ends when _produce closed the channel
                await websocket.send_text(message.decode())
        nursery.cancel_scope.cancel()  # the reader


async def _produce(
    manager: JobManager, record: JobRecord, send: trio.MemorySendChannel[bytes]
) -> None:
    async def put(message: bytes) -> None:
        with trio.move_on_after(SLOW_READER_S):
            await send.send(message)
            return
        raise SlowReader()

    async with send:
        # The catchup holds what fits in CATCHUP_BYTES; a finished job whose other
        # documents follow as `document` messages says `scraping` until the final status, so a
        # client does not stop at the catchup.
        rows, more = await manager.job_rows(record.id, 0, DEFAULT_LIMIT, CATCHUP_BYTES)
        if sum(map(len, rows)) > CATCHUP_BYTES:  # one document larger than that: on its own
            rows, more = [], True
        status = await job_status(manager, record, rows)
        if more:
            status.status = "scraping"
        await put(_encode({"type": "catchup", "data": status}))
        cursor = len(rows)
        final = record.finished
        while True:
            rows, more = await manager.job_rows(record.id, cursor, DEFAULT_LIMIT, PAGE_BYTES)
            for row in rows:
                await put(b'{"type":"document","data":' + row + b"}")
            cursor += len(rows)
            if more:
                continue
            if final:
                break
            await trio.sleep(POLL_S)
            latest = await manager.get_job(record.id)
            if latest is None:
                raise _Stop(1008, "Job not found (expired)", "not_found")
            # a job that just finished gets one more read: rows committed before its end
            record, final = latest, latest.finished
        if record.status == "failed" and record.error:
            error = cap_message(redact_text(record.error))
            await put(_encode({"type": "error", "error": error}))
        await put(_encode({"type": "status", "data": await job_status(manager, record, [])}))


async def _reader(websocket: WebSocket) -> None:
    """Reads what the client sends (nothing but pongs, which hypercorn answers, and its close)
    so a client that leaves is noticed while its job is quiet."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
