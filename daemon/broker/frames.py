# The frames of one publish, byte for byte what pamqp marshals, without pamqp's per-message work.
#
# Profiling the collector bench put about half of the daemon's CPU per published row in
# `pamqp.frame.marshal(ContentHeader(...))`: for every message it walks all 14 property slots
# through generic, type-dispatched encoders and encodes the headers table from scratch. Here the
# property slots are walked once per message with each slot's encoder resolved up front, strings
# are encoded inline, and the headers table (a window's rows share task, run and offset) is
# encoded by pamqp once per distinct table and then reused. Every other property type goes
# through pamqp's own encoder, so the bytes (and the errors: TypeError, struct.error) are
# pamqp's; tests/test_broker_frames.py compares both over a table of property sets.
from __future__ import annotations

import datetime
import functools
import operator
import struct
from collections.abc import Callable
from typing import Any

from pamqp import commands, constants
from pamqp import encode as pamqp_encode

Properties = commands.Basic.Properties

_FRAME_HEAD = struct.Struct(">BHI")
_HEADER_HEAD = struct.Struct(">HxxQ")
_FRAME_END = constants.FRAME_END_CHAR
_CLASS_ID = commands.Basic.frame_id
_TABLE_TYPES = frozenset((str, int, type(None)))
"""Header value types whose encoded table may be cached: hashable, and no two of them equal
unless they encode the same (True == 1 and 1.0 == 1, so bool and float are not among them)."""


def _short_string(value: Any) -> bytes:
    if type(value) is not str:
        return pamqp_encode.short_string(value)  # raises pamqp's TypeError
    raw = value.encode("utf-8")
    if len(raw) > 255:
        return pamqp_encode.short_string(value)
    return bytes((len(raw),)) + raw


@functools.lru_cache(maxsize=256)
def _cached_table(key: tuple[tuple[Any, Any], ...]) -> bytes:
    return pamqp_encode.field_table(dict(key))


def _table(value: Any) -> bytes:
    if type(value) is dict and all(type(v) in _TABLE_TYPES for v in value.values()):
        try:
            return _cached_table(tuple(value.items()))
        except TypeError:  # an unhashable key: pamqp says what is wrong
            pass
    return pamqp_encode.field_table(value)


@functools.lru_cache(maxsize=256)
def _cached_timestamp(value: datetime.datetime) -> bytes:
    return pamqp_encode.timestamp(value)


def _timestamp(value: Any) -> bytes:
    if type(value) is datetime.datetime:
        return _cached_timestamp(value)
    return pamqp_encode.timestamp(value)


_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "shortstr": _short_string,
    "octet": pamqp_encode.octet,
    "table": _table,
    "timestamp": _timestamp,
}

_SLOTS: tuple[tuple[int, Callable[[Any], bytes]], ...] = tuple(
    (
        Properties.flags[name],
        _ENCODERS.get(getattr(Properties, "_" + name))
        or functools.partial(pamqp_encode.by_type, data_type=getattr(Properties, "_" + name)),
    )
    for name in Properties.__slots__
)
_values = operator.attrgetter(*Properties.__slots__)


def properties_payload(props: Properties) -> bytes:
    """`props.marshal()`: the property flags, then each property that is set, in slot order."""
    flags = 0
    parts = [b""]
    for (flag, encode), value in zip(_SLOTS, _values(props), strict=True):
        if value is None or value == "":
            continue
        flags |= flag
        parts.append(encode(value))
    parts[0] = flags.to_bytes(2, "big")  # every flag is below 2**16: one flag word
    return b"".join(parts)


def _frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + _FRAME_END


def content_header(channel: int, body_size: int, props: Properties) -> bytes:
    """`pamqp.frame.marshal(ContentHeader(0, body_size, props), channel)`."""
    payload = _HEADER_HEAD.pack(_CLASS_ID, body_size) + properties_payload(props)
    return _frame(constants.FRAME_HEADER, channel, payload)


def content_body(channel: int, body: bytes) -> bytes:
    """`pamqp.frame.marshal(ContentBody(body), channel)` (one frame: the caller splits bodies
    longer than the frame size)."""
    return _frame(constants.FRAME_BODY, channel, body)
