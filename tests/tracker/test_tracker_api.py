"""The tracker inside a running daemon: its routes, /status, /metrics and reload."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.app import Daemon
from daemon.fakes.bilibili import BilibiliSim, Curve, serve_sim
from tests.conftest import serve_daemon

TEMPLATE = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[collector]
auto_start = false
[tracker]
enabled = {enabled}
base_url = "{base}"
discovery_interval = "{discovery}"
window = "{window}"
{extra}"""


@dataclass
class Running:
    daemon: Daemon
    sim: BilibiliSim
    path: Path
    base: str
    http: httpx.AsyncClient

    def url(self, path: str) -> str:
        assert self.daemon.http_address is not None
        host, port = self.daemon.http_address
        return f"http://{host}:{port}{path}"

    def write(
        self, enabled: bool = True, discovery: str = "1m", window: str = "5m", extra: str = ""
    ) -> None:
        text = TEMPLATE.format(
            enabled=str(enabled).lower(), base=self.base, discovery=discovery, window=window,
            extra=extra,
        )  # fmt: skip
        self.path.write_text(text)

    async def get(self, path: str, **params: Any) -> httpx.Response:
        return await self.http.get(self.url(path), params=params)

    async def video_when(self, aid: int, ready: Any) -> dict[str, Any]:
        with trio.fail_after(20):
            while True:
                answer = await self.get(f"/tracker/videos/{aid}")
                if answer.status_code == 200 and ready(answer.json()):
                    return dict(answer.json())
                await trio.sleep(0.05)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    sim = BilibiliSim(seed=3)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                sim, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        path = tmp_path / "crawld.toml"
        async with httpx.AsyncClient() as http:
            r = Running(None, sim, path, f"http://{host}:{port}", http)  # type: ignore[arg-type]
            r.write()
            r.daemon = await serve_daemon(nursery, path)
            yield r
            r.daemon.request_stop()
        stop.set()


async def test_track_a_video_and_read_it(running: Running) -> None:
    now = int(time.time() * 1000)
    aid = running.sim.add_video(
        aid=170001, title="【洛天依原创】星河", tags=["洛天依", "VOCALOID中文曲"],
        published_ms=now - 3_600_000, curve=Curve.linear(600, start=99_000),
    )  # fmt: skip
    first = await running.http.post(running.url("/tracker/videos"), json={"aid": aid})
    if first.status_code == 409:  # discovery (runs at start) was faster
        pass
    else:
        assert first.status_code == 202, first.text
        assert first.json()["aid"] == aid and first.json()["tracker_enabled"] is True
    again = await running.http.post(running.url("/tracker/videos"), json={"aid": aid})
    assert again.status_code == 409
    assert again.json() == {"error": f"video {aid} is already tracked", "detail": {"aid": aid}}

    video = await running.video_when(aid, lambda v: v.get("song"))
    assert video["status"] == "ok" and video["title"] == "【洛天依原创】星河"
    assert video["label"]["label"] == 1 and video["label"]["model_version"]
    assert video["uploader"]["uid"] > 0
    assert video["latest_snapshot"]["views"] >= 99_600
    assert [s["type"] for s in video["schedules"]].count("new") == 4
    assert video["milestone"]["target"] == 100_000

    series = await running.get(f"/tracker/videos/{aid}/snapshots", limit=1)
    assert series.status_code == 200
    body = series.json()
    assert body["count"] == 1 and body["snapshots"][0]["views"] >= 99_600
    csv = await running.get(f"/tracker/videos/{aid}/snapshots", format="csv")
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.strip().split("\n")
    assert lines[0] == "at_ms,views,danmakus,replies,likes,coins,shares,favorites"
    assert len(lines) >= 2

    milestones = (await running.get("/tracker/milestones", limit=5)).json()
    assert aid in [s["aid"] for s in milestones["songs"]]
    schedules = (await running.get("/tracker/schedules")).json()
    assert schedules["counts"]["new"]["pending"] >= 4
    assert len(schedules["windows"]) == 12 and schedules["windows"][0]["capacity"] == 3000

    with trio.fail_after(20):
        while (status := (await running.get("/status")).json()["tracker"])["discovery"][
            "last_run_ms"
        ] is None:
            await trio.sleep(0.05)
    assert status["enabled"] is True and status["songs_tracked"] >= 1
    assert status["proxies"][0]["name"] == "direct"
    assert set(status["lag"]) == {"new", "milestone", "normal", "archive"}
    metrics = (await running.get("/metrics")).text
    assert 'crawld_tracker_schedules{status="pending",type="new"}' in metrics
    assert 'crawld_tracker_snapshots_total{type="ingest"}' in metrics
    openapi = (await running.get("/openapi.json")).json()
    for path in ("/tracker/videos/{aid}", "/tracker/videos/{aid}/snapshots",
                 "/tracker/videos", "/tracker/milestones", "/tracker/schedules"):  # fmt: skip
        assert path in openapi["paths"]


