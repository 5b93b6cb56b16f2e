# What the tracker's store modules share: the JSON text of their TEXT columns, the two row
# helpers, and the shape of a schedule row as the ticks see it. (The tables are migration 0004's;
# the functions are daemon/tracker/store.py's and the *_store.py modules it gathers.)
from __future__ import annotations

from typing import Any

import msgspec

from daemon.store import Conn

_encode_bytes = msgspec.json.encode


def _encode(value: Any) -> str:
    """JSON text for the TEXT columns (tags, probabilities)."""
    return _encode_bytes(value).decode()


_decode_list = msgspec.json.Decoder(list[Any]).decode


def _all(conn: Conn, sql: str, bindings: tuple[Any, ...] = ()) -> list[Any]:
    return conn.execute(sql, bindings).fetchall()


def _first(conn: Conn, sql: str, bindings: tuple[Any, ...] = ()) -> Any:
    return conn.execute(sql, bindings).fetchone()


Due = tuple[int, int, str, int]
"""A schedule row as the ticks see it: (id, aid, type, planned_ms)."""
