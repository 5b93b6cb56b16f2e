from __future__ import annotations

import msgspec
import pytest

from daemon.jobs.events import (
    Sequencer,
    TerminalAlreadyIssued,
    build_body,
    decode_body,
    encode_body,
    event_id,
    event_name,
    event_type,
    is_terminal,
    terminal_for_status,
    undelivered_error,
    wants,
)

JOB = "0b9e1c3a-7d4f-4a57-9f0e-2f1d2c3b4a59"
HOOK = "6f1c2a5e-8b9d-4c3e-a1f2-3b4c5d6e7f80"


def test_page_body_bytes_and_key_order() -> None:
    body = build_body(
        kind="crawl",
        name="page",
        job_id=JOB,
        seq=3,
        webhook_id=HOOK,
        data=[{"url": "https://a.example/", "n": 1}],
        metadata={"team": "x"},
    )
    assert encode_body(body) == (
        b'{"success":true,"type":"crawl.page","id":"' + JOB.encode() + b'",'
        b'"webhookId":"' + HOOK.encode() + b'","eventId":"' + JOB.encode() + b':3",'
        b'"seq":3,"data":[{"url":"https://a.example/","n":1}],"metadata":{"team":"x"}}'
    )


def test_failed_body_puts_error_before_metadata() -> None:
    body = build_body(
        kind="crawl", name="failed", job_id="j", seq=9, webhook_id="w", error="cancelled"
    )
    assert encode_body(body) == (
        b'{"success":false,"type":"crawl.failed","id":"j","webhookId":"w","eventId":"j:9",'
        b'"seq":9,"data":[],"error":"cancelled","metadata":{}}'
    )


@pytest.mark.parametrize("name", ["started", "completed"])
def test_started_and_completed_have_no_error_key(name: str) -> None:
    raw = encode_body(build_body(kind="crawl", name=name, job_id="j", seq=1, webhook_id="w"))
    keys = list(msgspec.json.decode(raw))
    assert keys == ["success", "type", "id", "webhookId", "eventId", "seq", "data", "metadata"]


def test_failed_page_carries_error_and_is_unsuccessful() -> None:
    body = build_body(
        kind="batch_scrape",
        name="page",
        job_id="j",
        seq=2,
        webhook_id="w",
        data=[{"metadata": {"sourceURL": "https://x.example/"}}],
        error="timeout",
    )
    assert body.success is False
    assert body.type == "batch_scrape.page"
    assert not body.terminal


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "failed"}, "needs an error"),
        ({"name": "completed", "error": "x"}, "cannot carry an error"),
        ({"name": "started", "error": "x"}, "cannot carry an error"),
        ({"name": "cancelled"}, "unknown webhook event"),
        ({"name": "page", "seq": 0}, "seq counts from 1"),
        ({"name": "page", "kind": "a.b"}, "invalid job kind"),
        ({"name": "page", "kind": ""}, "invalid job kind"),
    ],
)
def test_build_body_rejects(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"kind": "crawl", "job_id": "j", "seq": 1, "webhook_id": "w"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        build_body(**args)  # type: ignore[arg-type]


def test_decode_round_trip() -> None:
    body = build_body(
        kind="crawl", name="page", job_id="j", seq=5, webhook_id="w", data=[1, "a", None]
    )
    raw = encode_body(body)
    back = decode_body(raw)
    assert back == body
    assert encode_body(back) == raw
    with pytest.raises(msgspec.ValidationError):
        decode_body(b'{"success":true}')


def test_names_and_ids() -> None:
    assert event_type("crawl", "started") == "crawl.started"
    assert event_name("crawl.completed") == "completed"
    assert event_name("monitor.check.completed") == "completed"
    assert event_id("abc", 12) == "abc:12"
    assert is_terminal("crawl.failed") and is_terminal("completed")
    assert not is_terminal("crawl.page") and not is_terminal("started")


@pytest.mark.parametrize(
    ("events", "type_", "expected"),
    [
        (None, "crawl.page", True),
        ([], "crawl.failed", True),
        (["page"], "crawl.page", True),
        (["page"], "batch_scrape.page", True),
        (["page"], "crawl.started", False),
        (["crawl.page"], "crawl.page", True),
        (["crawl.page"], "batch_scrape.page", False),
        (["crawl.page"], "crawl.completed", False),
        (["started", "completed"], "crawl.completed", True),
        (["started", "completed"], "crawl.failed", False),
        (["failed"], "crawl.failed", True),
        (["check.completed"], "monitor.check.completed", True),
        (["age"], "crawl.page", False),
        (["rawl.page"], "crawl.page", False),
    ],
)
def test_filter_matching(events: list[str] | None, type_: str, expected: bool) -> None:
    assert wants(events, type_) is expected


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        ("completed", None, ("completed", None)),
        ("failed", "upstream 500", ("failed", "upstream 500")),
        ("failed", None, ("failed", "failed")),
        ("cancelled", "whatever", ("failed", "cancelled")),
    ],
)
def test_terminal_for_status(
    status: str, reason: str | None, expected: tuple[str, str | None]
) -> None:
    assert terminal_for_status(status, reason) == expected


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        ("completed", None, ("completed", None)),
        ("failed", "Max credits exceeded", ("failed", "Max credits exceeded")),
        ("cancelled", "cancelled by a user", ("cancelled", None)),
    ],
)
def test_an_agent_ends_with_its_own_cancelled_event(
    status: str, reason: str | None, expected: tuple[str, str | None]
) -> None:
    assert terminal_for_status(status, reason, "agent") == expected


