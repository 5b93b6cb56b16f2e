"""Monitor notifications against a whole crawld: Firecrawl's `notification.email` through a
loopback SMTP relay (the fake in daemon/fakes/smtp.py, with a login) and a named Apprise target
(`json://` to the webhook receiver) get a message naming the monitor, the check, its counts, the
changed URL and a diff excerpt; a check with nothing to tell sends nothing; a receiver that
fails and comes back gets the notification once, after a retry; one that keeps failing ends
`failed`; `notificationStatus` tells each; a monitor naming an unknown target, or a URL, is a
400 that creates nothing; the relay's password and the target's token appear in no answer, no
/status and no log line."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl

from daemon.app import Daemon
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim
from daemon.fakes.smtp import FakeSmtp, open_smtp
from tests.conftest import unlabelled
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_monitors import finished, page

Sdk = Callable[..., Awaitable[Any]]
PASSWORD = "smtp-pa55word-XYZ"
TOKEN = "t0ken-QRS-987"


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSmtp]:
    async with open_smtp("crawld", PASSWORD) as relay:
        yield relay


@pytest.fixture
def crawl_config(smtp: FakeSmtp, rx: WebhookReceiver, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CRAWLD_TEST_SMTP_PASSWORD", PASSWORD)
    monkeypatch.setenv("CRAWLD_TEST_NOTIFY_OPS", f"json://ops:{TOKEN}@{rx.netloc}/notify")
    return (
        CONFIG
        + f"""
[monitors]
notify_timeout = "5s"
notify_retry_schedule = ["50ms", "100ms"]
[monitors.smtp]
host = "127.0.0.1"
port = {smtp.port}
security = "none"
username = "crawld"
password_env = "CRAWLD_TEST_SMTP_PASSWORD"
from_address = "crawld@example.com"
allowed_recipients = ["@example.com"]
[[monitors.notification_targets]]
name = "ops"
url_env = "CRAWLD_TEST_NOTIFY_OPS"
"""
    )


NOTIFY = {"email": {"enabled": True, "recipients": ["team@example.com"], "includeDiffs": True},
          "targets": ["ops"]}  # fmt: skip


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    """A monitor made over plain HTTP: firecrawl-py 4.55's MonitorNotification model drops
    `notification.targets` (a crawld extension) before sending."""
    answer = await client.post("/v2/monitor", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["notification"] == NOTIFY
    return str(answer.json()["data"]["id"])


def posts(rx: WebhookReceiver, *, delivered: bool = True) -> list[Any]:
    return [r for r in rx.requests if r.path == "/notify" and (r.delivered or not delivered)]


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record's message and context (what a log line can show)."""
    return "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)


async def settled(sdk: Sdk, fc: Firecrawl, monitor_id: str, check_id: str) -> dict[str, Any]:
    """The check's notificationStatus once no channel is pending."""
    with trio.fail_after(30):
        while True:
            detail = await sdk(fc.get_monitor_check, monitor_id, check_id)
            status: dict[str, Any] = detail.notification_status or {}
            states = [status.get("email"), *(status.get("targets") or {}).values()]
            if status and "pending" not in states:
                return status
            await trio.sleep(0.05)


async def test_email_and_target_tell_a_changed_page_once_and_keep_secrets(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, smtp: FakeSmtp, rx: WebhookReceiver,
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    site.files["/price"] = page("Price", "Price: 10 EUR")
    site.files["/stable"] = page("Stable", "Nothing moves")
    urls = [site.url("/price"), site.url("/stable")]
    monitor = await sdk(fc.get_monitor, await create(client, {
        "name": "prices", "schedule": {"text": "hourly"}, "notification": NOTIFY,
        "targets": [{"type": "scrape", "urls": urls}]}))  # fmt: skip
    first = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, first.id)
    assert await settled(sdk, fc, monitor.id, first.id) == {"email": "sent",
                                                             "targets": {"ops": "sent"}}  # fmt: skip

    site.files["/price"] = page("Price", "Price: 12 EUR")
    second = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, second.id)
    assert await settled(sdk, fc, monitor.id, second.id) == {"email": "sent",
                                                              "targets": {"ops": "sent"}}  # fmt: skip
    assert len(smtp.mails) == 2 and len(posts(rx)) == 2
    mail = smtp.mails[1]
    assert mail.recipients == ["team@example.com"] and mail.login == "crawld"
    assert mail.sender == "crawld@example.com"
    assert mail.message["Subject"] == "[crawld] prices: 1 changed"
    assert mail.message["Message-ID"] == f"<{second.id}.email@crawld>"
    for text in (monitor.id, second.id, "1 changed", f"changed: {urls[0]}", "-Price: 10 EUR",
                 "+Price: 12 EUR"):  # fmt: skip
        assert text in mail.text, text
    assert urls[1] not in mail.text  # a `same` page is not told
    post = posts(rx)[1]
    assert post.json["title"] == "[crawld] prices: 1 changed"
    assert second.id in post.json["message"] and "+Price: 12 EUR" in post.json["message"]
    assert post.headers["authorization"] == "Basic " + base64.b64encode(
        f"ops:{TOKEN}".encode()).decode()  # fmt: skip

    # Nothing changed: nothing is sent, and the check says so.
    third = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, third.id)
    assert (await sdk(fc.get_monitor_check, monitor.id, third.id)).notification_status == {
        "email": "skipped", "targets": {"ops": "skipped"}}  # fmt: skip
    listed = await sdk(fc.list_monitor_checks, monitor.id)
    assert [c.notification_status["email"] for c in listed] == ["skipped", "sent", "sent"]
    assert len(smtp.mails) == 2 and len(posts(rx)) == 2

    status = (await client.get("/status")).text
    assert '"failed":0' in status.replace(" ", "") and '"ops"' in status
    answers = [status, (await client.get(f"/v2/monitor/{monitor.id}")).text,
               (await client.get(f"/v2/monitor/{monitor.id}/checks/{second.id}")).text,
               logged(caplog)]  # fmt: skip
    for text in answers:
        assert PASSWORD not in text and TOKEN not in text
    assert "monitor notification sent" in logged(caplog)
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_monitor_notifications_total{kind="target",outcome="sent"}' in metrics


