# The crawl watcher: `GET /v2/crawl/{id}` (and /v2/batch/scrape/{id}) opened as a WebSocket, in
# the messages Firecrawl's server sends (crawl-status-ws.ts) and its SDKs' watchers read: one
# `catchup` with the status object and the first documents, one `document` per further page,
# then a close with code 1000 and reason `{"type":"done"}`. Nothing else: Firecrawl sends no
# status message (a client learns the final status from the catchup of a finished job, or asks
# over HTTP after the close, as the SDKs do), and a client may reject a type it does not know.
# A failed job's error is an `error` message before the close; anything that stops a watcher
# early (unknown job, storage error, a reader too slow) is an `error` message and a close.
#
# Documents are read from the store in pages after ONE cursor, the `n` of the last row sent
# (rows are numbered 1, 2, … as they commit), each page in the same snapshot as the job's record:
# the catchup and the stream cannot skip or repeat a document whatever commits between two reads,
# and a job seen finished in a read has no rows beyond it. A watcher costs the same at 10 pages
# or 10k and survives restarts of nothing but itself. Messages go through a bounded channel to the
# one task that writes to the socket: when the client does not take them within SLOW_READER_S,
# the socket is closed instead of buffering more. New documents are looked for every POLL_S
# (Firecrawl's server polls too, every second); that works the same on SQLite and on a
# PostgreSQL shared by several instances.
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
    from daemon.jobs.types import JobRecord

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
                await _closing_handshake(websocket)
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
    first = await manager.job_rows_after(job_id, 0, DEFAULT_LIMIT, CATCHUP_BYTES)
    if first[0] is None:
        raise _Stop(1008, "Job not found", "not_found")
    send, receive = trio.open_memory_channel[bytes](QUEUE_MESSAGES)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reader, websocket)
        nursery.start_soon(_produce, manager, first, send)
        async with receive:
            async for message in receive:  # ends when _produce closed the channel
                await websocket.send_text(message.decode())
        nursery.cancel_scope.cancel()  # the reader


async def _produce(
    manager: JobManager,
    first: tuple[JobRecord | None, list[tuple[int, bytes]], bool],
    send: trio.MemorySendChannel[bytes],
) -> None:
    """The catchup from `first` (the job and its first rows, one snapshot), then every later
    row as a `document`, each read after the `n` of the last one sent: one cursor from the
    catchup to the end, so no row is skipped or sent twice however rows and reads interleave."""

    async def put(message: bytes) -> None:
        with trio.move_on_after(SLOW_READER_S):
            await send.send(message)
            return
        raise SlowReader()

    async with send:
        record, rows, more = first
        assert record is not None
        if rows and sum(len(body) for _, body in rows) > CATCHUP_BYTES:
            rows, more = [], True  # one document larger than the catchup: on its own
        # A finished job whose other documents follow says `scraping` in the catchup, so a
        # client does not stop at it (Firecrawl's clients end at a catchup with a final status).
        status = await job_status(manager, record, [body for _, body in rows])
        if more:
            status.status = "scraping"
        await put(_encode({"type": "catchup", "data": status}))
        cursor = rows[-1][0] if rows else 0
        while more or not record.finished:
            if not more:
                await trio.sleep(POLL_S)
            latest, rows, more = await manager.job_rows_after(
                record.id, cursor, DEFAULT_LIMIT, PAGE_BYTES
            )
            if latest is None:
                raise _Stop(1008, "Job not found (expired)", "not_found")
            record = latest
            for n, body in rows:
                await put(b'{"type":"document","data":' + body + b"}")
                cursor = n
        if record.status == "failed" and record.error:
            error = cap_message(redact_text(record.error))
            await put(_encode({"type": "error", "error": error}))


async def _closing_handshake(websocket: WebSocket) -> None:
    """Wait for the client's Close before returning, since the server drops the TCP connection
    once the handler returns. Dropping it at once means whatever the client sends meanwhile (its
    Pong to the server's first ping, its Close reply) meets a closed socket, and the RST that
    answers can destroy messages the client has not read yet: the catchup or the last
    documents (RFC 6455 §7.1.1: the server closes the TCP connection after the closing
    handshake). The caller bounds the wait."""
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass


async def _reader(websocket: WebSocket) -> None:
    """Reads what the client sends (nothing but pongs, which hypercorn answers, and its close)
    so a client that leaves is noticed while its job is quiet."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
