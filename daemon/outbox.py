# Everything that leaves the daemon (a row for RabbitMQ, an event for a webhook) is first appended
# to an ordered stream, in the same transaction as the state change that caused it. A drainer per
# stream reads the items after the stream's ack cursor in sequence order, delivers them, and only
# then advances the cursor and deletes what it covered, atomically. A crash can therefore repeat
# the in-flight batch (same key: message_id / webhookId) but never lose an item.
#
# The sync functions (`append`, `ack`, `read_after_cursor`, …) run inside a caller's store
# transaction; `Outbox` wraps them for trio code. An append wakes the stream's drainer and an
# `Outbox` ack its held-back producer through the store's wake-ups (daemon/store/wake.py), in
# whichever cluster member they wait, once the transaction commits.
# An item may point to the job row that stores its body (a collector row is kept once, for the
# queue and for the run's `data`); reads join it back, so drainers always see whole items.
# `MemoryStream` is the bounded in-memory variant with the same interface, for runs without a
# store: a full stream makes the producer wait (backpressure) instead of dropping anything.
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec
import trio

from daemon.store import Conn, Store, one, wake


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class NewItem(msgspec.Struct, frozen=True):
    key: str
    body: bytes
    meta: dict[str, Any] = {}
    expires_ms: int | None = None


class Item(msgspec.Struct, frozen=True):
    stream: str
    seq: int
    key: str
    body: bytes
    meta: dict[str, Any]
    created_ms: int
    expires_ms: int | None = None


class StreamState(msgspec.Struct, frozen=True):
    stream: str
    last_seq: int
    ack_cursor: int
    pending: int
    oldest_ms: int | None


_meta_encoder = msgspec.json.Encoder()
_meta_decoder = msgspec.json.Decoder(dict[str, Any])


def append(
    conn: Conn,
    stream: str,
    items: Sequence[NewItem],
    at_ms: int,
    *,
    bodies_in: tuple[str, int] | None = None,
) -> list[int]:
    """Append items to `stream` inside the caller's transaction; return their sequence numbers.

    `bodies_in=(job_id, n)`: the job rows n, n + 1, … (stored in this transaction) hold the items'
    bodies, in order; the items point to them instead of keeping a second copy (migration 0007).
    """
    conn.execute("INSERT INTO outbox_streams(stream) VALUES (?) ON CONFLICT DO NOTHING", (stream,))
    (last,) = one(
        conn,
        "UPDATE outbox_streams SET last_seq = last_seq + ? WHERE stream = ? RETURNING last_seq",
        (len(items), stream),
    )
    first = last - len(items) + 1
    job_id, first_row = bodies_in or (None, None)
    conn.executemany(
        "INSERT INTO outbox_items(stream, seq, key, body, meta, created_ms, expires_ms, row_job,"
        " row_n) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            (
                stream,
                first + i,
                it.key,
                b"" if job_id else it.body,
                _meta_encoder.encode(it.meta),
                at_ms,
                it.expires_ms,
                job_id,
                None if first_row is None else first_row + i,
            )
            for i, it in enumerate(items)
        ),
    )
    wake.notify(conn, wake.APPENDED, stream)
    return list(range(first, last + 1))


# An item pointing to a job row reads its body there; a missing row reads as NULL, which `_items`
# refuses rather than deliver an empty body.
_SELECT_ITEMS = (
    "SELECT i.seq, i.key, CASE WHEN i.row_job IS NULL THEN i.body ELSE r.body END, i.meta,"
    " i.created_ms,"
    " i.expires_ms FROM outbox_items i JOIN outbox_streams s ON s.stream = i.stream"
    " LEFT JOIN job_rows r ON r.job_id = i.row_job AND r.n = i.row_n"
)


def lock_stream(conn: Conn, stream: str) -> None:
    """Take the stream's row lock for the rest of the transaction: on PostgreSQL two takers (two
    instances, two writers) then read after the cursor one after the other, never the same
    items. SQLite has one writer, so this costs one no-op update there."""
    conn.execute("UPDATE outbox_streams SET ack_cursor = ack_cursor WHERE stream = ?", (stream,))


def read_after_cursor(conn: Conn, stream: str, limit: int) -> list[Item]:
    rows: list[Any] = conn.execute(
        _SELECT_ITEMS + " WHERE i.stream = ? AND i.seq > s.ack_cursor ORDER BY i.seq LIMIT ?",
        (stream, limit),
    ).fetchall()
    return _items(stream, rows)


