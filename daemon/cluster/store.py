# Every statement of cluster mode: member rows, lease rows and requests for a lease's holder.
# Statements that lock several lease rows take them in name order, so two instances renewing and
# taking leases at once never deadlock.
# Each function runs inside the caller's store transaction (one `store.write`), so a heartbeat,
# the renewal of every held lease and the tries for free ones share one commit per tick.
#
# Instants come from `crawld_now_ms()`, the database's clock (a SQL function on PostgreSQL, one
# the backend registers on SQLite): instances on hosts whose clocks drift still agree on when a
# lease ran out. Leases follow River's leader table: take with INSERT … ON CONFLICT DO UPDATE
# only where the old one expired (or was this instance name's, whose earlier process is dead:
# one live process per name), and every take raises the fencing token. `check` is what a write
# made on the strength of a lease calls in its own transaction: it locks the lease row, so on
# PostgreSQL a takeover waits for that write's commit and the new holder reads after it.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daemon.store import Conn

LIVE_CLAIMANTS = "(SELECT claimant FROM cluster_members WHERE expires_ms >= crawld_now_ms())"
"""SQL for the claimants of live members: a row claimed by a claimant not in it was left by a
dead process (or one paused past its lease) and may be claimed again."""


def now_ms(conn: Conn) -> int:
    return int(conn.execute("SELECT crawld_now_ms()").fetchone()[0])


def join(
    conn: Conn,
    *,
    instance: str,
    claimant: str,
    host: str,
    pid: int,
    version: str,
    offers: str,
    lease_ms: int,
) -> int:
    """Enter (or re-enter, as a new process) the member table; return the database's now."""
    conn.execute(
        "INSERT INTO cluster_members(instance, claimant, host, pid, http, version, offers,"
        " started_ms, heartbeat_ms, expires_ms)"
        " VALUES (?1, ?2, ?3, ?4, NULL, ?5, ?6, crawld_now_ms(), crawld_now_ms(),"
        " crawld_now_ms() + ?7)"
        " ON CONFLICT (instance) DO UPDATE SET claimant = excluded.claimant,"
        " host = excluded.host, pid = excluded.pid, http = NULL, version = excluded.version,"
        " offers = excluded.offers, started_ms = excluded.started_ms,"
        " heartbeat_ms = excluded.heartbeat_ms, expires_ms = excluded.expires_ms",
        (instance, claimant, host, pid, version, offers, lease_ms),
    )
    return now_ms(conn)


def heartbeat(
    conn: Conn, instance: str, claimant: str, lease_ms: int, http: str | None, offers: str
) -> int | None:
    """Extend this process's membership: the database's time of it (epoch ms); None when its
    row is gone or another process of the name replaced it."""
    row = conn.execute(
        "UPDATE cluster_members SET heartbeat_ms = crawld_now_ms(),"
        " expires_ms = crawld_now_ms() + ?, http = ?, offers = ?"
        " WHERE instance = ? AND claimant = ? RETURNING heartbeat_ms",
        (lease_ms, http, offers, instance, claimant),
    ).fetchone()
    return None if row is None else int(row[0])


def leave(conn: Conn, instance: str, claimant: str) -> None:
    """A clean stop: the member row goes and every lease it held is free at once."""
    conn.execute(
        "UPDATE cluster_leases SET expires_ms = 0 WHERE holder = ?"
        " AND EXISTS (SELECT 1 FROM cluster_members WHERE instance = ? AND claimant = ?)",
        (instance, instance, claimant),
    )
    conn.execute(
        "DELETE FROM cluster_members WHERE instance = ? AND claimant = ?", (instance, claimant)
    )


def members(conn: Conn) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT instance, claimant, host, pid, http, version, offers, started_ms, heartbeat_ms,"
        " expires_ms, crawld_now_ms() FROM cluster_members ORDER BY instance"
    ).fetchall()
    keys = ("instance", "claimant", "host", "pid", "http", "version", "offers", "started_ms",
            "heartbeat_ms", "expires_ms", "now_ms")  # fmt: skip
    return [dict(zip(keys, row, strict=True)) for row in rows]


def forget_members(conn: Conn, older_than_ms: int) -> int:
    """Drop member rows expired for longer than `older_than_ms` (instances removed for good)."""
    conn.execute(
        "DELETE FROM cluster_members WHERE expires_ms < crawld_now_ms() - ?", (older_than_ms,)
    )
    return conn.changes()


