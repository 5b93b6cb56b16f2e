from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from daemon.clock import EpochClock, trio_epoch_clock
from daemon.fakes.bilibili import HOUR_MS, BilibiliSim, Curve, bvid_of, serve_sim, stat_for
from daemon.store import Store
from daemon.tracker.bilibili import BiliClient, BiliError, NoProxyAvailable, UpstreamError
from daemon.tracker.config import Limit, ProxyConfig
from daemon.tracker.delegate import NetworkDelegate

START_MS = 1_750_000_000_000


# ---- curves (pure) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("curve", "age_h", "views"),
    [
        (Curve.linear(100), 0, 0),
        (Curve.linear(100), -1, 0),
        (Curve.linear(100, start=5), 2.5, 255),
        (Curve.decaying(1000, half_life_h=10), 10, 500),
        (Curve.decaying(1000, half_life_h=10), 20, 750),
        (Curve.decaying(1000, half_life_h=10), 1000, 1000),
        (Curve.viral(10_000, burst_at_h=24, burst_width_h=1), 0, 0),
        (Curve.viral(10_000, burst_at_h=24, burst_width_h=1), 24, 4999),
        (Curve.viral(10_000, burst_at_h=24, burst_width_h=1), 48, 9999),
        (Curve.viral(10_000, burst_at_h=24, burst_width_h=1, per_hour=10), 48, 10_479),
    ],
)
def test_curve_views(curve: Curve, age_h: float, views: int) -> None:
    assert curve.views(int(age_h * HOUR_MS)) == views


@pytest.mark.parametrize(
    "curve",
    [Curve.linear(3), Curve.decaying(5e5, 6), Curve.viral(2e6, 30, 3, per_hour=50, start=7)],
)
def test_curves_never_decrease(curve: Curve) -> None:
    seen = [curve.views(m * 60_000) for m in range(0, 7 * 24 * 60, 7)]
    assert seen == sorted(seen)


def test_bad_curve() -> None:
    with pytest.raises(ValueError):
        Curve.decaying(100, half_life_h=0)


def test_bvid_is_the_classic_mapping() -> None:
    assert bvid_of(170001) == "BV17x411w7KC"


# ---- over HTTP --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(sim: BilibiliSim) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        host, port = await nursery.start(
            functools.partial(serve_sim, sim, "127.0.0.1:0", shutdown=shutdown)
        )
        try:
            yield f"http://{host}:{port}"
        finally:
            shutdown.set()


def fresh(delegate: NetworkDelegate) -> NetworkDelegate:
    delegate.assume_idle()
    return delegate


@contextlib.asynccontextmanager
async def client_for(
    sim: BilibiliSim,
    clock: EpochClock,
    proxies: list[ProxyConfig] | None = None,
    margin_ms: int = 0,
) -> AsyncIterator[tuple[BiliClient, NetworkDelegate, str]]:
    async with serving(sim) as base, httpx.AsyncClient() as http:
        configs = [
            ProxyConfig(name=p.name, kind=p.kind, url=p.url.replace("http://SIM", base), tasks=p.tasks,
                        limits=p.limits, bulk_limits=p.bulk_limits)
            if p.url else p
            for p in proxies or [ProxyConfig(name="direct")]
        ]  # fmt: skip
        delegate = fresh(NetworkDelegate(configs, clock=clock, http=http, margin_ms=margin_ms))
        yield BiliClient(delegate, base), delegate, base
        await delegate.aclose()


async def test_every_endpoint_through_the_client(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock, seed=7)
    old = sim.add_video(
        title="【洛天依原创】星河",
        description="原创曲",
        tags=[("洛天依", "old_channel"), ("VOCALOID中文曲", "topic"), ("星河", "bgm")],
        published_ms=START_MS - 2 * HOUR_MS,
        curve=Curve.linear(600),
    )
    newer = sim.publish(3)
    async with client_for(sim, clock) as (client, _, _):
        page1 = await client.newlist(pn=1, ps=2)
        page2 = await client.newlist(pn=2, ps=2)
        page3 = await client.newlist(pn=3, ps=2)
        assert page1.value + page2.value == [*reversed(newer), old]  # newest first
        assert page3.value == []

        detail = (await client.view_detail(old)).value
        assert detail.title == "【洛天依原创】星河"
        assert detail.tags == ["洛天依", "VOCALOID中文曲"]
        assert detail.published_ms == START_MS - 2 * HOUR_MS
        assert detail.stat.views == 1200
        assert detail.uploader.fans > 0 and detail.uploader.name.startswith("UP主")

        await trio.sleep(3600)
        stat = await client.view_stat(old)
        assert 1800 <= stat.value.views <= sim.views(old)
        assert abs(stat.server_ms - clock()) < 1000

        bulk = await client.bulk_stats([old, *newer, 999])
        assert set(bulk.value) == {old, *newer}
        views = bulk.value[old].views
        assert views >= 1800
        assert bulk.value[old].likes == stat_for(views)["like"]
    assert sim.requests == {"newlist": 3, "view_detail": 1, "view": 1, "bulk": 1}