async def test_a_receiver_down_then_up_gets_it_once_and_one_that_stays_down_fails(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, smtp: FakeSmtp, rx: WebhookReceiver,
    daemon: Daemon, caplog: pytest.LogCaptureFixture, client: httpx.AsyncClient,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO)
    site.files["/a"] = page("A", "Alpha")
    smtp.fail_next(1, 451)
    rx.fail_next(2, 503)
    monitor = await sdk(fc.get_monitor, await create(client, {
        "name": "flaky", "schedule": {"text": "hourly"}, "notification": NOTIFY,
        "targets": [{"type": "scrape", "urls": [site.url("/a")]}]}))  # fmt: skip
    check = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, check.id)
    assert await settled(sdk, fc, monitor.id, check.id) == {"email": "sent",
                                                             "targets": {"ops": "sent"}}  # fmt: skip
    assert smtp.refused == 1 and len(smtp.mails) == 1
    assert [r.status for r in posts(rx, delivered=False)] == [503, 503, 200]
    assert "monitor notification failed; retrying" in logged(caplog)

    # Down for longer than the retries: failed, after 1 + 2 attempts, and told in /status.
    smtp.fail_next(3, 451)
    rx.fail_next(3, 503)
    site.files["/a"] = page("A", "Alpha, revised")
    again = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, again.id)
    assert await settled(sdk, fc, monitor.id, again.id) == {"email": "failed",
                                                             "targets": {"ops": "failed"}}  # fmt: skip
    assert len(smtp.mails) == 1 and smtp.refused == 4
    assert len(posts(rx, delivered=False)) == 6 and len(posts(rx)) == 1
    notes = daemon.parts["monitors"].notifier.status()
    assert notes["failed"] == 2 and notes["last_errors"]["email"].startswith("SMTP 451")
    assert notes["last_errors"]["target:ops"] == "the service did not accept the notification"


@pytest.mark.parametrize(
    ("notification", "where"),
    [
        ({"targets": ["nobody"]}, "$.notification.targets[0]"),
        ({"targets": ["json://127.0.0.1:9/x"]}, "$.notification.targets[0]"),
        ({"email": {"enabled": True, "recipients": ["x@elsewhere.test"]}},
         "$.notification.email.recipients[0]"),
    ],
)  # fmt: skip
async def test_unknown_targets_urls_and_recipients_are_400_and_create_nothing(
    client: httpx.AsyncClient, notification: dict[str, Any], where: str, site: SiteSim
) -> None:
    body = {"name": "m", "schedule": {"text": "hourly"}, "notification": notification,
            "targets": [{"type": "scrape", "urls": [site.url("/a")]}]}  # fmt: skip
    answer = await client.post("/v2/monitor", json=body)
    assert answer.status_code == 400, answer.text
    assert where in [d["path"] for d in answer.json()["details"]]
    assert (await client.get("/v2/monitor")).json() == {"success": True, "data": []}
    created = await client.post("/v2/monitor", json={**body, "notification": None})
    monitor_id = created.json()["data"]["id"]
    patched = await client.patch(f"/v2/monitor/{monitor_id}", json={"notification": notification})
    assert patched.status_code == 400 and where in [d["path"] for d in patched.json()["details"]]
    assert (await client.get(f"/v2/monitor/{monitor_id}")).json()["data"]["notification"] is None


async def test_the_api_document_follows_the_configured_relay_and_targets(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    node = spec["components"]["schemas"]["MonitorNotification"]
    assert node["properties"]["targets"]["items"] == {"enum": ["ops"]}
    assert node["properties"]["email"]["properties"]["enabled"] == {"type": "boolean"}


async def test_a_reload_applies_new_targets_and_refuses_a_missing_secret(
    daemon: Daemon, crawl_config: str, tmp_path: Path, client: httpx.AsyncClient, site: SiteSim,
    rx: WebhookReceiver,
) -> None:  # fmt: skip
    body = {"name": "m", "schedule": {"text": "hourly"}, "notification": {"targets": ["chat"]},
            "targets": [{"type": "scrape", "urls": [site.url("/a")]}]}  # fmt: skip
    assert (await client.post("/v2/monitor", json=body)).status_code == 400
    config = tmp_path / "crawld.toml"
    config.write_text(crawl_config + '[[monitors.notification_targets]]\nname = "chat"\n'
                      'url_env = "CRAWLD_TEST_UNSET_VARIABLE"\n')  # fmt: skip
    assert not await daemon.reload()  # its secret is missing: nothing changes
    assert (await client.post("/v2/monitor", json=body)).status_code == 400
    config.write_text(crawl_config + '[[monitors.notification_targets]]\nname = "chat"\n'
                      f'url = "json://{rx.netloc}/chat"\n')  # fmt: skip
    assert await daemon.reload()
    assert (await client.post("/v2/monitor", json=body)).status_code == 200
