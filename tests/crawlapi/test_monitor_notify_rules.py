"""The monitors' notification rules as tables: which `notification` a request may send (email only
with a relay, targets only by a configured name, never a URL), which pages a check tells (noise
judged against a goal left out), the message, `notificationStatus`, the retry schedule; the
[monitors] notification keys' config errors; secrets resolved without being shown; a row claimed
by one deliverer only."""

from __future__ import annotations

from typing import Any

import pytest

from daemon import settings
from daemon.config import ConfigError
from daemon.crawl.monitors import notify
from daemon.crawl.monitors import notify_store as nstore
from daemon.crawl.monitors.config import MonitorConfig, NotificationTarget, SmtpConfig
from daemon.crawl.monitors.senders import Senders
from daemon.store import Store

OPS = frozenset({"ops", "chat"})
SMTP = SmtpConfig(host="127.0.0.1", port=25, security="none", from_address="c@example.com",
                  allowed_recipients=["@example.com", "boss@other.test"])  # fmt: skip


def paths(raw: Any, *, smtp: SmtpConfig | None = SMTP) -> list[str]:
    allows = smtp.allows if smtp is not None else (lambda _: True)
    _, problems = notify.parse(raw, smtp_ready=smtp is not None, targets=OPS, allows=allows)
    return [p["path"] for p in problems]


@pytest.mark.parametrize(
    ("raw", "smtp", "where"),
    [
        ({"email": {"enabled": True, "recipients": ["a@example.com"]}}, None,
         "$.notification.email.enabled"),
        ({"email": {"enabled": True}}, SMTP, "$.notification.email.recipients"),
        ({"email": {"enabled": True, "recipients": ["not an address"]}}, SMTP,
         "$.notification.email.recipients[0]"),
        ({"email": {"enabled": True, "recipients": ["a@b.c\r\nBcc: x@y.z"]}}, SMTP,
         "$.notification.email.recipients[0]"),
        ({"email": {"enabled": True, "recipients": ["x@elsewhere.test"]}}, SMTP,
         "$.notification.email.recipients[0]"),
        ({"email": {"enabled": True, "recipients": [f"a{i}@example.com" for i in range(26)]}},
         SMTP, "$.notification.email.recipients"),
        ({"email": {"enabled": "yes", "recipients": []}}, SMTP, "$.notification.email.enabled"),
        ({"email": {"enabled": False, "bcc": []}}, SMTP, "$.notification.email.bcc"),
        ({"targets": ["nope"]}, SMTP, "$.notification.targets[0]"),
        ({"targets": ["ops", "json://127.0.0.1:9/x"]}, SMTP, "$.notification.targets[1]"),
        ({"targets": "ops"}, SMTP, "$.notification.targets"),
        ({"slack": {}}, SMTP, "$.notification.slack"),
        ("email", SMTP, "$.notification"),
    ],
)  # fmt: skip
def test_bad_notifications_name_the_field(raw: Any, smtp: SmtpConfig | None, where: str) -> None:
    assert where in paths(raw, smtp=smtp)


def test_good_notifications_are_normalised() -> None:
    raw = {"email": {"enabled": True, "recipients": ["A@example.com", "A@example.com",
                                                     "boss@other.test"]},
           "targets": ["ops", "chat", "ops"]}  # fmt: skip
    value, problems = notify.parse(raw, smtp_ready=True, targets=OPS, allows=SMTP.allows)
    assert problems == []
    assert value == {"email": {"enabled": True, "recipients": ["A@example.com", "boss@other.test"],
                               "includeDiffs": False}, "targets": ["ops", "chat"]}  # fmt: skip
    assert notify.channels(value) == ["email", "target:ops", "target:chat"]
    # Disabled email needs no relay (Firecrawl's default object is accepted everywhere).
    off, problems = notify.parse({"email": {"enabled": False, "recipients": []}},
                                 smtp_ready=False, targets=frozenset())  # fmt: skip
    assert problems == [] and notify.channels(off) == []


def page(status: str, meaningful: bool | None = None, url: str = "http://a.test/") -> notify.Noted:
    judgment = None if meaningful is None else {"meaningful": meaningful, "confidence": "high",
                                                "reason": "why"}  # fmt: skip
    return notify.Noted(url=url, status=status, judgment=judgment, diff_text="-a\n+b")