def acquire(conn: Conn, names: Sequence[str], instance: str, lease_ms: int) -> dict[str, int]:
    """Take each named lease that is free (expired, or never held, or left by this instance
    name's earlier process); return {name: new token} of those taken."""
    rows = conn.executemany(
        "INSERT INTO cluster_leases(name, holder, token, acquired_ms, expires_ms)"
        " VALUES (?1, ?2, 1, crawld_now_ms(), crawld_now_ms() + ?3)"
        " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
        " token = cluster_leases.token + 1, acquired_ms = excluded.acquired_ms,"
        " expires_ms = excluded.expires_ms"
        " WHERE cluster_leases.expires_ms < crawld_now_ms()"
        " OR cluster_leases.holder = excluded.holder"
        " RETURNING name, token",
        [(name, instance, lease_ms) for name in sorted(names)],
    )
    return {name: int(token) for name, token in rows}


def expires_in(conn: Conn, names: Sequence[str]) -> int | None:
    """Milliseconds (database clock) until the first of `names` runs out; None: none held."""
    rows = conn.executemany(
        "SELECT expires_ms - crawld_now_ms() FROM cluster_leases WHERE name = ?",
        [(name,) for name in names],
    )
    left = [int(ms) for (ms,) in rows]
    return min(left) if left else None


def renew(conn: Conn, held: Sequence[tuple[str, int]], lease_ms: int) -> list[str]:
    """Extend held leases whose token is unchanged; return the names renewed (a missing one was
    taken by another instance: its token moved on)."""
    rows = conn.executemany(
        "UPDATE cluster_leases SET expires_ms = crawld_now_ms() + ?"
        " WHERE name = ? AND token = ? RETURNING name",
        [(lease_ms, name, token) for name, token in sorted(held)],
    )
    return [name for (name,) in rows]


def release(conn: Conn, name: str, token: int) -> None:
    """Give a lease back: free at once for any instance (the token stays, the next take raises
    it)."""
    conn.execute(
        "UPDATE cluster_leases SET expires_ms = 0 WHERE name = ? AND token = ?", (name, token)
    )


def check(conn: Conn, name: str, token: int) -> bool:
    """Whether the lease still has this token, locking its row for the rest of the transaction
    (see the module comment)."""
    conn.execute(
        "UPDATE cluster_leases SET token = token WHERE name = ? AND token = ?", (name, token)
    )
    return conn.changes() == 1


def leases(conn: Conn, prefix: str = "") -> list[dict[str, Any]]:
    """Every lease row (of names starting with `prefix`), with whether it is held now."""
    rows = conn.execute(
        "SELECT name, holder, token, acquired_ms, expires_ms, crawld_now_ms()"
        " FROM cluster_leases WHERE name >= ? AND name < ? ORDER BY name",
        (prefix, prefix + "\uffff"),
    ).fetchall()
    return [
        {
            "name": name,
            "holder": holder,
            "token": token,
            "acquired_ms": acquired,
            "expires_ms": expires,
            "held": expires >= now,
        }
        for name, holder, token, acquired, expires, now in rows
    ]


def holder(conn: Conn, name: str) -> str | None:
    """The instance holding a lease now, if any."""
    row = conn.execute(
        "SELECT holder FROM cluster_leases WHERE name = ? AND expires_ms >= crawld_now_ms()",
        (name,),
    ).fetchone()
    return None if row is None else str(row[0])


def drop_leases(conn: Conn, prefix: str) -> int:
    """Delete free lease rows of `prefix` (a finished job's drainer, a deleted task)."""
    conn.execute(
        "DELETE FROM cluster_leases WHERE name >= ? AND name < ? AND expires_ms < crawld_now_ms()",
        (prefix, prefix + "\uffff"),
    )
    return conn.changes()


def post_request(conn: Conn, lease: str, action: str, body: str, from_instance: str) -> int:
    """Leave a request for whoever holds (or next takes) `lease`."""
    (rid,) = conn.execute(
        "INSERT INTO cluster_requests(lease, action, body, from_instance, created_ms)"
        " VALUES (?, ?, ?, ?, crawld_now_ms()) RETURNING id",
        (lease, action, body, from_instance),
    ).fetchone()
    return int(rid)


def has_requests(conn: Conn, lease: str) -> bool:
    """Whether a request waits for `lease` (a read: the holder's poll costs no write)."""
    row = conn.execute("SELECT 1 FROM cluster_requests WHERE lease = ? LIMIT 1", (lease,))
    return row.fetchone() is not None


def take_requests(conn: Conn, lease: str, token: int) -> list[tuple[int, str, str, str]]:
    """The requests waiting for `lease`, deleted as they are handed over, only while the lease
    still has `token`: (id, action, body, from_instance) in the order they were made."""
    if not check(conn, lease, token):
        return []
    rows = conn.execute(
        "DELETE FROM cluster_requests WHERE lease = ? RETURNING id, action, body, from_instance",
        (lease,),
    ).fetchall()
    return sorted((int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows)
