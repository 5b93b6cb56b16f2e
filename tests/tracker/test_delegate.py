from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable

import httpx
import pytest
import trio
import trio.testing

from daemon.clock import EpochClock, trio_epoch_clock
from daemon.store import Store
from daemon.tracker import limiter_store
from daemon.tracker.bilibili import NoProxyAvailable, UpstreamError
from daemon.tracker.config import Limit, ProxyConfig
from daemon.tracker.delegate import NetworkDelegate

START_MS = 1_700_000_000_000
URL = "https://api.bilibili.com/x/web-interface/view?aid=1"
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def ok_handler(seen: list[httpx.Request]) -> Handler:
    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b'{"code":0}')

    return handle


def make(
    proxies: list[ProxyConfig], handler: Handler, seed: int = 1, clock: EpochClock | None = None
) -> NetworkDelegate:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return NetworkDelegate(
        proxies,
        clock=clock or trio_epoch_clock(START_MS),
        http=http,
        rng=random.Random(seed),
        margin_ms=0,  # exact bursts, for counting
    )


def relay(name: str) -> ProxyConfig:
    return ProxyConfig(name=name, kind="relay", url=f"http://relay.invalid/{name}")


async def test_requests_spread_over_proxies_and_skip_limited_ones() -> None:
    seen: list[httpx.Request] = []
    delegate = make([ProxyConfig(name="a"), ProxyConfig(name="b")], ok_handler(seen))
    delegate.assume_idle()
    used = Counter([(await delegate.request(URL, "snapshot")).proxy for _ in range(10)])
    assert set(used) == {"a", "b"} and sum(used.values()) == 10
    delegate._proxies["a"].limiter.exhaust(delegate.clock())
    used = Counter([(await delegate.request(URL, "snapshot")).proxy for _ in range(8)])
    assert used == {"b": 8}
    assert delegate.status()[0]["skipped_limited"] > 0


async def test_no_proxy_only_when_every_proxy_is_limited(
    mock_clock: trio.testing.MockClock,
) -> None:
    """On a clock that stands still: a loaded host must not refill the bursts meanwhile."""
    seen: list[httpx.Request] = []
    delegate = make([ProxyConfig(name="a"), ProxyConfig(name="b")], ok_handler(seen))
    delegate.assume_idle()
    for _ in range(40):  # 20 + 20: both bursts
        await delegate.request(URL, "snapshot")
    with pytest.raises(NoProxyAvailable) as caught:
        await delegate.request(URL, "snapshot")
    assert caught.value.task == "snapshot"
    assert caught.value.retry_in_ms is not None and 0 < caught.value.retry_in_ms <= 50
    assert len(seen) == 40


async def test_only_the_task_kinds_proxies_are_used() -> None:
    seen: list[httpx.Request] = []
    delegate = make(
        [ProxyConfig(name="a", tasks=["bulk"]), ProxyConfig(name="b", tasks=["snapshot"])],
        ok_handler(seen),
    )
    delegate.assume_idle()
    assert {(await delegate.request(URL, "bulk")).proxy for _ in range(5)} == {"a"}
    with pytest.raises(NoProxyAvailable):
        await delegate.request(URL, "bulk")  # b has room but is not a bulk proxy
    with pytest.raises(NoProxyAvailable):
        await delegate.request(URL, "discovery")  # nobody serves discovery


