# The publish frames daemon.broker.frames builds must be pamqp's, byte for byte, for every
# property set (and fail where pamqp fails): RabbitMQ reads them, and a wrong byte is a lost
# connection or a corrupted message.
from __future__ import annotations

import datetime
from typing import Any

import pytest
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from daemon.broker import OutgoingMessage, frames, message_properties
from daemon.broker.frames import Properties

AT = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)

PROPERTY_SETS: list[dict[str, Any]] = [
    {},
    {"content_type": "application/json", "delivery_mode": 2},
    {"content_type": "", "message_id": "é" * 100, "app_id": "crawld"},
    {"headers": {"task_id": "t", "run_id": "r" * 32, "offset": 0}},
    {"headers": {"b": True, "a": 1, "n": None, "big": 2**40, "neg": -40000, "u": 60000}},
    {"headers": {"flag": False, "one": 1}},
    {"headers": {"f": 1.5, "nested": {"x": [1, "y"]}, "when": AT}},
    {"headers": {}},
    {"timestamp": AT, "expiration": "86400000", "priority": 9, "correlation_id": "c"},
    {"timestamp": datetime.datetime(2026, 1, 2, 3, 4, 5), "reply_to": "q", "user_id": "guest"},
    {"message_type": "row", "cluster_id": "", "content_encoding": "gzip"},
    {"delivery_mode": 1, "priority": 0},
    {"headers": {"k" * 200: "long key"}},
]


@pytest.mark.parametrize("values", PROPERTY_SETS)
@pytest.mark.parametrize("channel", [1, 7])
def test_content_header_is_pamqps(values: dict[str, Any], channel: int) -> None:
    props = Properties(**values)
    for size in (0, 200, 2**33):
        expected = pamqp_frame.marshal(ContentHeader(0, size, props), channel)
        assert frames.content_header(channel, size, props) == expected
        # again: cached tables and timestamps give the same bytes
        assert frames.content_header(channel, size, props) == expected


def test_true_and_one_are_different_tables() -> None:
    one = frames.content_header(1, 1, Properties(headers={"x": 1}))
    true = frames.content_header(1, 1, Properties(headers={"x": True}))
    assert one != true
    assert true == pamqp_frame.marshal(ContentHeader(0, 1, Properties(headers={"x": True})), 1)


def test_the_collectors_messages() -> None:
    message = OutgoingMessage(
        body=b'{"row": 1}',
        message_id="a" * 32,
        expiration_ms=60_000,
        timestamp=1_767_000_000_123,
        headers={"task_id": "jobs", "run_id": "r1", "offset": 1000},
    )
    props = message_properties(message)
    expected = pamqp_frame.marshal(ContentHeader(0, len(message.body), props), 3)
    assert frames.content_header(3, len(message.body), props) == expected


@pytest.mark.parametrize("body", [b"", b"x", bytes(range(256)) * 10])
def test_content_body_is_pamqps(body: bytes) -> None:
    assert frames.content_body(5, body) == pamqp_frame.marshal(ContentBody(body), 5)


@pytest.mark.parametrize(
    "values",
    [
        {"message_id": "x" * 256},
        {"app_id": "é" * 128},
        {"headers": {"x": object()}},
        {"delivery_mode": 256},
    ],
)
def test_refuses_what_pamqp_refuses(values: dict[str, Any]) -> None:
    props = Properties.__new__(Properties)  # no validate(): the encoder alone must refuse
    for name in Properties.__slots__:
        setattr(props, name, values.get(name))
    with pytest.raises(Exception) as pamqps:
        pamqp_frame.marshal(ContentHeader(0, 1, props), 1)
    with pytest.raises(type(pamqps.value)):
        frames.content_header(1, 1, props)
