# The network delegate's limiter state in `tracker_limiter` (migration 0004), as plain functions
# run inside the store's transactions. Two kinds of rows:
#
# - Saved windows of a process's own limiters (every proxy on one instance; `direct` proxies in
#   a cluster, whose egress is each instance's own address), under `prefix` + proxy name (the
#   prefix is "<instance>/" in a cluster, "" alone). Stored TATs are only trusted after a clean
#   shutdown: the final save writes a marker row, and taking the state at start deletes it in
#   the same transaction. After a crash (no marker) the rows are older than the requests the
#   dead process made after its last save, so the delegate starts every window conservatively.
# - Live windows of a named proxy (http, socks5, relay) shared by the instances of a cluster,
#   under the bare proxy name (instance names cannot be empty, so the two never meet): each
#   request reserves its slot here, in one transaction that locks the proxy's rows (in key
#   order, so two reservations never deadlock), takes the database's clock, applies the pure
#   GCRA rule (daemon.net.ratelimit) and writes the new TATs. The rows are always current, so a
#   crash loses nothing. TATs are stored as epoch ms rounded up: each step can only be stricter.
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from daemon.net.ratelimit import Window, conforming_within, earliest_conforming, reserve_all
from daemon.store import Conn

CLEAN_PROXY = ""
"""The marker row's proxy: no configured proxy can have an empty name."""
CLEAN_KEY = "clean-shutdown"

State = dict[tuple[str, str], int]
"""TAT in epoch ms by (proxy name, window key)."""


_OWN = "substr(proxy, 1, CAST(?2 AS INTEGER)) = ?1"
"""Rows saved under a prefix (every row when it is empty)."""


def take_state(conn: Conn, prefix: str = "") -> tuple[State, bool]:
    """The TATs saved under `prefix` (by proxy name) and whether the last process saved them at
    a clean shutdown; the marker is removed so a crash of this process is not mistaken for a
    clean stop."""
    state: State = {}
    clean = False
    for proxy, key, tat_ms in conn.execute(
        f"SELECT proxy, limit_key, tat_ms FROM tracker_limiter WHERE {_OWN}",
        (prefix, len(prefix)),
    ):
        name = proxy[len(prefix) :]
        if (name, key) == (CLEAN_PROXY, CLEAN_KEY):
            clean = True
        else:
            state[(name, key)] = tat_ms
    conn.execute(
        "DELETE FROM tracker_limiter WHERE proxy = ? AND limit_key = ?",
        (prefix + CLEAN_PROXY, CLEAN_KEY),
    )
    return state, clean


def save_state(conn: Conn, state: State, *, clean: bool, now_ms: int, prefix: str = "") -> None:
    """Replace the TATs saved under `prefix`; with `clean`, mark them as saved at a clean
    shutdown."""
    conn.execute(f"DELETE FROM tracker_limiter WHERE {_OWN}", (prefix, len(prefix)))
    rows = [(prefix + proxy, key, tat) for (proxy, key), tat in state.items()]
    if clean:
        rows.append((prefix + CLEAN_PROXY, CLEAN_KEY, now_ms))
    conn.executemany(
        "INSERT INTO tracker_limiter (proxy, limit_key, tat_ms) VALUES (?, ?, ?)", rows
    )


class Reservation(NamedTuple):
    granted: bool
    now_ms: int
    """The instant it was decided at (the database's clock unless one was given)."""
    at_ms: int
    """Granted: `now_ms`; denied: the first ms a request would conform to every window."""
    tats_ms: dict[str, int]
    """Each window's TAT (epoch ms) after the call."""


def _lock(
    conn: Conn, proxy: str, windows: Sequence[tuple[str, Window]], now_ms: int | None
) -> tuple[dict[str, int], int]:
    """Lock the proxy's rows (a missing one starts conservatively: its burst spent now); return
    their TATs and the instant after the last lock."""
    rows = conn.executemany(
        "INSERT INTO tracker_limiter (proxy, limit_key, tat_ms)"
        " VALUES (?1, ?2, coalesce(?3, crawld_now_ms()) + ?4)"
        " ON CONFLICT (proxy, limit_key) DO UPDATE SET tat_ms = tracker_limiter.tat_ms"
        " RETURNING limit_key, tat_ms, coalesce(?3, crawld_now_ms())",
        [(proxy, key, now_ms, window.per_ms) for key, window in windows],
    )
    tats, now = {}, 0
    for key, tat, at in rows:
        tats[key] = int(tat)
        now = max(now, int(at))
    return tats, now


