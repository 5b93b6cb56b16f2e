"""HostConnections: a destination host's keep-alive connections behind `send_vetted`, against
real sockets (the bundled receiver)."""

from __future__ import annotations

import httpcore
import httpx
import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.net.connections import HostConnections, httpx_error
from daemon.net.ssrf import VettingCache, error_kind, new_transport, parse_networks, send_vetted
from tests.jobs.conftest import FakeResolver

LOOPBACK = parse_networks(["127.0.0.0/8"])


async def post(
    conns: HostConnections,
    url: str,
    *,
    max_body: int = 4096,
    cache: VettingCache | None = None,
    now: float = 0.0,
) -> int:
    answer = await send_vetted(
        conns, url, b"{}", {}, LOOPBACK, 2.0, max_body=max_body, cache=cache, now=now
    )
    return answer.status


async def test_sequential_requests_share_one_connection(rx: WebhookReceiver) -> None:
    async with new_transport(max_connections=2, verify=False) as conns:
        for _ in range(5):
            assert await post(conns, rx.url()) == 200
        assert (conns.opened, conns.idle) == (1, 1)
    assert conns.idle == 0  # closed
    assert len(rx.requests) == 5


async def test_concurrent_requests_get_a_connection_each_and_keep_at_most_max_idle(
    rx: WebhookReceiver,
) -> None:
    rx.delay_next(3, 0.05)  # the three overlap
    async with new_transport(max_connections=2, verify=False) as conns:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(post, conns, rx.url())
        assert (conns.opened, conns.idle) == (3, 2)
        assert await post(conns, rx.url()) == 200
        assert conns.opened == 3


async def test_an_answer_not_read_to_the_end_closes_its_connection(rx: WebhookReceiver) -> None:
    async with new_transport(verify=False) as conns:
        assert await post(conns, rx.url(), max_body=4) == 200  # '{"ok":true}' cut at 4 bytes
        assert conns.idle == 0
        assert await post(conns, rx.url()) == 200
        assert (conns.opened, conns.idle) == (2, 1)


async def test_a_connection_the_server_closed_is_not_reused(rx: WebhookReceiver) -> None:
    async with new_transport(verify=False) as conns:
        assert await post(conns, rx.url()) == 200
        await rx.die()  # drops the kept-alive connection
        await rx.revive()
        with trio.fail_after(5):
            while not (conns._idle and conns._idle[0].has_expired()):
                await trio.sleep(0.005)  # the server's FIN arrives
        assert await post(conns, rx.url()) == 200
        assert conns.opened == 2


async def test_a_new_vetted_address_gets_a_new_connection(
    rx: WebhookReceiver, resolver: FakeResolver
) -> None:
    # Same name and port, another address (the name was re-vetted after its cache entry expired):
    # the kept-alive connection to the old address must not carry the request.
    async with open_receiver(bind=f"127.0.0.2:{rx.port}") as other:
        resolver.table["hooks.test"] = ["127.0.0.1"]
        url = f"http://hooks.test:{rx.port}/hook"
        cache = VettingCache(ttl=30)
        async with new_transport(verify=False) as conns:
            assert await post(conns, url, cache=cache, now=0.0) == 200
            resolver.table["hooks.test"] = ["127.0.0.2"]
            assert await post(conns, url, cache=cache, now=31.0) == 200
            assert conns.opened == 2
    assert len(rx.requests) == 1 and len(other.requests) == 1


async def test_failures_come_out_as_httpx_errors_and_drop_the_connection(
    rx: WebhookReceiver,
) -> None:
    async with new_transport(verify=False) as conns:
        rx.delay_next(1, 1.0)
        with pytest.raises(httpx.TimeoutException) as timeout:
            await send_vetted(conns, rx.url(), b"{}", {}, LOOPBACK, 0.1)
        assert error_kind(timeout.value) == "timeout"
        assert conns.idle == 0
        await rx.die()
        with pytest.raises(httpx.ConnectError) as refused:
            await send_vetted(conns, rx.url(), b"{}", {}, LOOPBACK, 2.0)
        assert error_kind(refused.value) == "connect"
        assert conns.idle == 0


def test_httpcore_errors_map_to_what_httpx_raises() -> None:
    assert type(httpx_error(httpcore.ReadTimeout("slow"))) is httpx.ReadTimeout
    assert type(httpx_error(httpcore.ConnectError("refused"))) is httpx.ConnectError
    assert type(httpx_error(httpcore.RemoteProtocolError("closed"))) is httpx.RemoteProtocolError
    assert type(httpx_error(httpcore.ConnectionNotAvailable())) is httpx.RemoteProtocolError
    other = ValueError("not a transport error")
    assert httpx_error(other) is other


async def test_closed_connections_refuse_requests(rx: WebhookReceiver) -> None:
    conns = new_transport(verify=False)
    await conns.aclose()
    with pytest.raises(RuntimeError):
        await post(conns, rx.url())