async def test_pagination_with_next(running: Running) -> None:
    aid = running.sim.add_video(aid=170002, song=False)
    await running.http.post(running.url("/tracker/videos"), json={"aid": aid})
    await running.video_when(aid, lambda v: v.get("latest_snapshot"))
    store = running.daemon.store
    assert store is not None
    await store.write(
        lambda c: c.executemany(
            "INSERT INTO tracker_snapshots VALUES (?, ?, ?, 0, 0, 0, 0, 0, 0)",
            [(aid, 1000 + i, i) for i in range(5)],
        )
    )
    seen: list[int] = []
    url: str | None = f"/tracker/videos/{aid}/snapshots?limit=2&until=2000"
    while url:
        page = (await running.http.get(running.url(url))).json()
        seen += [s["at_ms"] for s in page["snapshots"]]
        url = page["next"]
    assert seen == [1000, 1001, 1002, 1003, 1004]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("GET", "/tracker/videos/abc", None, 400, "aid must be a positive integer (or avNNN)"),
        ("GET", "/tracker/videos/0", None, 400, "aid must be a positive integer (or avNNN)"),
        ("GET", "/tracker/videos/987654", None, 404, "video 987654 is not tracked"),
        ("GET", "/tracker/videos/987654/snapshots", None, 404, "video 987654 is not tracked"),
        ("GET", "/tracker/videos/1/snapshots?limit=0", None, 400,
         "query parameter 'limit' must be between 1 and 10000"),
        ("GET", "/tracker/videos/1/snapshots?format=xml", None, 400, "format must be json or csv"),
        ("GET", "/tracker/milestones?limit=x", None, 400,
         "query parameter 'limit' must be an integer"),
        ("POST", "/tracker/videos", b"{", 400, "request body is not valid JSON"),
        ("POST", "/tracker/videos", b"", 400, "request body is required"),
        ("POST", "/tracker/videos", b'{"aid": -5}', 422, "invalid request body"),
        ("POST", "/tracker/videos", b'{"aid": "x"}', 422, "invalid request body"),
        ("POST", "/tracker/videos", b'{"aid": 5, "x": 1}', 422, "invalid request body"),
    ],
)  # fmt: skip
async def test_bad_input(
    running: Running, method: str, path: str, body: bytes | None, status: int, error: str
) -> None:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    answer = await running.http.request(method, running.url(path), content=body, headers=headers)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == error


async def test_reload_turns_the_tracker_off_and_on(running: Running) -> None:
    service = running.daemon.parts["tracker"]
    assert service.gate.open
    running.write(enabled=False)
    assert await running.daemon.reload()
    assert not service.gate.open
    status = (await running.get("/status")).json()
    assert status["tracker"]["enabled"] is False
    proxies = '[[tracker.proxies]]\nname = "a"\n[[tracker.proxies]]\nname = "b"\ntasks = ["bulk"]\n'
    running.write(enabled=True, discovery="10m", window="1m", extra=proxies)
    assert await running.daemon.reload()
    assert service.gate.open and service.config.discovery_interval == 600
    states = running.daemon.component_states
    assert states["tracker-snapshot-tick"].state == "running"
    status = (await running.get("/status")).json()["tracker"]
    assert [p["name"] for p in status["proxies"]] == ["a", "b"]
    window = await running.daemon.store.read(  # type: ignore[union-attr]
        lambda c: c.execute("SELECT window_ms FROM tracker_settings").fetchone()[0]
    )
    assert window == 60_000
