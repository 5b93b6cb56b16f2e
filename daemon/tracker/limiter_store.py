# The network delegate's limiter state in `tracker_limiter` (migration 0004), as plain functions
# over an APSW connection run inside the store's transactions.
#
# Stored TATs are only trusted after a clean shutdown: the final save writes a marker row, and
# taking the state at start deletes it in the same transaction. After a crash (no marker) the
# rows are older than the requests the dead process made after its last save, so the delegate
# starts every window conservatively instead. Periodic saves keep the rows fresh for `/status`
# readers and for a shutdown that cannot save at the end.
from __future__ import annotations

from daemon.store import Conn

CLEAN_PROXY = ""
"""The marker row's proxy: no configured proxy can have an empty name."""
CLEAN_KEY = "clean-shutdown"

State = dict[tuple[str, str], int]
"""TAT in epoch ms by (proxy name, window key)."""


def take_state(conn: Conn) -> tuple[State, bool]:
    """The stored TATs and whether the last process saved them at a clean shutdown; the marker
    is removed so a crash of this process is not mistaken for a clean stop."""
    state: State = {}
    clean = False
    for proxy, key, tat_ms in conn.execute("SELECT proxy, limit_key, tat_ms FROM tracker_limiter"):
        if (proxy, key) == (CLEAN_PROXY, CLEAN_KEY):
            clean = True
        else:
            state[(proxy, key)] = tat_ms
    conn.execute(
        "DELETE FROM tracker_limiter WHERE proxy = ? AND limit_key = ?", (CLEAN_PROXY, CLEAN_KEY)
    )
    return state, clean


def save_state(conn: Conn, state: State, *, clean: bool, now_ms: int) -> None:
    """Replace the stored TATs; with `clean`, mark them as saved at a clean shutdown."""
    conn.execute("DELETE FROM tracker_limiter")
    conn.executemany(
        "INSERT INTO tracker_limiter (proxy, limit_key, tat_ms) VALUES (?, ?, ?)",
        [(proxy, key, tat) for (proxy, key), tat in state.items()],
    )
    if clean:
        conn.execute(
            "INSERT INTO tracker_limiter (proxy, limit_key, tat_ms) VALUES (?, ?, ?)",
            (CLEAN_PROXY, CLEAN_KEY, now_ms),
        )
