"""OriginConnections: keep-alive connections to many origins behind one transport (the crawl's
fetcher), against real sockets (the bundled receiver on two loopback addresses)."""

from __future__ import annotations

import trio

from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.net.origins import OriginConnections
from daemon.net.ssrf import parse_networks, send_vetted

LOOPBACK = parse_networks(["127.0.0.0/8"])


async def post(conns: OriginConnections, url: str) -> int:
    return (await send_vetted(conns, url, b"{}", {}, LOOPBACK, 2.0)).status


async def test_each_origin_keeps_its_own_connections(rx: WebhookReceiver) -> None:
    async with open_receiver(bind=f"127.0.0.2:{rx.port}") as other:
        async with OriginConnections(max_idle=4) as conns:
            for _ in range(3):
                assert await post(conns, rx.url()) == 200
                assert await post(conns, other.url()) == 200
            assert (conns.opened, conns.idle) == (2, 2)
        assert conns.idle == 0  # closed
    assert len(rx.requests) == 3 and len(other.requests) == 3


async def test_at_most_max_idle_in_all_the_longest_idle_closed_first(rx: WebhookReceiver) -> None:
    async with (
        open_receiver(bind=f"127.0.0.2:{rx.port}") as other,
        OriginConnections(max_idle=1) as conns,
    ):
        assert await post(conns, rx.url()) == 200
        assert await post(conns, other.url()) == 200  # closes the first origin's
        assert (conns.opened, conns.idle) == (2, 1)
        assert await post(conns, other.url()) == 200
        assert conns.opened == 2
        assert await post(conns, rx.url()) == 200
        assert (conns.opened, conns.idle) == (3, 1)


async def test_a_connection_idle_past_its_keepalive_closes_when_another_is_put_back(
    rx: WebhookReceiver,
) -> None:
    async with (
        open_receiver(bind=f"127.0.0.2:{rx.port}") as other,
        OriginConnections(max_idle=4, keepalive_expiry=0.01) as conns,
    ):
        assert await post(conns, rx.url()) == 200
        await trio.sleep(0.05)
        assert await post(conns, other.url()) == 200
        assert conns.idle == 1  # the first origin's closed, without being asked for
        assert await post(conns, rx.url()) == 200
        assert conns.opened == 3


async def test_concurrent_requests_to_one_origin_get_a_connection_each(
    rx: WebhookReceiver,
) -> None:
    rx.delay_next(3, 0.05)  # the three overlap
    async with OriginConnections(max_idle=8) as conns:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(post, conns, rx.url())
        assert (conns.opened, conns.idle) == (3, 3)
        for _ in range(3):
            assert await post(conns, rx.url()) == 200
        assert conns.opened == 3