async def test_videos_appear_in_newlist_over_time(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    later = sim.add_video(published_ms=START_MS + 60_000)
    sim.stream(20_000)
    async with client_for(sim, clock) as (client, _, _):
        assert (await client.newlist(1, 10)).value == []
        with pytest.raises(BiliError) as caught:
            await client.view_stat(later)  # not published yet
        assert caught.value.code == -404
        await trio.sleep(61)
        aids = (await client.newlist(1, 10)).value
        assert len(aids) == 4 and later in aids
        assert aids == sorted(aids, key=lambda a: -sim.video(a).published_ms)


@pytest.mark.parametrize("code", [-404, 62002, 62012])
async def test_deleted_videos(code: int, autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    gone, kept = sim.publish(2)
    sim.delete(gone, code)
    async with client_for(sim, clock) as (client, _, _):
        for call in (client.view_stat, client.view_detail):
            with pytest.raises(BiliError) as caught:
                await call(gone)
            assert caught.value.code == code and caught.value.video_gone
        assert set((await client.bulk_stats([gone, kept])).value) == {kept}
        assert (await client.newlist(1, 10)).value == [kept]


async def test_injected_errors(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    (aid,) = sim.publish(1)
    sim.inject("view", -400, times=2)
    sim.inject("bulk", http_status=503)
    async with client_for(sim, clock) as (client, _, _):
        for _ in range(2):
            with pytest.raises(BiliError) as caught:
                await client.view_stat(aid)
            assert caught.value.code == -400 and not caught.value.video_gone
        assert (await client.view_stat(aid)).value.views == 0
        with pytest.raises(UpstreamError) as upstream:
            await client.bulk_stats([aid])
        assert upstream.value.status == 503
        assert aid in (await client.bulk_stats([aid])).value
    assert sim.faults_served == {"view code -400": 2, "bulk HTTP 503": 1}
    with pytest.raises(ValueError):
        sim.inject("nope", -400)


async def test_412_when_a_client_goes_too_fast(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    (aid,) = sim.publish(1)
    loose = [Limit(requests=1000, per=1.0)]  # type: ignore[arg-type]
    async with client_for(sim, clock, [ProxyConfig(name="loose", limits=loose)]) as (
        client,
        delegate,
        _,
    ):
        results = []
        for _ in range(22):
            try:
                await client.view_stat(aid)
                results.append("ok")
            except BiliError as exc:
                assert exc.rate_limited
                results.append("412")
            except NoProxyAvailable:
                results.append("limited")
        # 20 go, the 21st is refused by Bilibili, after which the delegate holds back
        assert results == ["ok"] * 20 + ["412", "limited"]
        assert delegate.status()[0]["refused_412"] == 1
    assert sim.rejected_412 == 1


async def test_a_client_within_its_limits_never_sees_412(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(
        clock,
        bulk_limits=[Limit(requests=5, per=1.0), Limit(requests=40, per=15.0)],  # type: ignore[arg-type]
        latency_ms=(50, 200),
    )
    aids = sim.publish(60)
    async with client_for(sim, clock) as (client, delegate, _):

        async def worker(n: int) -> None:
            for i in range(30):
                if n % 2:
                    await delegate.request(
                        f"{client.base_url}/x/web-interface/view?aid={aids[i]}", "snapshot", wait=60
                    )
                else:
                    await delegate.request(
                        f"{client.base_url}/medialist/gateway/base/resource/infos?"
                        f"resources={aids[i]}:2,",
                        "bulk",
                        wait=60,
                    )

        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(worker, n)
    assert sim.requests["view"] == 90 and sim.requests["bulk"] == 90
    assert sim.rejected_412 == 0


async def test_two_relays_one_limited(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    (aid,) = sim.publish(1)
    relays = [
        ProxyConfig(name=n, kind="relay", url=f"http://SIM/_sim/relay/{n}") for n in ("a", "b")
    ]
    async with client_for(sim, clock, relays) as (client, delegate, _):
        delegate._proxies["a"].limiter.exhaust(clock())
        got = [await client.view_stat(aid) for _ in range(15)]
        assert {g.proxy for g in got} == {"b"}
        assert all(g.value.views == 0 for g in got)
        assert all(abs(g.server_ms - clock()) < 1000 for g in got)
        for _ in range(5):
            await client.view_stat(aid)  # b's burst of 20 is spent, a still limited
        with pytest.raises(NoProxyAvailable):
            await client.view_stat(aid)
        await trio.sleep(1)
        assert (await client.view_stat(aid)).proxy in {"a", "b"}
    assert sim.requests_by_client["relay:b"] >= 20
    assert sim.requests_by_client.total() == 21
    assert sim.rejected_412 == 0


async def test_relay_reaches_only_the_simulated_endpoints(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sim = BilibiliSim(trio_epoch_clock(START_MS))
    relay = [ProxyConfig(name="r", kind="relay", url="http://SIM/_sim/relay")]
    async with client_for(sim, sim.clock, relay) as (_, delegate, base):
        with pytest.raises(UpstreamError) as caught:
            await delegate.request("http://169.254.169.254/latest/meta-data", "snapshot")
        assert caught.value.status == 502
        async with httpx.AsyncClient() as http:
            bad = await http.post(f"{base}/_sim/relay", content=b"{}")
        assert bad.status_code == 422


@pytest.mark.parametrize("clean", [True, False])
async def test_restart_keeps_limits(
    clean: bool, store: Store, autojump_clock: trio.testing.MockClock
) -> None:
    """A daemon that spent its burst and restarts (cleanly or after a crash) stays within the
    limits Bilibili enforces: the simulator answers no -412."""
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    (aid,) = sim.publish(1)
    url_path = f"/x/web-interface/view?aid={aid}"
    async with serving(sim) as base, httpx.AsyncClient() as http:
        first = fresh(NetworkDelegate([ProxyConfig(name="d")], clock=clock, http=http, margin_ms=0))
        for _ in range(20):
            await first.request(base + url_path, "snapshot")
        await first.save_state(store, final=clean)

        second = NetworkDelegate([ProxyConfig(name="d")], clock=clock, http=http, margin_ms=0)
        before_load = clock()
        await second.load_state(store)
        saved, restored = first.state(), second.state()
        if clean:
            assert restored == saved
        else:  # every window as if its whole burst was spent at the restart
            limiter = second._proxies["d"].limiter
            for key, tat_ms in limiter.tats_ms().items():
                assert tat_ms >= max(saved[("d", key)], before_load + limiter.windows[key].per_ms)
        for _ in range(200):
            await second.request(base + url_path, "snapshot", wait=10)
    assert sim.requests["view"] == 220
    assert sim.rejected_412 == 0


async def test_latency_and_server_time(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock, latency_ms=(50, 200))
    (aid,) = sim.publish(1)
    async with client_for(sim, clock) as (client, _, _):
        for _ in range(10):
            before = clock()
            got = await client.view_stat(aid)
            after = clock()
            assert after - before >= 50
            assert before + 25 <= got.server_ms <= after - 25


async def test_sim_controls_over_http(autojump_clock: trio.testing.MockClock) -> None:
    sim = BilibiliSim(trio_epoch_clock(START_MS))
    async with serving(sim) as base, httpx.AsyncClient(base_url=base) as http:
        added = (
            await http.post(
                "/_sim/videos",
                json={"aid": 5000, "title": "【言和】翻唱", "tags": ["言和", "翻唱"],
                      "curve": {"kind": "linear", "per_hour": 3600}},
            )
        ).json()  # fmt: skip
        assert added["aid"] == 5000 and added["views"] == 0
        assert (await http.post("/_sim/videos", json={"aid": 5000})).status_code == 409
        published = (await http.post("/_sim/publish", json={"count": 3})).json()["aids"]
        assert len(published) == 3
        await trio.sleep(10)
        assert (await http.get("/_sim/videos/5000")).json()["views"] == 10
        curve = await http.post("/_sim/videos/5000/curve", json={"kind": "linear", "start": 7})
        assert curve.json()["views"] == 7
        bad_curve = await http.post("/_sim/videos/5000/curve", json={"half_life_h": 0})
        assert bad_curve.status_code == 422
        assert (await http.post("/_sim/videos/5000/delete", json={"code": 62012})).json()[
            "gone"
        ] == 62012
        assert (await http.post("/_sim/videos/5000/delete", json={"code": 1})).status_code == 422
        assert (await http.get("/_sim/videos/nope")).status_code == 404
        inject = await http.post(
            "/_sim/inject", json={"endpoint": "view", "code": -352, "times": 2}
        )
        assert inject.json() == {"pending": {"view": 2}}
        assert (await http.post("/_sim/inject", json={"endpoint": "view"})).status_code == 422
        assert (
            await http.post("/_sim/latency", json={"min_ms": 9, "max_ms": 1})
        ).status_code == 422
        assert (
            await http.post("/_sim/latency", json={"min_ms": 1, "max_ms": 9})
        ).status_code == 200
        answer = await http.get("/x/web-interface/view", params={"aid": published[0]})
        assert answer.json()["code"] == -352
        bad = await http.get("/medialist/gateway/base/resource/infos", params={"resources": "x"})
        assert bad.json()["code"] == -400
        stats = (await http.get("/_sim/stats")).json()
        assert stats["videos"] == 4 and stats["gone"] == 1
        assert stats["requests"] == {"view": 1, "bulk": 1}


async def test_412_in_a_200_answer_also_holds_the_proxy_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    (aid,) = sim.publish(1)
    sim.inject("view", -412)
    async with client_for(sim, clock) as (client, delegate, _):
        with pytest.raises(BiliError) as caught:
            await client.view_stat(aid)
        assert caught.value.rate_limited
        assert delegate.status()[0]["refused_412"] == 1
        with pytest.raises(NoProxyAvailable):
            await client.view_stat(aid)
        await trio.sleep(1)
        assert (await client.view_stat(aid)).value.views == 0


async def test_newlist_paging_and_bad_parameters(autojump_clock: trio.testing.MockClock) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    aids = [sim.add_video(published_ms=START_MS - (100 - i) * 1000) for i in range(95)]
    sim.delete(aids[-1], 62002)
    async with serving(sim) as base, httpx.AsyncClient(base_url=base) as http:

        async def page(**params: object) -> dict[str, object]:
            answer = await http.get("/x/web-interface/newlist", params=params)
            result: dict[str, object] = answer.json()
            return result

        seen = []
        for pn in range(1, 5):
            data = (await page(rid=30, ps=30, pn=pn))["data"]
            seen += [a["aid"] for a in data["archives"]]  # type: ignore[index]
        assert seen == list(reversed(aids[:-1]))  # newest first, the hidden one left out
        assert (await page(rid=31, ps=30, pn=1))["data"] == {
            "archives": [], "page": {"count": 0, "num": 1, "size": 0}
        }  # fmt: skip
        for bad in ({"ps": 0}, {"ps": 51}, {"pn": 0}, {"pn": "x"}):
            assert (await page(rid=30, **bad))["code"] == -400
        assert (await http.get("/x/web-interface/view")).json()["code"] == -400
        assert (await http.get("/x/web-interface/nope")).status_code == 404


@pytest.mark.parametrize("margin_ms", [0, 100])
async def test_transit_jitter_needs_the_margin(
    margin_ms: int, autojump_clock: trio.testing.MockClock
) -> None:
    """Requests sent exactly at the limit but delayed unevenly in transit (0-60 ms) arrive
    closer together than they were sent: without a margin Bilibili sees the limit exceeded."""
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock, seed=3, transit_ms=(0, 60))
    (aid,) = sim.publish(1)
    url = None
    async with client_for(sim, clock, margin_ms=margin_ms) as (client, delegate, _):
        url = f"{client.base_url}/x/web-interface/view?aid={aid}"

        async def worker() -> None:
            for _ in range(60):
                with contextlib.suppress(UpstreamError):  # a 412
                    await delegate.request(url, "snapshot", wait=60)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(worker)
    assert sim.requests["view"] == 480
    if margin_ms:
        assert sim.rejected_412 == 0
    else:
        assert sim.rejected_412 > 0
