# The webhook event model. A body is encoded once, when the event is numbered and stored, and
# those exact bytes are what every attempt sends and signs: a receiver deduplicates on
# `webhookId`/`eventId` and verifies signatures over raw bytes, so re-encoding on retry would be
# a bug. The body keeps Firecrawl v2's key order (success, type, id, webhookId, data, error?,
# metadata) with our `eventId` and `seq` added before `data`; msgspec encodes Struct fields in
# declaration order, which pins the order without hand-built JSON.
#
# Filtering follows the newer Firecrawl code: an entry matches the full type (`crawl.page`), the
# subtype (`page`) or a dotted suffix; an empty or missing list means every event. A filtered-out
# event takes no seq (numbers stay contiguous for the receiver), but a terminal event still ends
# the job's stream whether or not it is sent.
#
# Each kind has Firecrawl's own event names: crawls, batches and extracts `started`, `page`,
# `completed`, `failed` (a cancel ends them with `failed`, error "cancelled"); agents `started`,
# `action`, and one of `completed`, `failed`, `cancelled` (success false, no error).
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import msgspec

EventName = Literal["started", "page", "action", "completed", "failed", "cancelled"]

EVENT_NAMES: tuple[EventName, ...] = ("started", "page", "completed", "failed")
"""The events of crawl, batch and extract jobs."""
KIND_EVENTS: dict[str, tuple[EventName, ...]] = {
    "agent": ("started", "action", "completed", "failed", "cancelled"),
}
"""Kinds whose events differ from EVENT_NAMES."""
OWN_CANCEL: frozenset[str] = frozenset(
    k for k, names in KIND_EVENTS.items() if "cancelled" in names
)
"""Kinds that end a cancelled job with their own `cancelled` event."""
TERMINAL_NAMES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
CANCELLED_ERROR = "cancelled"
CANCELLED_BY_USER = "cancelled by a user (DELETE /v2/crawl/{id})"
"""The stored error of a job a user cancelled (its webhook still says `CANCELLED_ERROR`)."""
WEBHOOK_FAILED = "WEBHOOK_FAILED"
"""The job error code of an undelivered event (with `undelivered_error` as its text)."""


class WebhookBody(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event as it goes on the wire; field order is the JSON key order."""

    success: bool
    type: str
    id: str
    webhookId: str
    eventId: str
    seq: int
    data: list[Any]
    error: str | None = None
    metadata: dict[str, str]

    @property
    def name(self) -> str:
        return event_name(self.type)

    @property
    def terminal(self) -> bool:
        return self.name in TERMINAL_NAMES


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(WebhookBody)


def event_names(kind: str) -> tuple[EventName, ...]:
    """The events a job of `kind` issues."""
    return KIND_EVENTS.get(kind, EVENT_NAMES)


MONITOR_TYPES = {"completed": "monitor.check.completed", "failed": "monitor.check.completed"}
"""A monitor check's one terminal event is Firecrawl's `monitor.check.completed` (success false
when the check failed or was partial)."""


def event_type(kind: str, name: str) -> str:
    """`crawl` + `page` → `crawl.page` (a monitor check's terminal: `monitor.check.completed`)."""
    names = event_names(kind)
    if name not in names:
        raise ValueError(f"unknown webhook event {name!r}; expected one of {names}")
    if not kind or "." in kind:
        raise ValueError(f"invalid job kind {kind!r}")
    if kind == "monitor" and name in MONITOR_TYPES:
        return MONITOR_TYPES[name]
    return f"{kind}.{name}"


def event_name(type_: str) -> str:
    """`crawl.page` → `page` (the part after the last dot)."""
    return type_.rsplit(".", 1)[-1]


def event_id(job_id: str, seq: int) -> str:
    return f"{job_id}:{seq}"


def is_terminal(name_or_type: str) -> bool:
    return event_name(name_or_type) in TERMINAL_NAMES


def wants(events: Sequence[str] | None, type_: str) -> bool:
    """Whether a webhook whose `events` filter is `events` receives an event of `type_`."""
    if not events:
        return True
    return any(f == type_ or type_.endswith("." + f) for f in events)


def terminal_for_status(
    status: str, reason: str | None = None, kind: str = "crawl"
) -> tuple[EventName, str | None]:
    """The one terminal event (name, error) for a finished job's status.

    `completed` → (`completed`, None); `failed` → (`failed`, reason); `cancelled` →
    (`failed`, "cancelled"), or (`cancelled`, None) for a kind with its own cancel event.
    """
    if status == "completed":
        return "completed", None
    if status == "failed":
        return "failed", reason or "failed"
    if status == "cancelled":
        if kind in OWN_CANCEL:
            return "cancelled", None
        return "failed", CANCELLED_ERROR
    raise ValueError(f"job status {status!r} is not terminal")


def build_body(
    *,
    kind: str,
    name: str,
    job_id: str,
    seq: int,
    webhook_id: str,
    data: Iterable[Any] = (),
    error: str | None = None,
    metadata: dict[str, str] | None = None,
) -> WebhookBody:
    """An event body. `failed` needs an error; `page` may carry one (Firecrawl's failed page,
    success false); `started`, `action` and `completed` may not; `cancelled` is success false
    without one."""
    type_ = event_type(kind, name)
    if seq < 1:
        raise ValueError(f"seq counts from 1, got {seq}")
    if name == "failed" and not error:
        raise ValueError("a failed event needs an error message")
    if error is not None and name in ("started", "action", "completed"):
        raise ValueError(f"a {name} event cannot carry an error")
    return WebhookBody(
        success=error is None and name != "cancelled",
        type=type_,
        id=job_id,
        webhookId=webhook_id,
        eventId=event_id(job_id, seq),
        seq=seq,
        data=list(data),
        error=error,
        metadata=dict(metadata or {}),
    )


def undelivered_error(event_id_: str, type_: str, reason: str) -> str:
    """The job error text for an event that reached a final outcome without being delivered."""
    return f"webhook event {event_id_} ({type_}) was not delivered: {reason}"


def encode_body(body: WebhookBody) -> bytes:
    """Compact JSON in the wire key order; `error` only when set."""
    return _encoder.encode(body)


def decode_body(raw: bytes) -> WebhookBody:
    """Parse stored or received body bytes; msgspec.DecodeError/ValidationError if malformed."""
    return _decoder.decode(raw)


def gone_error(event_id_: str, type_: str, skipped: int) -> str:
    """The one job error of a job whose webhook endpoint answered 410 Gone."""
    later = "1 later event" if skipped == 1 else f"{skipped} later events"
    return (
        f"webhook endpoint gone at eventId {event_id_} ({type_}: HTTP 410 Gone); {later} not sent"
    )


class TerminalAlreadyIssued(Exception):
    """An event was issued for a job whose terminal event has already been issued."""


class Sequencer(msgspec.Struct):
    """Numbering for one job's events: contiguous seqs for the events the webhook wants, and
    nothing after the terminal event. The caller holds its lock around `issue` and the enqueue,
    and restores `last_seq` (and `terminated`) from the store after a restart."""

    kind: str
    events: list[str] = []
    last_seq: int = 0
    terminated: bool = False

    def issue(self, name: str) -> int | None:
        """The seq for event `name`, or None when the filter drops it."""
        type_ = event_type(self.kind, name)
        if self.terminated:
            raise TerminalAlreadyIssued(f"{type_} after the job's terminal event")
        if name in TERMINAL_NAMES:
            self.terminated = True
        if not wants(self.events, type_):
            return None
        self.last_seq += 1
        return self.last_seq