def test_worth_telling_drops_same_pages_and_judged_noise() -> None:
    pages = [page("same"), page("new"), page("removed"), page("error"),
             page("changed", meaningful=False), page("changed", meaningful=True),
             page("changed")]  # fmt: skip
    told = [(p.status, p.judgment and p.judgment["meaningful"]) for p in notify.worth(pages, True)]
    assert told == [("new", None), ("removed", None), ("error", None), ("changed", True),
                    ("changed", None)]  # fmt: skip
    # Without a judging goal every changed page is told; an all-noise check tells nothing.
    assert len(notify.worth(pages, False)) == 6
    assert notify.worth([page("same"), page("changed", meaningful=False)], True) == []
    # A new search result the judge found beside the goal ("watching") is not alerted on.
    results = [page("new", meaningful=False), page("new", meaningful=True)]
    assert [p.judgment and p.judgment["meaningful"] for p in notify.worth(results, True)] == [True]


def test_the_message_names_monitor_check_counts_urls_and_diff_excerpt() -> None:
    diff = "--- a\n+++ b\n@@ -1 +1 @@\n-Price: 10 EUR\n+Price: 12 EUR\n context\n" + "+x" * 300
    pages = [notify.Noted(url="http://shop.test/price", status="changed", diff_text=diff,
                          judgment={"meaningful": True, "confidence": "high",
                                    "reason": "the price rose"}),
             notify.Noted(url="http://shop.test/new", status="new")]  # fmt: skip
    summary = {"totalPages": 3, "same": 1, "changed": 1, "new": 1, "removed": 0, "error": 0}
    message = notify.render(name="prices", monitor_id="m1", check_id="c1", status="completed",
                            summary=summary, pages=pages, diffs=True, recipients=["a@b.c"])  # fmt: skip
    assert message.subject == "[crawld] prices: 1 changed, 1 new"
    for text in ("prices (m1)", "Check: c1", "1 changed, 1 new", "changed: http://shop.test/price",
                 "new: http://shop.test/new", "-Price: 10 EUR", "+Price: 12 EUR",
                 "judged meaningful (high): the price rose", "/v2/monitor/m1/checks/c1"):  # fmt: skip
        assert text in message.text, text
    broken = notify.render(name="a\r\nBcc: x@y.z", monitor_id="m", check_id="c",
                           status="completed", summary=summary, pages=pages, diffs=False)  # fmt: skip
    assert broken.subject == "[crawld] a Bcc: x@y.z: 1 changed, 1 new"
    assert "+++ b" not in message.text and " context" not in message.text
    assert max(len(line) for line in message.text.splitlines()) <= notify.LINE_CHARS + 3
    plain = notify.render(name="prices", monitor_id="m1", check_id="c1", status="completed",
                          summary=summary, pages=pages, diffs=False)  # fmt: skip
    assert "Price: 10" not in plain.text and "http://shop.test/price" in plain.text
    many = [page("new", url=f"http://a.test/{i}") for i in range(60)]
    listed = notify.render(name="n", monitor_id="m", check_id="c", status="completed",
                           summary={"new": 60}, pages=many, diffs=False)  # fmt: skip
    assert "http://a.test/49" in listed.text and "http://a.test/50" not in listed.text
    assert "… and 10 more pages" in listed.text


def test_notification_status_per_channel() -> None:
    spec = {"email": {"enabled": True, "recipients": ["a@b.c"]}, "targets": ["ops", "chat"]}
    states = {"email": "sent", "target:ops": "failed"}
    assert notify.status_json(spec, states, finished=True) == {
        "email": "sent", "targets": {"ops": "failed", "chat": "skipped"}}  # fmt: skip
    assert notify.status_json(spec, states, finished=False) is None
    assert notify.status_json(None, {}, finished=True) is None
    assert notify.status_json({"email": {"enabled": False}}, {}, finished=True) is None


