"""The console over HTTP: assets and their headers, the login and CSRF rules at the edge, the
login's wrong-key limit, the decimated curve, search, the job list with its webhook delivery
state, the queue's last hour, and the errors naming the field."""

from __future__ import annotations

import re
import time

import httpx

from daemon.outbox import NewItem
from tests.ui.conftest import (
    DAY_MS,
    GONE_JOB,
    KEY,
    PLAIN_JOB,
    SILENT_HOOK,
    STUCK_JOB,
    StartDaemon,
    add_video,
    add_webhook_jobs,
    client,
    keyed,
)


async def test_assets_are_served_with_a_strict_policy(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    async with client(daemon) as http:
        page = await http.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "'unsafe" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert '<script src="/ui/static/app.js"' in page.text and "<style" not in page.text
        js = await http.get("/ui/static/app.js")
        assert js.headers["content-type"].startswith("text/javascript")
        assert ".innerHTML" not in js.text and "insertAdjacentHTML" not in js.text
        assert '<script src="/ui/static/monitors.js"' in page.text
        monitors = (await http.get("/ui/static/monitors.js")).text
        assert ".innerHTML" not in monitors and "insertAdjacentHTML" not in monitors
        assert (await http.get("/ui/static/app.css")).status_code == 200
        assert (await http.get("/ui/static/../component.py")).status_code == 404
        assert (await http.get("/ui/static/index.html")).status_code == 404
        # the console's routes are not the API's
        document = (await http.get("/openapi.json")).json()
        assert not [p for p in document["paths"] if p.startswith("/ui")]


async def test_edge_rules_apply_to_the_console(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    async with client(daemon) as http:
        assert (await http.get("/ui", headers={"Host": "evil.example"})).status_code == 421
        cross = await http.get("/ui", headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403
        login = await http.post(
            "/ui/api/login",
            content=b"key=x",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert login.status_code == 415


async def test_login_session_and_csrf(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(http=keyed())
    async with client(daemon) as http:
        assert (await http.get("/ui")).status_code == 200  # the shell asks for the key itself
        assert (await http.get("/ui/api/session")).json() == {
            "auth_required": True,
            "logged_in": False,
            "csrf": None,
        }
        assert (await http.get("/status")).status_code == 401
        assert (await http.get("/ui/api/jobs")).status_code == 401
        wrong = await http.post("/ui/api/login", json={"key": "not-the-key-000000"})
        assert wrong.status_code == 401 and wrong.json()["detail"] == {"field": "key"}
        assert "set-cookie" not in wrong.headers
        missing = await http.post("/ui/api/login", json={})
        assert missing.status_code == 422 and "key" in missing.json()["detail"]
        ok = await http.post("/ui/api/login", json={"key": KEY})
        assert ok.status_code == 200
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
        csrf = ok.json()["csrf"]
        assert (await http.get("/status")).status_code == 200
        assert (await http.get("/ui/api/session")).json()["csrf"] == csrf
        # a change needs the session's CSRF token
        no_token = await http.post("/crawl/stop", json={})
        assert no_token.status_code == 403 and "CSRF" in no_token.json()["error"]
        bad = await http.post("/crawl/stop", json={}, headers={"X-CSRF-Token": "x" * 43})
        assert bad.status_code == 403
        good = await http.post("/crawl/stop", json={}, headers={"X-CSRF-Token": csrf})
        assert good.status_code != 403 and good.status_code != 401
        # still no cross-site request, even with the cookie
        cross = await http.get("/status", headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403
        out = await http.post("/ui/api/logout", json={}, headers={"X-CSRF-Token": csrf})
        assert out.status_code == 200 and "Max-Age=0" in out.headers["set-cookie"]
        http.cookies.clear()
        http.cookies.set("crawld_session", cookie.split(";")[0].split("=", 1)[1])
        assert (await http.get("/status")).status_code == 401  # the session is gone


async def test_secure_cookie_behind_https(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(
        http=keyed() + '\npublic_url = "https://crawld.example"\nhosts = ["*"]'
    )
    async with client(daemon) as http:
        ok = await http.post("/ui/api/login", json={"key": KEY})
        assert ok.headers["set-cookie"].endswith("; Secure")


async def test_bearer_key_still_works_everywhere(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(http=keyed())
    async with client(daemon, headers={"Authorization": f"Bearer {KEY}"}) as http:
        assert (await http.get("/ui/api/jobs")).status_code == 200
        assert (await http.get("/ui/api/session")).json()["logged_in"] is True


async def test_curve_is_decimated_on_the_server(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    now = int(time.time() * 1000)
    await add_video(daemon, 42, snapshots=20_000, span_ms=20 * DAY_MS, now_ms=now)
    await add_video(daemon, 43, snapshots=240, span_ms=10 * DAY_MS, now_ms=now)
    async with client(daemon) as http:
        full = (await http.get("/ui/api/videos/42/curve", params={"range": "all"})).json()
        assert full["total"] == 20_000 and full["count"] == len(full["points"]) <= 1000
        assert full["points"][0][1] == 90_000 and full["points"][-1][1] == 90_000 + 100 * 19_999
        assert full["milestones"] == [100_000, 1_000_000, 2_000_000, 3_000_000]
        week = (await http.get("/ui/api/videos/42/curve", params={"range": "7d"})).json()
        assert 6900 <= week["total"] <= 7100 and week["count"] <= 1000
        small = (await http.get("/ui/api/videos/43/curve", params={"range": "7d"})).json()
        assert small["count"] == small["total"] == 168  # 24 a day: every snapshot drawn
        assert small["points"][0] == [small["points"][0][0], 90_000 + 100 * 72, 72 * 3, 72 * 2]
        six = (await http.get("/ui/api/videos/43/curve", params={"range": "6h"})).json()
        assert six["count"] == 6
        few = (await http.get("/ui/api/videos/42/curve", params={"points": 10})).json()
        assert few["count"] <= 10
        bad = await http.get("/ui/api/videos/42/curve", params={"range": "1y"})
        assert bad.status_code == 400 and bad.json()["detail"]["field"] == "range"
        assert (await http.get("/ui/api/videos/x/curve")).status_code == 400
        assert (await http.get("/ui/api/videos/9/curve")).status_code == 404
        assert (await http.get("/ui/api/videos/42/curve", params={"points": 1})).status_code == 400


async def test_search_and_jobs(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    await add_video(daemon, 7, title="星河 100%_done", uploader="洛天依bot")
    await add_video(daemon, 8, title="other", song=False)
    async with client(daemon) as http:

        def aids(answer: dict) -> list[int]:
            return [v["aid"] for v in answer["videos"]]

        assert aids((await http.get("/ui/api/videos")).json()) == [8, 7]
        assert aids((await http.get("/ui/api/videos", params={"q": "av7"})).json()) == [7]
        assert aids((await http.get("/ui/api/videos", params={"q": "100%_"})).json()) == [7]
        assert aids((await http.get("/ui/api/videos", params={"q": "0%x"})).json()) == []
        assert aids((await http.get("/ui/api/videos", params={"q": "洛天依"})).json()) == [7]
        found = (await http.get("/ui/api/videos", params={"q": "other"})).json()["videos"][0]
        assert found["song"] is False
        long = await http.get("/ui/api/videos", params={"q": "x" * 201})
        assert long.status_code == 400 and long.json()["detail"] == {"field": "q"}
        jobs = await http.get("/ui/api/jobs")
        assert jobs.json() == {"count": 0, "jobs": []}
        assert (await http.get("/ui/api/jobs", params={"kind": "x"})).status_code == 400
        assert (await http.get("/ui/api/jobs", params={"limit": 0})).status_code == 400


async def test_csv_download_with_the_session_cookie(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(http=keyed())
    await add_video(daemon, 9, snapshots=3)
    async with client(daemon) as http:
        await http.post("/ui/api/login", json={"key": KEY})
        answer = await http.get("/tracker/videos/9/snapshots", params={"format": "csv"},
                                headers={"Sec-Fetch-Site": "same-origin"})  # fmt: skip
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
        assert answer.text.count("\n") == 4


async def test_wrong_keys_at_the_login_are_limited_per_address(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(http=keyed())
    async with client(daemon) as http:
        for _ in range(5):
            wrong = await http.post("/ui/api/login", json={"key": "not-the-key-000000"})
            assert wrong.status_code == 401
        limited = await http.post("/ui/api/login", json={"key": "not-the-key-000000"})
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["retry-after"]) <= 12
        assert limited.json()["detail"] == {"retry_after_s": int(limited.headers["retry-after"])}
        assert "wrong keys" in limited.json()["error"]
        assert limited.headers["content-security-policy"]
        # the right key is not even compared while the address is held back
        assert (await http.post("/ui/api/login", json={"key": KEY})).status_code == 429
        bearer = {"Authorization": f"Bearer {KEY}"}
        status = (await http.get("/status", headers=bearer)).json()
        assert status["http"]["refused"]["login_rate"] == 2
        metrics = (await http.get("/metrics", headers=bearer)).text
        assert re.search(r'crawld_http_refused_total\{[^}]*reason="login_rate"', metrics)
    other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with client(daemon, transport=other) as http:
        assert (await http.post("/ui/api/login", json={"key": KEY})).status_code == 200


async def test_queue_history_counts_what_the_queue_took(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra='[broker]\nkind = "embedded"\nqueue = "rows"')
    assert daemon.outbox is not None
    await daemon.outbox.append("queue:rows", [NewItem(f"k{i}", b"{}") for i in range(3)])
    async with client(daemon) as http:
        answer = (await http.get("/ui/api/queue")).json()
    assert answer["queue"] == "rows" and len(answer["minutes"]) == 60
    assert answer["published_last_hour"] == 3
    assert answer["minutes"][-1]["depth"] == 3
    assert sum(m["published"] or 0 for m in answer["minutes"]) == 3
    assert "console" in [c.name for c in daemon.components]


async def test_jobs_carry_their_webhook_delivery_state(
    start_daemon: StartDaemon, silent_hook: str
) -> None:
    daemon = await start_daemon(extra=SILENT_HOOK)
    await add_webhook_jobs(daemon, silent_hook)
    async with client(daemon) as http:
        jobs = {j["id"]: j for j in (await http.get("/ui/api/jobs")).json()["jobs"]}
    stuck = jobs[STUCK_JOB]["delivery"]
    assert (stuck["cursor"], stuck["pending"], stuck["failed"], stuck["gone"]) == (0, 3, 1, None)
    gone = jobs[GONE_JOB]["delivery"]
    assert (gone["cursor"], gone["pending"]) == (3, 0)
    assert gone["gone"]["event_id"] == f"{GONE_JOB}:1" and gone["gone"]["skipped"] == 2
    assert jobs[PLAIN_JOB]["delivery"] is None