def test_agent_events_are_firecrawls() -> None:
    action = build_body(kind="agent", name="action", job_id="j", seq=2, webhook_id="w",
                        data=[{"creditsUsed": 1, "action": "scrape", "input": {"url": "u"}}])  # fmt: skip
    assert action.type == "agent.action" and action.success and not action.terminal
    cancelled = build_body(kind="agent", name="cancelled", job_id="j", seq=3, webhook_id="w",
                           data=[{"creditsUsed": 1}])  # fmt: skip
    assert cancelled.success is False and cancelled.error is None and cancelled.terminal
    assert b'"error"' not in encode_body(cancelled)
    with pytest.raises(ValueError, match="unknown webhook event"):
        build_body(kind="agent", name="page", job_id="j", seq=1, webhook_id="w")
    with pytest.raises(ValueError, match="cannot carry an error"):
        build_body(kind="agent", name="action", job_id="j", seq=1, webhook_id="w", error="x")
    seq = Sequencer(kind="agent", events=["action", "cancelled"])
    assert seq.issue("started") is None
    assert seq.issue("action") == 1
    assert seq.issue("cancelled") == 2
    with pytest.raises(TerminalAlreadyIssued):
        seq.issue("action")


def test_terminal_for_running_status_is_an_error() -> None:
    with pytest.raises(ValueError):
        terminal_for_status("scraping")


def test_sequencer_numbers_only_wanted_events_and_stops_at_terminal() -> None:
    seq = Sequencer(kind="crawl", events=["page", "crawl.completed"])
    assert seq.issue("started") is None
    assert seq.issue("page") == 1
    assert seq.issue("page") == 2
    assert seq.issue("completed") == 3
    assert seq.terminated
    with pytest.raises(TerminalAlreadyIssued):
        seq.issue("page")


def test_sequencer_filtered_terminal_still_ends_the_stream() -> None:
    seq = Sequencer(kind="crawl", events=["page"])
    assert seq.issue("page") == 1
    assert seq.issue("failed") is None
    with pytest.raises(TerminalAlreadyIssued):
        seq.issue("completed")


def test_sequencer_resumes_after_restart() -> None:
    seq = Sequencer(kind="crawl", last_seq=41)
    assert seq.issue("page") == 42


def test_undelivered_error_text() -> None:
    assert undelivered_error("j:4", "crawl.page", "gave up after 6 attempts; last: HTTP 500") == (
        "webhook event j:4 (crawl.page) was not delivered: gave up after 6 attempts; last: HTTP 500"
    )