def read_after(conn: Conn, stream: str, after_seq: int, limit: int) -> list[Item]:
    """Up to `limit` items after both `after_seq` and the ack cursor, in order: what a drainer
    with batches in flight reads next."""
    rows: list[Any] = conn.execute(
        _SELECT_ITEMS
        + " WHERE i.stream = ? AND i.seq > max(s.ack_cursor, ?) ORDER BY i.seq LIMIT ?",
        (stream, after_seq, limit),
    ).fetchall()
    return _items(stream, rows)


def _items(stream: str, rows: list[Any]) -> list[Item]:
    # Neighbouring items mostly carry the same meta (one page of rows shares its task, run and
    # offset), so each distinct text is decoded once per read; the dicts are shared and read-only.
    metas: dict[bytes | str, dict[str, Any]] = {}
    items = []
    for seq, key, body, meta, created, expires in rows:
        decoded = metas.get(meta)
        if decoded is None:
            decoded = metas[meta] = _meta_decoder.decode(meta)
        if body is None:
            raise LookupError(f"outbox item {stream}:{seq} points to a job row that is gone")
        items.append(Item(stream, seq, key, bytes(body), decoded, created, expires))
    return items


def ack(conn: Conn, stream: str, upto_seq: int) -> int:
    """Advance the cursor to `upto_seq` (never backwards) and delete what it covers."""
    conn.execute(
        "UPDATE outbox_streams SET ack_cursor = max(ack_cursor, ?) WHERE stream = ?",
        (upto_seq, stream),
    )
    conn.execute("DELETE FROM outbox_items WHERE stream = ? AND seq <= ?", (stream, upto_seq))
    return conn.changes()


def advance_cursor(conn: Conn, stream: str, upto_seq: int) -> None:
    """Move the cursor to `upto_seq` (never backwards) without deleting what it covers: one
    statement instead of two, for a drainer acking item by item. Items at or below the cursor
    are never read again; a later `ack` deletes them (a crash in between only leaves them for
    that `ack`)."""
    conn.execute(
        "UPDATE outbox_streams SET ack_cursor = max(ack_cursor, ?) WHERE stream = ?",
        (upto_seq, stream),
    )


def backlog(conn: Conn, stream: str) -> int:
    """Items appended and not yet acknowledged, in O(1): every seq up to `last_seq` was appended
    and only an ack (which moves the cursor) deletes items, so this is `last_seq - ack_cursor`."""
    row = conn.execute(
        "SELECT last_seq - ack_cursor FROM outbox_streams WHERE stream = ?", (stream,)
    ).fetchone()
    return int(row[0]) if row else 0


def stream_state(conn: Conn, stream: str) -> StreamState:
    row = conn.execute(
        "SELECT last_seq, ack_cursor FROM outbox_streams WHERE stream = ?", (stream,)
    ).fetchone()
    last, cursor = row if row else (0, 0)
    oldest = conn.execute(
        "SELECT created_ms FROM outbox_items WHERE stream = ? AND seq > ? ORDER BY seq LIMIT 1",
        (stream, cursor),
    ).fetchone()
    return StreamState(stream, last, cursor, last - cursor, oldest[0] if oldest else None)


def list_streams(conn: Conn, prefix: str) -> list[str]:
    rows: list[Any] = conn.execute(
        "SELECT stream FROM outbox_streams WHERE stream >= ? AND stream < ? ORDER BY stream",
        (prefix, prefix + "\U0010ffff"),
    ).fetchall()
    return [r[0] for r in rows]


def drop_stream(conn: Conn, stream: str) -> None:
    conn.execute("DELETE FROM outbox_streams WHERE stream = ?", (stream,))