def _now(conn: Conn, now_ms: int | None) -> int:
    if now_ms is not None:
        return now_ms
    return int(conn.execute("SELECT crawld_now_ms()").fetchone()[0])


def reserve(
    conn: Conn,
    proxy: str,
    windows: Sequence[tuple[str, Window]],
    *,
    margin_ms: int = 0,
    now_ms: int | None = None,
    exhaust: bool = False,
) -> Reservation:
    """Reserve one request through a shared proxy in every one of `windows` (key, window), or
    nothing (see the module comment). With `exhaust`, first count every window as fully spent
    now (upstream refused a request for its rate)."""
    ordered = sorted(windows)
    tats_ms, now = _lock(conn, proxy, ordered, now_ms)
    if not ordered:
        now = _now(conn, now_ms)
    if exhaust:
        _spend(tats_ms, ordered, now)
    tats = [window.scaled(tats_ms[key]) for key, window in ordered]
    plain = [window for _, window in ordered]
    reserved = reserve_all(tats, now, plain, margin_ms)
    if reserved is None:
        at = earliest_conforming(tats, now, plain, margin_ms)
    else:
        at = now
        tats_ms.update(
            (key, window.to_ms(tat)) for (key, window), tat in zip(ordered, reserved, strict=True)
        )
    if reserved is not None or exhaust:
        _store(conn, proxy, ordered, tats_ms)
    return Reservation(reserved is not None, now, at, tats_ms)


def _store(
    conn: Conn, proxy: str, ordered: Sequence[tuple[str, Window]], tats_ms: dict[str, int]
) -> None:
    conn.executemany(
        "UPDATE tracker_limiter SET tat_ms = ? WHERE proxy = ? AND limit_key = ?",
        [(tats_ms[key], proxy, key) for key, _ in ordered],
    )


def _spend(tats_ms: dict[str, int], ordered: Sequence[tuple[str, Window]], now: int) -> None:
    for key, window in ordered:
        tats_ms[key] = max(tats_ms[key], now + window.per_ms)


def exhaust(
    conn: Conn, proxy: str, windows: Sequence[tuple[str, Window]], *, now_ms: int | None = None
) -> dict[str, int]:
    """Count every one of a shared proxy's `windows` as fully spent now (upstream refused a
    request for its rate) without reserving a request; returns each window's TAT after it."""
    ordered = sorted(windows)
    tats_ms, now = _lock(conn, proxy, ordered, now_ms)
    _spend(tats_ms, ordered, now)
    _store(conn, proxy, ordered, tats_ms)
    return tats_ms


def room(
    conn: Conn,
    proxy: str,
    windows: Sequence[tuple[str, Window]],
    horizon_ms: int,
    limit: int,
    *,
    margin_ms: int = 0,
    now_ms: int | None = None,
    create: bool = False,
) -> int | None:
    """How many requests through a shared proxy (at most `limit`) its stored windows let
    through before now + `horizon_ms`, on the database's clock unless `now_ms` is given.
    Reserves nothing. A window without a row starts as `reserve` starts it (its burst spent
    now), which must be stored to count from: None unless `create` (in a write transaction)
    stores the missing rows."""
    if create:
        _lock(conn, proxy, sorted(windows), now_ms)
    now = _now(conn, now_ms)
    stored = dict(
        conn.execute(
            "SELECT limit_key, tat_ms FROM tracker_limiter WHERE proxy = ?", (proxy,)
        ).fetchall()
    )
    if any(key not in stored for key, _ in windows):
        return None
    tats = [window.scaled(int(stored[key])) for key, window in windows]
    return conforming_within(
        tats, now, [window for _, window in windows], horizon_ms, limit, margin_ms
    )
