# The LISTEN side of wake-ups on PostgreSQL (daemon/store/wake.py says what they are for).
#
# Why this shape: one connection per process, of its own (a pooled or writer connection would
# have to stop listening to run queries), listening to ONE channel per schema (instances of
# other schemas on the same server hear nothing of this one); the payload names the wake-up.
# The trio task waits for the socket to become readable and reads with libpq's non-blocking
# calls, so no thread is parked on it; only connecting runs in a thread. Its own process's
# notifications (sent by its writer) are skipped: the store fired them locally already.
# When the connection breaks (a network cut, a server restart) every waiter is woken at once,
# again once it is back (notifications sent meanwhile are lost), and it reconnects with backoff;
# TCP keepalives find a peer that vanished without closing the connection.
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from daemon.logs import get_logger
from daemon.store.errors import StoreUnavailable
from daemon.store.wake import Wakeups

log = get_logger("store")

KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
"""A silently dead LISTEN connection is noticed within about 25 s (the safety poll covers that
time)."""


def channel_for(schema: str) -> str:
    """The schema's notification channel (an identifier of at most 63 bytes, whatever the schema
    is called)."""
    return "crawld_" + hashlib.blake2b(schema.encode(), digest_size=8).hexdigest()


def send(channel: str) -> Callable[[Any, str], None]:
    """What the writer calls inside a transaction to send `payload` on `channel` at commit."""

    def sender(conn: Any, payload: str) -> None:
        conn.raw.execute("SELECT pg_notify($1, $2)", (channel, payload))

    return sender


async def listen(
    connect: Callable[[], psycopg.Connection[Any]],
    channel: str,
    wakeups: Wakeups,
    own_pid: Callable[[], int | None],
    *,
    reconnect_max: float = 10.0,
) -> None:
    """Deliver other processes' notifications on `channel` to `wakeups` until cancelled.

    `connect` opens a connection (blocking, in a thread); `own_pid` is this process's writer's
    server pid (its notifications are skipped)."""
    delay = 0.05
    while True:
        try:
            conn = await trio.to_thread.run_sync(
                _listening, connect, channel, abandon_on_cancel=True
            )
        except (psycopg.Error, StoreUnavailable) as exc:
            log.warning("postgres: LISTEN connection failed", error=str(exc), retry_in_s=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, reconnect_max)
            continue
        delay = 0.05
        wakeups.set_listening(True)
        try:
            await _pump(conn, wakeups, own_pid)
        except psycopg.Error as exc:
            log.warning("postgres: LISTEN connection lost; reconnecting", error=str(exc))
        finally:
            wakeups.set_listening(False)
            with contextlib.suppress(Exception):
                trio.lowlevel.notify_closing(conn.pgconn.socket)
            with contextlib.suppress(Exception):
                conn.close()


def _listening(connect: Callable[[], psycopg.Connection[Any]], channel: str) -> Any:
    conn = connect()
    try:
        conn.execute(f'LISTEN "{channel}"')
    except BaseException:
        conn.close()
        raise
    return conn


async def _pump(conn: Any, wakeups: Wakeups, own_pid: Callable[[], int | None]) -> None:
    pgconn = conn.pgconn
    fd = pgconn.socket
    while True:
        await trio.lowlevel.wait_readable(fd)
        pgconn.consume_input()  # non-blocking; raises once the connection is gone
        mine = own_pid()
        while (note := pgconn.notifies()) is not None:
            if note.be_pid != mine:
                wakeups.received(note.extra.decode())
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            raise psycopg.OperationalError("the LISTEN connection is closed")