async def test_waiting_for_room_instead_of_raising(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[httpx.Request] = []
    delegate = make([ProxyConfig(name="a")], ok_handler(seen))
    delegate.assume_idle()
    start = trio.current_time()
    for _ in range(10):
        await delegate.request(URL, "bulk", wait=5.0)
    # 5 at once, then one per 200 ms (the 5/1 s bulk window)
    assert trio.current_time() - start == pytest.approx(1.0, abs=0.01)
    assert len(seen) == 10


async def test_room_is_what_the_task_kinds_proxies_let_through_now() -> None:
    seen: list[httpx.Request] = []
    delegate = make(
        [ProxyConfig(name="a", tasks=["bulk"]), ProxyConfig(name="b", tasks=["snapshot", "bulk"])],
        ok_handler(seen),
        clock=lambda: START_MS,
    )
    delegate.assume_idle()
    # the bulk windows: 5 at once and one per 200 ms, on each of the two proxies
    assert await delegate.room("bulk", 1000, 100) == 18
    assert await delegate.room("bulk", 1000, 7) == 7
    assert await delegate.room("snapshot", 1000, 100) == 39  # b alone: 20 at once, 19 more
    assert await delegate.room("discovery", 1000, 100) == 0
    for _ in range(5):
        await delegate.request(URL, "bulk")
    assert await delegate.room("bulk", 1000, 100) == 13  # reserves nothing itself
    delegate.penalize("a")
    delegate.penalize("b")
    assert await delegate.room("bulk", 200, 100) == 0


@pytest.mark.parametrize("status", [500, 502, 412, 404])
async def test_http_errors_propagate_without_trying_another_proxy(status: int) -> None:
    calls: list[httpx.Request] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(status, content=b'{"code":-412,"message":"x"}')

    delegate = make([ProxyConfig(name="a"), ProxyConfig(name="b")], handle)
    delegate.assume_idle()
    with pytest.raises(UpstreamError) as caught:
        await delegate.request(URL, "snapshot")
    assert caught.value.status == status
    assert caught.value.body.startswith(b'{"code":-412')
    assert len(calls) == 1
    proxy = delegate._proxies[caught.value.proxy]
    assert proxy.errors == 1
    if status == 412:  # Bilibili's refusal: the proxy's windows count as spent
        assert not proxy.limiter.try_acquire(delegate.clock(), bulk=False)


async def test_network_error_is_upstream_error_with_redacted_url() -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    delegate = make([ProxyConfig(name="a")], handle)
    delegate.assume_idle()
    with pytest.raises(UpstreamError) as caught:
        await delegate.request(URL, "snapshot")
    assert "aid=***" in str(caught.value)
    assert caught.value.status is None


async def test_server_time_is_the_midpoint(autojump_clock: trio.testing.MockClock) -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        await trio.sleep(0.4)
        return httpx.Response(200, content=b"{}")

    delegate = make([ProxyConfig(name="a")], handle)
    delegate.assume_idle()
    before = delegate.clock()
    got = await delegate.request(URL, "snapshot")
    assert got.server_ms == pytest.approx(before + 200, abs=2)
    assert got.value == b"{}"


async def test_relay_answers() -> None:
    posted: list[dict[str, str]] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        posted.append(body)
        if request.url.path == "/bad":
            return httpx.Response(200, json={"statusCode": 503, "body": "busy"})
        if request.url.path == "/broken":
            return httpx.Response(200, content=b"not json")
        return httpx.Response(
            200, json={"statusCode": 200, "body": '{"code":0}', "serverTime": 1234}
        )

    for name, error in (("ok", None), ("bad", 503), ("broken", None)):
        delegate = make([relay(name)], handle)
        delegate.assume_idle()
        if name == "ok":
            got = await delegate.request(URL, "snapshot")
            assert (got.value, got.server_ms, got.proxy) == (b'{"code":0}', 1234, "ok")
        else:
            with pytest.raises(UpstreamError) as caught:
                await delegate.request(URL, "snapshot")
            assert caught.value.status == error
    assert posted[0] == {"url": URL}


async def test_proxy_clients_and_status_redact_credentials() -> None:
    delegate = NetworkDelegate(
        [
            ProxyConfig(name="h", kind="http", url="http://user:secret@127.0.0.1:9/"),
            ProxyConfig(name="s", kind="socks5", url="socks5://user:secret@127.0.0.1:9"),
            ProxyConfig(name="r", kind="relay", url="https://fc.example/run?token=secret"),
        ],
        clock=lambda: START_MS,
    )
    status = delegate.status()
    assert "secret" not in json.dumps(status)
    assert [s["kind"] for s in status] == ["http", "socks5", "relay"]
    assert {w["window"] for w in status[0]["limits"]} >= {"all:20/1000ms", "bulk:5/1000ms"}
    await delegate.aclose()


async def test_apply_keeps_unchanged_windows() -> None:
    seen: list[httpx.Request] = []
    delegate = make([ProxyConfig(name="a"), ProxyConfig(name="b")], ok_handler(seen))
    delegate.assume_idle()
    a_state = dict(delegate._proxies["a"].limiter.tats)
    delegate.apply(
        [
            ProxyConfig(name="a", limits=[Limit(requests=1, per=1.0)]),  # type: ignore[arg-type]
            ProxyConfig(name="c"),
        ]
    )
    a = delegate._proxies["a"].limiter.tats
    assert a["all:1/1000ms"] > delegate.clock()  # a new window starts conservative
    assert a["bulk:5/1000ms"] == a_state["bulk:5/1000ms"]
    assert set(delegate._proxies) == {"a", "c"}
    with pytest.raises(ValueError):
        delegate.apply([])


async def test_state_survives_a_clean_restart_and_is_conservative_after_a_crash(
    store: Store,
) -> None:
    seen: list[httpx.Request] = []

    def frozen() -> int:
        return START_MS

    first = make([ProxyConfig(name="a")], ok_handler(seen), clock=frozen)
    await first.load_state(store)
    first.assume_idle()
    for _ in range(3):
        await first.request(URL, "bulk")
    await first.save_state(store, final=True)

    second = make([ProxyConfig(name="a")], ok_handler(seen), clock=frozen)
    await second.load_state(store)
    # exactly the 2 bulk requests left of the 5/1 s burst
    assert [second._proxies["a"].limiter.try_acquire(second.clock(), bulk=True)
            for _ in range(3)] == [True, True, False]  # fmt: skip
    await second.save_state(store)  # periodic save, then a crash (no final save)

    third = make([ProxyConfig(name="a")], ok_handler(seen), clock=frozen)
    third.assume_idle()
    await third.load_state(store)
    assert all(w["fill"] == 1 for w in third.status()[0]["limits"])
    assert not third._proxies["a"].limiter.try_acquire(third.clock(), bulk=False)


async def test_a_refused_shared_proxy_gets_room_again_once_its_windows_pass(store: Store) -> None:
    """A -412 through a proxy shared in the store is charged there by the next count of its
    room, not left for a reservation a tick without room would never make (the proxy would
    have no room for good, and the instance would stop claiming)."""
    answers = [412]

    async def handle(request: httpx.Request) -> httpx.Response:
        if answers:
            return httpx.Response(200, json={"statusCode": answers.pop(), "body": "{}"})
        return httpx.Response(200, json={"statusCode": 200, "body": "{}"})

    proxy = ProxyConfig(
        name="r1",
        kind="relay",
        url="http://relay.invalid/r1",
        limits=[Limit(requests=100, per=1)],
        bulk_limits=[Limit(requests=5, per=1)],
    )
    delegate = NetworkDelegate(
        [proxy],
        clock=trio_epoch_clock(START_MS),
        http=httpx.AsyncClient(transport=httpx.MockTransport(handle)),
        shared=store,
        instance="a",
    )
    windows = delegate._proxies["r1"].limiter.applicable(True)
    await store.write(lambda c: limiter_store.reserve(c, "r1", windows, now_ms=0))  # idle
    assert await delegate.room("bulk", 100, 100) == 4  # the burst (a margin kept unused)
    with pytest.raises(UpstreamError) as refused:
        await delegate.request(URL, "bulk")
    assert refused.value.status == 412
    assert await delegate.room("bulk", 100, 100) == 0  # its windows count as spent now
    assert await delegate.room("bulk", 5000, 100) > 0  # and pass: ticks claim again
    stored = await store.read(
        lambda c: dict(c.execute("SELECT limit_key, tat_ms FROM tracker_limiter").fetchall())
    )
    now = await store.read(lambda c: c.execute("SELECT crawld_now_ms()").fetchone()[0])
    assert stored and all(tat >= now for tat in stored.values())  # charged in the store