def test_retry_delays_follow_the_schedule_then_stop() -> None:
    schedule = [1.0, 5.0]
    assert [notify.retry_delay(n, schedule) for n in (1, 2, 3)] == [1.0, 5.0, None]
    assert notify.retry_delay(1, []) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[monitors.smtp]\nhost = "smtp.example.com"\nsecurity = "none"\nusername = "u"\n'
         'password_env = "P"\nfrom_address = "c@example.com"', "only to a loopback relay"),
        ('[monitors.smtp]\nhost = "h"\nusername = "u"\nfrom_address = "c@example.com"',
         "username and password_env"),
        ('[monitors.smtp]\nhost = "h"\nfrom_address = "Crawld <c@example.com>"', "from_address"),
        ('[monitors.smtp]\nhost = "h"\nfrom_address = "c@example.com"\n'
         'allowed_recipients = ["example.com"]', "allowed_recipients"),
        ('[[monitors.notification_targets]]\nname = "ops"', "exactly one of url_env or url"),
        ('[[monitors.notification_targets]]\nname = "o p"\nurl = "json://x"', "name"),
        ('[[monitors.notification_targets]]\nname = "a"\nurl = "json://x"\n'
         '[[monitors.notification_targets]]\nname = "a"\nurl_env = "X"', "used twice"),
        ('[monitors]\nnotify_concurrency = 0', "notify_concurrency"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        settings.decode(text)
    assert "$.monitors" in str(info.value)


def test_senders_read_secrets_from_the_environment_without_showing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret_url = "json://user:S3CRET-TOKEN@127.0.0.1:9/hook"
    config = MonitorConfig(notification_targets=[NotificationTarget(name="ops", url_env="OPS_URL")])
    with pytest.raises(ConfigError, match=r"OPS_URL \(named at `\$.monitors.notification_targets"):
        Senders(config)
    monkeypatch.setenv("OPS_URL", "nothing-apprise-knows://S3CRET-TOKEN")
    with pytest.raises(ConfigError) as info:
        Senders(config)
    assert "notification_targets[0].url_env" in str(info.value)
    assert "S3CRET" not in str(info.value)
    monkeypatch.setenv("OPS_URL", secret_url)
    assert Senders(config).names() == ["ops"]
    assert "S3CRET" not in repr(config) and "S3CRET" not in repr(
        NotificationTarget(name="x", url=secret_url))  # fmt: skip


async def test_a_row_is_claimed_once_and_only_its_claim_writes_the_outcome(store: Store) -> None:
    await store.write(lambda c: nstore.insert(c, "k1", "m1", "email", b"{}", 1000))
    (row,) = await store.read(lambda c: nstore.due(c, 1000, 10))
    assert await store.write(lambda c: nstore.claim(c, row, 5000))
    assert not await store.write(lambda c: nstore.claim(c, row, 6000))  # another deliverer
    assert await store.read(lambda c: nstore.due(c, 4999, 10)) == []
    # A stale holder (its claim taken over after it ran out) cannot write an outcome.
    assert not await store.write(lambda c: nstore.outcome(
        c, row, 6000, state="sent", attempts=1, next_ms=1, error=None, at_ms=1))  # fmt: skip
    assert await store.write(lambda c: nstore.outcome(
        c, row, 5000, state="sent", attempts=1, next_ms=1, error=None, at_ms=1))  # fmt: skip
    assert await store.read(lambda c: nstore.states(c, ["k1", "k2"])) == {"k1": {"email": "sent"}}
    await store.write(lambda c: nstore.insert(c, "k1", "m1", "email", b"{}", 2000))
    assert await store.read(lambda c: nstore.due(c, 10**13, 10)) == []  # once per channel


@pytest.mark.parametrize("smtp_ready", [False, True])
@pytest.mark.parametrize(
    "raw",
    [None, {}, {"email": None}, {"email": {"enabled": False}},
     {"email": {"enabled": True, "recipients": ["a@example.com"], "includeDiffs": True}},
     {"email": {"enabled": True}}, {"email": {"enabled": True, "recipients": ["nope"]}},
     {"email": {"enabled": 1}}, {"email": {"cc": []}}, {"targets": ["ops"]},
     {"targets": ["ops", "nope"]}, {"targets": None}, {"slack": True}, []],
)  # fmt: skip
def test_the_documented_schema_takes_what_the_rules_take(raw: Any, smtp_ready: bool) -> None:
    import jsonschema

    (document,) = notify.schema(smtp_ready=smtp_ready, targets=["ops"]).values()
    refused = list(jsonschema.Draft202012Validator(document).iter_errors(raw))
    _, problems = notify.parse(raw, smtp_ready=smtp_ready, targets=frozenset({"ops"}))
    assert bool(refused) == bool(problems), (refused, problems)