class Signal:
    """A wake-up: waiters take the current event before checking, firing replaces it."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def fire(self) -> None:
        self.event.set()
        self.event = trio.Event()


async def woken_or_polled(woken: trio.Event, poll_s: float | None) -> None:
    """Wait for a wake-up, or (`poll_s` given: a wake-up may be lost) at most `poll_s`."""
    if poll_s is None:
        await woken.wait()
    else:
        with trio.move_on_after(poll_s):
            await woken.wait()


class Outbox:
    """Durable streams in the store, with wake-ups for the drainers that read them and the
    producers they hold back (the store's, so they come from whichever process committed)."""

    def __init__(self, store: Store, clock_ms: Callable[[], int] = now_ms) -> None:
        self.store = store
        self.clock_ms = clock_ms

    def notify_appended(self, stream: str) -> None:
        """Wake this process's drainer of `stream` (a write through `append` already does)."""
        self.store.wakeups.fire(wake.APPENDED, stream)

    async def append(
        self,
        stream: str,
        items: Sequence[NewItem],
        also: Callable[[Conn], Any] | None = None,
    ) -> list[int]:
        """Append (and run `also(conn)` in the same transaction); wakes the stream's drainer."""
        at = self.clock_ms()

        def tx(conn: Conn) -> list[int]:
            seqs = append(conn, stream, items, at)
            if also is not None:
                also(conn)
            return seqs

        return await self.store.write(tx)

    async def next_batch(
        self, stream: str, limit: int, *, after: int = 0, wait: bool = True
    ) -> list[Item]:
        """The next items after the ack cursor (and after seq `after`), in order; waits until
        there is at least one, unless `wait` is False (then it may return none)."""
        wakeups = self.store.wakeups
        while True:
            woken = wakeups.event(wake.APPENDED, stream)
            items = await self.store.read(lambda c: read_after(c, stream, after, limit))
            if items or not wait:
                return items
            await wakeups.wait(woken)

    async def ack(
        self, stream: str, upto_seq: int, also: Callable[[Conn], Any] | None = None
    ) -> None:
        """Advance the cursor and delete acked items (plus `also(conn)`) in one transaction;
        wakes the stream's producer waiting for room."""

        def tx(conn: Conn) -> None:
            ack(conn, stream, upto_seq)
            wake.notify(conn, wake.ACKED, stream)
            if also is not None:
                also(conn)

        await self.store.write(tx)

    async def state(self, stream: str) -> StreamState:
        return await self.store.read(lambda c: stream_state(c, stream))

    async def wait_pending_below(self, stream: str, bound: int) -> None:
        """Wait until fewer than `bound` items are pending (the producer's backpressure); each
        check is O(1) whatever the backlog."""
        wakeups = self.store.wakeups
        while True:
            woken = wakeups.event(wake.ACKED, stream)
            if await self.store.read(lambda c: backlog(c, stream)) < bound:
                return
            await wakeups.wait(woken)

    async def take(self, stream: str, count: int) -> tuple[list[Item], int]:
        """Embedded-queue read: remove and return up to `count` live items in order.

        Expired items met on the way are removed too; their number is returned second.
        """
        at = self.clock_ms()

        def tx(conn: Conn) -> tuple[list[Item], int]:
            taken: list[Item] = []
            expired = 0
            upto = 0
            lock_stream(conn, stream)
            while len(taken) < count:
                batch = read_after_cursor(conn, stream, count - len(taken))
                if not batch:
                    break
                for item in batch:
                    upto = item.seq
                    if item.expires_ms is not None and item.expires_ms <= at:
                        expired += 1
                    else:
                        taken.append(item)
                ack(conn, stream, upto)
            if upto:
                wake.notify(conn, wake.ACKED, stream)
            return taken, expired

        return await self.store.write(tx)


class Stream(Protocol):
    """What a drainer needs from a stream, durable or in memory."""

    name: str

    async def append(self, items: Sequence[NewItem]) -> list[int]: ...
    async def next_batch(self, limit: int) -> list[Item]: ...
    async def ack(self, upto_seq: int) -> None: ...


class DurableStream:
    """One named stream of an Outbox."""

    def __init__(self, outbox: Outbox, name: str) -> None:
        self.outbox = outbox
        self.name = name

    async def append(self, items: Sequence[NewItem]) -> list[int]:
        return await self.outbox.append(self.name, items)

    async def next_batch(self, limit: int) -> list[Item]:
        return await self.outbox.next_batch(self.name, limit)

    async def ack(self, upto_seq: int) -> None:
        await self.outbox.ack(self.name, upto_seq)


class MemoryStream:
    """A bounded in-memory stream: `append` waits while `capacity` items are unacked."""

    def __init__(
        self, name: str, capacity: int, *, first_seq: int = 1, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.name = name
        self.capacity = capacity
        self.clock_ms = clock_ms
        self._items: deque[Item] = deque()
        self._next_seq = first_seq
        self._appended = Signal()
        self._acked = Signal()
        self.ack_cursor = first_seq - 1

    @property
    def pending(self) -> int:
        return len(self._items)

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    async def append(self, items: Sequence[NewItem]) -> list[int]:
        seqs: list[int] = []
        for item in items:
            while len(self._items) >= self.capacity:
                await self._acked.event.wait()
            seq = self._next_seq
            self._next_seq += 1
            self._items.append(
                Item(
                    self.name, seq, item.key, item.body, item.meta, self.clock_ms(), item.expires_ms
                )
            )
            seqs.append(seq)
            self._appended.fire()
        return seqs

    async def next_batch(self, limit: int) -> list[Item]:
        while not self._items:
            await self._appended.event.wait()
        return [self._items[i] for i in range(min(limit, len(self._items)))]

    async def ack(self, upto_seq: int) -> None:
        while self._items and self._items[0].seq <= upto_seq:
            self._items.popleft()
        self.ack_cursor = max(self.ack_cursor, upto_seq)
        self._acked.fire()
