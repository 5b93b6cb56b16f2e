"""/v2/monitor through firecrawl-py 4.55's monitor methods against a whole crawld and the fake
site: a page changed on the site between two checks is `changed` with its diff, one deleted is
`removed`, an untouched one `same`; webhooks `monitor.page` (one per page per check) and
`monitor.check.completed` (last) arrive in order; a manual run is 409 while paused; bad
definitions are 400 naming the field and create nothing. The scheduler's claim (catch-up and
overlap) is driven with chosen clock values through `MonitorService.tick`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import MonitorCheckDetail, ScrapeOptions

from daemon.app import Daemon
from daemon.crawl.monitors.service import MonitorService
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim
from tests.conftest import unlabelled

Sdk = Callable[..., Awaitable[Any]]


def page(title: str, text: str) -> tuple[bytes, str]:
    html = f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>"
    return html.encode(), "text/html"


async def finished(sdk: Sdk, fc: Firecrawl, monitor_id: str, check_id: str) -> MonitorCheckDetail:
    with trio.fail_after(30):
        while True:
            detail: MonitorCheckDetail = await sdk(fc.get_monitor_check, monitor_id, check_id)
            if detail.status not in ("queued", "running"):
                return detail
            await trio.sleep(0.05)


def by_url(detail: MonitorCheckDetail) -> dict[str, Any]:
    return {p.url.rsplit("/", 1)[-1]: p for p in detail.pages}


async def test_checks_report_new_same_changed_removed_with_diffs_and_webhooks(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, rx: WebhookReceiver, client: httpx.AsyncClient
) -> None:
    site.files["/price"] = page("Price", "Price: 10 EUR")
    site.files["/stable"] = page("Stable", "Nothing moves here")
    site.files["/doomed"] = page("Doomed", "Soon gone")
    urls = [site.url(p) for p in ("/price", "/stable", "/doomed")]
    monitor = await sdk(fc.create_monitor, name="prices", schedule={"text": "every 15 minutes"},
                        targets=[{"type": "scrape", "urls": urls}],
                        webhook={"url": rx.url(), "metadata": {"team": "a"}})  # fmt: skip
    assert monitor.status == "active" and monitor.schedule.cron == "*/15 * * * *"
    assert monitor.next_run_at is not None and monitor.retention_days == 30
    assert monitor.targets[0]["id"]  # a target without an id gets one

    first = await sdk(fc.run_monitor, monitor.id)
    assert first.trigger == "manual" and first.billing_status == "not_applicable"
    assert first.status in ("queued", "running") and not first.model_extra  # no pages
    one = await finished(sdk, fc, monitor.id, first.id)
    assert one.status == "completed", one
    assert one.summary.new == 3 and one.summary.total_pages == 3
    assert {p.status for p in one.pages} == {"new"}

    site.files["/price"] = page("Price", "Price: 12 EUR")
    del site.files["/doomed"]
    second = await sdk(fc.run_monitor, monitor.id)
    two = await finished(sdk, fc, monitor.id, second.id)
    pages = by_url(two)
    assert {k: p.status for k, p in pages.items()} == {
        "price": "changed", "stable": "same", "doomed": "removed"}  # fmt: skip
    assert two.status == "completed"
    assert (two.summary.changed, two.summary.same, two.summary.removed) == (1, 1, 1)
    changed = pages["price"]
    assert changed.diff is not None and "-Price: 10 EUR" in (changed.diff.text or "")
    assert "+Price: 12 EUR" in (changed.diff.text or "")
    assert changed.previous_scrape_id == by_url(one)["price"].current_scrape_id
    assert pages["stable"].diff is None

    got = await sdk(fc.get_monitor, monitor.id)
    assert got.last_check_summary is not None and got.last_check_summary.changed == 1
    assert got.current_check_id is None
    checks = await sdk(fc.list_monitor_checks, monitor.id)
    assert [c.id for c in checks] == [second.id, first.id]

    # Webhooks: 3 page events then the completed event per check, in order.
    await rx.wait_until(lambda: len(rx.events(second.id)) == 4)
    rx.check()
    events = rx.events(second.id)
    assert [e.type for e in events] == ["monitor.page"] * 3 + ["monitor.check.completed"]
    statuses = sorted(e.event["data"][0]["status"] for e in events[:3])
    assert statuses == ["changed", "removed", "same"]
    done = events[-1].event
    assert done["success"] is True and done["id"] == second.id
    assert done["data"][0]["summary"]["changed"] == 1 and done["metadata"] == {"team": "a"}
    assert events[0].event["webhookId"] == events[0].webhook_id
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_monitor_pages_total{status="changed"}' in metrics
    assert 'crawld_monitor_checks_total{status="completed"}' in metrics


async def test_ignore_patterns_and_exclude_tags_keep_noise_from_changing_a_page(
    fc: Firecrawl, sdk: Sdk, site: SiteSim
) -> None:
    def shop(visitors: int, ad: str) -> tuple[bytes, str]:
        html = (f"<html><body><h1>Shop</h1><p>{visitors} visitors today</p><p>Price: 10</p>"
                f"<div class='ad'>{ad}</div></body></html>")  # fmt: skip
        return html.encode(), "text/html"

    site.files["/shop"] = shop(42, "Buy socks")
    # firecrawl-py 4.55 sends a monitor target's ScrapeOptions with snake_case keys
    # (exclude_tags), which crawld reads as camelCase; a dict with camelCase keys is read by the
    # SDK as its ScrapeOptions model and loses them before it is sent.
    target = {"type": "scrape", "urls": [site.url("/shop")], "ignorePatterns": [r"\d+ visitors"],
              "scrapeOptions": ScrapeOptions(exclude_tags=[".ad"])}  # fmt: skip
    monitor = await sdk(fc.create_monitor, name="shop", schedule={"text": "hourly"},
                        targets=[target])  # fmt: skip
    assert (await finished(sdk, fc, monitor.id, (await sdk(fc.run_monitor, monitor.id)).id)
            ).summary.new == 1  # fmt: skip
    site.files["/shop"] = shop(97, "Buy hats")
    second = await finished(sdk, fc, monitor.id, (await sdk(fc.run_monitor, monitor.id)).id)
    assert [p.status for p in second.pages] == ["same"], second.pages[0].diff


async def test_pages_are_paginated_with_next(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, client: httpx.AsyncClient
) -> None:
    urls = [site.url(f"/pages/{i}") for i in range(5)]
    monitor = await sdk(fc.create_monitor, name="five", schedule={"cron": "0 9 * * *"},
                        targets=[{"type": "scrape", "urls": urls}])  # fmt: skip
    check = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, check.id)
    body = (await client.get(f"/v2/monitor/{monitor.id}/checks/{check.id}?limit=2")).json()
    assert len(body["data"]["pages"]) == 2 and "skip=2" in body["next"]
    detail = await sdk(fc.get_monitor_check, monitor.id, check.id, limit=2)  # follows next
    assert sorted(p.url for p in detail.pages) == sorted(urls)


async def test_pause_run_conflict_update_delete(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, client: httpx.AsyncClient
) -> None:
    monitor = await sdk(fc.create_monitor, name="m", schedule={"text": "daily at 9am",
                        "timezone": "Europe/Paris"},
                        targets=[{"type": "scrape", "urls": [site.url("/about")]}])  # fmt: skip
    assert monitor.schedule.cron == "0 9 * * *" and monitor.schedule.timezone == "Europe/Paris"
    paused = await sdk(fc.update_monitor, monitor.id, status="paused")
    assert paused.status == "paused" and paused.next_run_at is None
    answer = await client.post(f"/v2/monitor/{monitor.id}/run", json={})
    assert answer.status_code == 409 and answer.json()["success"] is False
    renamed = await sdk(fc.update_monitor, monitor.id, name="renamed", status="active",
                        schedule={"cron": "*/30 * * * *"})  # fmt: skip
    assert (renamed.name, renamed.status, renamed.schedule.cron) == ("renamed", "active",
                                                                     "*/30 * * * *")  # fmt: skip
    assert renamed.schedule.timezone == "UTC"
    bad = await client.patch(f"/v2/monitor/{monitor.id}", json={"schedule": {"cron": "* * * * *"}})
    assert bad.status_code == 400 and bad.json()["details"][0]["path"] == "$.schedule.cron"
    assert (await sdk(fc.get_monitor, monitor.id)).schedule.cron == "*/30 * * * *"
    assert [m.id for m in await sdk(fc.list_monitors)] == [monitor.id]
    assert await sdk(fc.delete_monitor, monitor.id) is True
    assert (await client.get(f"/v2/monitor/{monitor.id}")).status_code == 404
    assert (await client.get("/v2/monitor/not-a-uuid")).status_code == 404


def target(url: str) -> dict[str, Any]:
    return {"type": "scrape", "urls": [url]}


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"schedule": {"text": "every 1 minute"}}, "$.schedule.text"),
        ({"schedule": {"cron": "*/2 * * * *"}}, "$.schedule.cron"),
        ({"schedule": {"cron": "61 * * * *"}}, "$.schedule.cron"),
        ({"schedule": {"cron": "0 9 * * *", "timezone": "Mars/Base"}}, "$.schedule.timezone"),
        ({"schedule": {"text": "now and then"}}, "$.schedule.text"),
        ({"schedule": {}}, "$.schedule"),
        ({"targets": []}, "$.targets"),
        ({"targets": [target("http://site.test/")] * 51}, "$.targets"),
        ({"targets": [{"type": "search", "queries": ["crawld"]}]}, "$.targets[0].type"),
        ({"targets": [{"type": "scrape", "urls": ["ftp://x"]}]}, "$.targets[0].urls[0]"),
        ({"targets": [{"type": "scrape", "urls": ["http://a.test/"],
                       "scrapeOptions": {"bogus": 1}}]}, "$.targets[0].scrapeOptions.bogus"),
        ({"targets": [{"type": "crawl", "url": "http://a.test/",
                       "crawlOptions": {"limit": 0}}]}, "$.targets[0].crawlOptions.limit"),
        ({"targets": [{"type": "scrape", "urls": ["http://a.test/"],
                       "ignorePatterns": ["("]}]}, "$.targets[0].ignorePatterns[0]"),
        ({"name": ""}, "$.name"),
        ({"retentionDays": 400}, "$.retentionDays"),
        ({"webhook": {"url": "http://x.test/", "events": ["crawl.page"]}}, "$.webhook.events"),
        ({"notification": {"email": {"enabled": True, "recipients": ["a@b.c"]}}},
         "$.notification.email.enabled"),
        ({"colour": "red"}, "$.colour"),
    ],
)  # fmt: skip
async def test_bad_definitions_are_400_naming_the_field_and_create_nothing(
    client: httpx.AsyncClient, change: dict[str, Any], path: str
) -> None:
    body = {"name": "m", "schedule": {"text": "hourly"}, "targets": [target("http://a.test/")]}
    body.update(change)
    answer = await client.post("/v2/monitor", json=body)
    assert answer.status_code == 400, answer.text
    assert path in [d["path"] for d in answer.json()["details"]], answer.json()
    assert (await client.get("/v2/monitor")).json() == {"success": True, "data": []}


async def test_the_scheduler_claims_once_catches_up_once_and_skips_overlaps(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, daemon: Daemon, client: httpx.AsyncClient
) -> None:
    service: MonitorService = daemon.parts["monitors"]
    site.slow_seconds = 0.5
    monitor = await sdk(fc.create_monitor, name="s", schedule={"cron": "*/15 * * * *"},
                        targets=[{"type": "scrape", "urls": [site.url("/slow")]}])  # fmt: skip
    row = await service._row(monitor.id)
    assert row.due_ms is not None and row.next_run_ms == row.due_ms  # cron: no jitter
    assert await service.tick(row.due_ms - 1) == 0  # not due yet
    # Down for 5 hours: one catch-up check for the missed time, the next one after now.
    late = row.due_ms + 5 * 3_600_000 + 1_000
    assert await service.tick(late) == 1
    after = await service._row(monitor.id)
    assert after.current_check is not None
    assert after.due_ms == row.due_ms + 5 * 3_600_000 + 15 * 60_000
    assert await service.tick(late) == 0  # claimed already: nothing more
    # Due again while that check still runs: skipped_overlap.
    assert await service.tick(after.next_run_ms or 0) == 1
    checks = await sdk(fc.list_monitor_checks, monitor.id)
    assert checks[0].status == "skipped_overlap"
    assert checks[1].trigger == "scheduled" and checks[1].scheduled_for is not None
    await finished(sdk, fc, monitor.id, after.current_check)
    assert (await service._row(monitor.id)).current_check is None


async def test_delete_crawl_cancels_a_running_check(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, client: httpx.AsyncClient
) -> None:
    site.latency = (0.3, 0.5)
    urls = [site.url(f"/pages/{i}") for i in range(30)]
    monitor = await sdk(fc.create_monitor, name="slow", schedule={"cron": "0 9 * * *"},
                        targets=[{"type": "scrape", "urls": urls}])  # fmt: skip
    check = await sdk(fc.run_monitor, monitor.id)
    busy = await client.post(f"/v2/monitor/{monitor.id}/run")
    assert busy.status_code == 409 and busy.json()["checkId"] == check.id
    assert (await client.delete(f"/v2/crawl/{check.id}")).status_code == 200
    done = await finished(sdk, fc, monitor.id, check.id)
    assert done.status == "failed" and "cancelled" in (done.error or "")
    assert len(done.pages) < len(urls)
    assert (await sdk(fc.get_monitor, monitor.id)).current_check_id is None
    site.latency = (0.0, 0.0)
    again = await sdk(fc.run_monitor, monitor.id)
    assert (await finished(sdk, fc, monitor.id, again.id)).status == "completed"


async def test_retention_days_drop_older_checks(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, daemon: Daemon
) -> None:
    monitor = await sdk(fc.create_monitor, name="kept", schedule={"cron": "0 9 * * *"},
                        targets=[{"type": "scrape", "urls": [site.url("/about")]}],
                        retention_days=1)  # fmt: skip
    old = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, old.id)
    two_days = 2 * 86_400_000
    await daemon.parts["monitors"].store.write(lambda c: c.execute(
        "UPDATE monitor_checks SET created_ms = created_ms - ? WHERE id = ?", (two_days, old.id)))  # fmt: skip
    new = await sdk(fc.run_monitor, monitor.id)
    await finished(sdk, fc, monitor.id, new.id)
    assert [c.id for c in await sdk(fc.list_monitor_checks, monitor.id)] == [new.id]


async def test_crawl_target_reports_pages_no_longer_reached_as_removed(
    fc: Firecrawl, sdk: Sdk, site: SiteSim
) -> None:
    def hub(*links: str) -> tuple[bytes, str]:
        anchors = "".join(f'<li><a href="/w/{x}">{x}</a></li>' for x in links)
        return f"<html><body><h1>Hub</h1><ul>{anchors}</ul></body></html>".encode(), "text/html"

    site.files["/w/hub"] = hub("a", "b")
    site.files["/w/a"] = page("A", "Alpha text")
    site.files["/w/b"] = page("B", "Beta text")
    target = {"type": "crawl", "url": site.url("/w/hub"),
              "crawlOptions": {"includePaths": ["^/w/"], "crawlEntireDomain": True, "limit": 10,
                               "sitemap": "skip"}}  # fmt: skip
    monitor = await sdk(fc.create_monitor, name="site", schedule={"text": "daily"},
                        targets=[target])  # fmt: skip
    first = await finished(sdk, fc, monitor.id, (await sdk(fc.run_monitor, monitor.id)).id)
    assert first.status == "completed", first
    assert {k: p.status for k, p in by_url(first).items()} == {"hub": "new", "a": "new", "b": "new"}
    assert first.target_results and first.target_results[0].crawl_id

    site.files["/w/hub"] = hub("a")  # b is no longer linked: the crawl no longer reaches it
    site.files["/w/a"] = page("A", "Alpha text, revised")
    second = await finished(sdk, fc, monitor.id, (await sdk(fc.run_monitor, monitor.id)).id)
    assert {k: p.status for k, p in by_url(second).items()} == {
        "hub": "changed", "a": "changed", "b": "removed"}  # fmt: skip
    assert second.target_results[0].crawl_id != first.target_results[0].crawl_id  # type: ignore[index]
    third = await finished(sdk, fc, monitor.id, (await sdk(fc.run_monitor, monitor.id)).id)
    assert {k: p.status for k, p in by_url(third).items()} == {"hub": "same", "a": "same"}
