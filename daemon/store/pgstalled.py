# Ending a paused process's transaction that holds up this one's writer.
#
# Why this exists: a cluster member paused in the middle of a transaction (SIGSTOP, a VM frozen,
# a debugger) keeps its row locks, and every other member's writer waits behind them, heartbeats
# and lease renewals included, so the whole cluster stops while the paused one holds nothing it
# could still use (its leases run out). The writer's `idle_in_transaction_session_timeout` (a
# third of the lease) ends most such transactions on the server's side, not all of them: a client
# stopped between the messages of one extended-protocol exchange (the statement sent, its Sync
# not yet) leaves its session `active` and waiting on the client, where no server timeout
# applies. That was seen holding a tracker limiter row for a minute, and so was one reported
# `idle in transaction` well past the timeout.
#
# So a writer kept busy longer than that timeout asks the server who blocks it, and ends the
# blockers that are crawld sessions of the same schema waiting on their own client for longer
# than the timeout: exactly what the server's timeout would have ended, had it applied. Sessions
# of other programs are never touched. The paused process finds its connection gone when it
# wakes: its writer reconnects and runs the group again, and its fenced writes find their leases
# taken. The query is pure SQL on a connection of the reader pool (`end_stalled`); the loop
# that decides when to ask is `guard`.
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from daemon.logs import get_logger

log = get_logger("store")

STALLED_BLOCKERS = (
    "SELECT b.pid, b.state,"
    " (extract(epoch FROM now() - b.state_change) * 1000)::bigint,"
    " pg_terminate_backend(b.pid)"
    " FROM pg_stat_activity AS b"
    " WHERE b.pid = ANY (pg_blocking_pids($1::integer))"
    " AND b.application_name = $2"
    " AND b.wait_event_type = 'Client' AND b.wait_event = 'ClientRead'"
    " AND b.xact_start IS NOT NULL"
    " AND b.state_change < now() - $3 * interval '1 millisecond'"
)
"""Blockers of the writer `$1` that are sessions named `$2` waiting on their client inside a
transaction for more than `$3` ms, each ended (pg_terminate_backend runs only for rows that
pass the WHERE)."""


@dataclass(frozen=True, slots=True)
class Stalled:
    pid: int
    """The server pid of the session that was ended."""
    state: str
    """What pg_stat_activity said it was doing (`active`, `idle in transaction`)."""
    waited_ms: int
    """How long it had waited on its client."""
    ended: bool
    """Whether pg_terminate_backend signalled it (False: not allowed, or already gone)."""


def end_stalled(conn: Any, writer_pid: int, application_name: str, after_ms: int) -> list[Stalled]:
    """End the stalled blockers of `writer_pid` (see the module comment); `conn`: an
    autocommit psycopg connection with `$N` placeholders (a RawCursor)."""
    rows = conn.execute(STALLED_BLOCKERS, (writer_pid, application_name, after_ms)).fetchall()
    return [
        Stalled(int(pid), str(state), int(waited), bool(ended))
        for pid, state, waited, ended in rows
    ]


async def guard(
    busy_since: Callable[[], float | None],
    end: Callable[[], list[Stalled]],
    after_ms: int,
    unreachable: tuple[type[BaseException], ...],
) -> None:
    """Until cancelled: whenever the writer's current group has run longer than `after_ms`
    (`busy_since`: its `time.monotonic()` start, None when idle), call `end` in a worker thread
    (again every half of `after_ms` while it stays busy) and log what it ended. An error of
    `end` is logged and the guard carries on: at debug level when it is one of `unreachable`
    (the writer reports an unreachable server itself), as a warning otherwise."""
    after = after_ms / 1000
    while True:
        started = busy_since()
        now = time.monotonic()
        if started is None or now - started < after:
            await trio.sleep(after / 2 if started is None else started + after - now)
            continue
        try:
            ended = await trio.to_thread.run_sync(end, abandon_on_cancel=True)
        except Exception as exc:
            report = log.debug if isinstance(exc, unreachable) else log.warning
            report("could not look for stalled blockers", error=f"{type(exc).__name__}: {exc}")
            ended = []
        for stalled in ended:
            log.warning(
                "ended another crawld session's transaction that held this writer up while"
                " waiting on its paused client",
                pid=stalled.pid,
                state=stalled.state,
                waited_ms=stalled.waited_ms,
                ended=stalled.ended,
            )
        await trio.sleep(after / 2)
