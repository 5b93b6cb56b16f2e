# How a kept row becomes a queue message, as pure functions. The outbox item is what is written
# in the crawler's transaction; the broker message is built from it only when the drainer
# publishes, because the TTL RabbitMQ should see is "what is left" at that moment.
#
# The message id is a hash of the task and the row's canonical JSON (sorted keys), so the same row
# gets the same id in every run and on every resend: consumers can deduplicate, and duplicates
# inside one window are dropped before they are written.
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

from daemon.broker import OutgoingMessage
from daemon.outbox import Item, NewItem

_canonical = msgspec.json.Encoder(order="sorted")
_body = msgspec.json.Encoder()


def message_id(task_id: str, row: dict[str, Any]) -> str:
    digest = hashlib.sha256(task_id.encode() + b"\n" + _canonical.encode(row))
    return digest.hexdigest()[:32]


def row_items(
    task_id: str,
    run_id: str,
    offset: int,
    rows: Sequence[tuple[dict[str, Any], int]],
    now_ms: int,
    *,
    ttl_from: str,
) -> list[NewItem]:
    """Outbox items for (row, ttl_ms) pairs of one window, duplicates within it dropped.

    With `ttl_from="fixed"` the TTL is sent as it is on every publish; with "record" the item
    carries an absolute expiry and the TTL is what remains of it when published.
    """
    seen: set[str] = set()
    items = []
    for row, ttl_ms in rows:
        mid = message_id(task_id, row)
        if mid in seen:
            continue
        seen.add(mid)
        meta: dict[str, Any] = {"task_id": task_id, "run_id": run_id, "offset": offset}
        if ttl_from == "fixed":
            meta["ttl_ms"] = ttl_ms
        items.append(
            NewItem(key=mid, body=_body.encode(row), meta=meta, expires_ms=now_ms + ttl_ms)
        )
    return items


def message_headers(item: Item) -> dict[str, Any]:
    """The AMQP headers of a row's message (the same in RabbitMQ and the embedded queue)."""
    return {k: item.meta.get(k) for k in ("task_id", "run_id", "offset")}


def outgoing(item: Item, now_ms: int) -> OutgoingMessage | None:
    """The broker message for an outbox item, or None if its record already expired."""
    fixed = item.meta.get("ttl_ms")
    if fixed is not None:
        expiration = int(fixed)
    elif item.expires_ms is not None:
        expiration = item.expires_ms - now_ms
        if expiration <= 0:
            return None
    else:
        expiration = None
    return OutgoingMessage(
        body=item.body,
        message_id=item.key,
        expiration_ms=expiration,
        timestamp=item.created_ms,
        headers=message_headers(item),
    )


class ConsumedMessage(msgspec.Struct, kw_only=True):
    """One message as `/consume` returns it, from RabbitMQ or the embedded queue."""

    body: Any
    message_id: str | None
    expiration: str | None
    timestamp: int | None
    headers: dict[str, Any]
    content_type: str | None = "application/json"
    delivery_mode: int | None = 2
    redelivered: bool = False


def consumed_from_item(item: Item, now_ms: int) -> ConsumedMessage:
    remaining = None if item.expires_ms is None else max(item.expires_ms - now_ms, 0)
    return ConsumedMessage(
        body=decode_body(item.body),
        message_id=item.key,
        expiration=None if remaining is None else str(remaining),
        timestamp=item.created_ms,
        headers=message_headers(item),
    )


def decode_body(body: bytes) -> Any:
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", errors="replace")
