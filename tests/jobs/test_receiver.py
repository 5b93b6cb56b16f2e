from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver, main, open_receiver
from daemon.jobs.events import build_body, encode_body
from daemon.jobs.signing import attempt_headers

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def event(job: str, seq: int, name: str = "page", webhook_id: str | None = None) -> bytes:
    return encode_body(
        build_body(
            kind="crawl",
            name=name,
            job_id=job,
            seq=seq,
            webhook_id=webhook_id or f"w-{job}-{seq}",
            error="boom" if name == "failed" else None,
        )
    )


def signed(body: bytes, secret: str = SECRET, ts: int | None = None) -> dict[str, str]:
    webhook_id = msgspec.json.decode(body)["webhookId"]
    stamp = int(time.time()) if ts is None else ts
    return attempt_headers(body, webhook_id=webhook_id, timestamp=stamp, secret=secret)


async def post(client: httpx.AsyncClient, rx: WebhookReceiver, body: bytes) -> httpx.Response:
    return await client.post(rx.url(), content=body, headers=signed(body))


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with open_receiver(secret=SECRET) as rx:
        yield rx


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


async def test_records_exact_request(receiver: WebhookReceiver, client: httpx.AsyncClient) -> None:
    body = event("j", 1, "started")
    response = await client.post(receiver.url("/in/x"), content=body, headers=signed(body))
    assert response.status_code == 200
    [got] = receiver.requests
    assert got.method == "POST" and got.path == "/in/x"
    assert got.body == body
    assert got.json["type"] == "crawl.started"
    assert (got.job_id, got.seq, got.event_id, got.webhook_id) == ("j", 1, "j:1", "w-j-1")
    assert got.headers["content-type"] == "application/json"
    assert got.status == 200 and got.delivered
    assert got.signature_error is None
    assert abs(got.arrived - time.time()) < 5
    receiver.check()


async def test_flags_bad_signatures(receiver: WebhookReceiver, client: httpx.AsyncClient) -> None:
    body = event("j", 1)
    await client.post(receiver.url(), content=body, headers=signed(body, secret="whsec_AAAA"))
    await client.post(receiver.url(), content=body + b" ", headers=signed(body))
    await client.post(receiver.url(), content=body, headers=signed(body, ts=1))
    await client.post(receiver.url(), content=body)
    errors = [r.signature_error for r in receiver.requests]
    assert errors[0] is not None and "no webhook-signature entry" in errors[0]
    assert errors[1] is not None and "no webhook-signature entry" in errors[1]
    assert errors[2] is not None and "too old" in errors[2]
    assert errors[3] == "the request is not signed"
    with pytest.raises(AssertionError, match="too old"):
        receiver.check()


async def test_rejects_bad_signatures_when_asked(client: httpx.AsyncClient) -> None:
    async with open_receiver(secret=SECRET, reject_bad_signatures=True) as rx:
        body = event("j", 1)
        bad = await client.post(rx.url(), content=body, headers=signed(body, secret="other"))
        good = await client.post(rx.url(), content=body, headers=signed(body))
    assert (bad.status_code, good.status_code) == (401, 200)


async def test_scripted_failures(receiver: WebhookReceiver, client: httpx.AsyncClient) -> None:
    receiver.fail_next(2, 500)
    receiver.fail_next(1, 429, retry_after=7)
    receiver.fail_next(1, 410)
    statuses = []
    for _ in range(5):
        response = await client.post(receiver.url(), content=event("j", 1))
        statuses.append((response.status_code, response.headers.get("retry-after")))
    assert statuses == [(500, None), (500, None), (429, "7"), (410, None), (200, None)]
    assert [r.status for r in receiver.requests] == [500, 500, 429, 410, 200]
    assert receiver.seqs("j") == [1]
    assert receiver.violations == [] and receiver.duplicates == []


async def test_delayed_answer(
    receiver: WebhookReceiver, client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    # Virtual time (receiver and client share this loop): the delays are exact, not windows.
    receiver.delay_next(1, 0.05)
    start = trio.current_time()
    response = await client.post(receiver.url(), content=event("j", 1))
    assert response.status_code == 200
    assert trio.current_time() - start >= 0.05
    receiver.delay_next(1, 1.0)
    with pytest.raises(httpx.ReadTimeout):
        await client.post(receiver.url(), content=event("j", 2), timeout=0.05)
    assert receiver.requests[-1].status is None


async def test_die_and_revive_on_the_same_port(
    receiver: WebhookReceiver, client: httpx.AsyncClient
) -> None:
    port = receiver.port
    await client.post(receiver.url(), content=event("j", 1))
    await receiver.die()
    assert not receiver.alive
    with pytest.raises(httpx.ConnectError):
        await client.post(receiver.url(), content=event("j", 2))
    with socket.socket() as other, pytest.raises(OSError):  # held: no other server takes it
        other.bind((receiver.host, port))
    await receiver.revive()
    assert receiver.alive and receiver.port == port
    response = await client.post(receiver.url(), content=event("j", 2))
    assert response.status_code == 200
    assert receiver.seqs("j") == [1, 2]


async def test_die_drops_in_flight_requests(
    receiver: WebhookReceiver,
    client: httpx.AsyncClient,
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
) -> None:
    receiver.delay_next(1, 10.0)
    failures: list[BaseException] = []

    async def post() -> None:
        try:
            await client.post(receiver.url(), content=event("j", 1))
        except httpx.HTTPError as exc:
            failures.append(exc)

    nursery.start_soon(post)
    await receiver.wait_until(lambda: len(receiver.requests) == 1)
    with trio.fail_after(2):
        await receiver.die()
        while not failures:
            await trio.sleep(0.001)
    assert isinstance(failures[0], httpx.RemoteProtocolError | httpx.ReadError)
    assert receiver.requests[0].status is None


async def test_order_checks(receiver: WebhookReceiver, client: httpx.AsyncClient) -> None:
    receiver.fail_next(1, 500)
    for seq in (1, 1, 2, 4):  # a retry of 1, then 3 never arrives (dead-lettered)
        await post(client, receiver, event("a", seq))
    await post(client, receiver, event("a", 5, "completed"))
    await post(client, receiver, event("a", 5, "completed"))  # crash-resend
    assert receiver.violations == []
    assert receiver.gaps("a") == [(2, 4)]
    assert receiver.duplicates == ["a:5"]
    assert receiver.seqs("a") == [1, 2, 4, 5, 5]
    assert receiver.seqs("a", delivered=False) == [1, 1, 2, 4, 5, 5]
    receiver.check()

    await post(client, receiver, event("a", 3))
    await post(client, receiver, event("a", 6))
    await post(client, receiver, event("b", 1, webhook_id="first"))
    await post(client, receiver, event("b", 1, webhook_id="second"))
    await post(client, receiver, event("c", 1, "failed"))
    await post(client, receiver, event("c", 2, "completed"))
    assert receiver.violations == [
        "job a seq 3: arrived after seq 5",
        "job a seq 6: arrived after the terminal seq 5",
        "job b seq 1: webhookId changed on resend",
        "job c seq 2: arrived after the terminal seq 1",
        "job c seq 2: second terminal event",
    ]
    with pytest.raises(AssertionError, match="arrived after seq 5"):
        receiver.check()


async def test_changed_body_on_resend_is_a_violation(
    receiver: WebhookReceiver, client: httpx.AsyncClient
) -> None:
    body = event("j", 1)
    await client.post(receiver.url(), content=body)
    await client.post(receiver.url(), content=body.replace(b'"data":[]', b'"data":[1]'))
    assert receiver.violations == ["job j seq 1: body changed on resend"]


async def test_non_event_requests_are_recorded_without_checks(
    receiver: WebhookReceiver, client: httpx.AsyncClient
) -> None:
    await client.post(receiver.url(), content=b"not json")
    await client.post(receiver.url(), json={"hello": 1})
    assert [r.json for r in receiver.requests] == [None, {"hello": 1}]
    assert receiver.violations == []
    assert receiver.events(delivered=False) == []


async def test_wait_delivered(
    receiver: WebhookReceiver, client: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    async def burst() -> None:
        for seq in range(1, 51):
            await post(client, receiver, event("j", seq))

    nursery.start_soon(burst)
    with trio.fail_after(5):
        got = await receiver.wait_delivered(50, "j")
    assert [r.seq for r in got] == list(range(1, 51))
    receiver.check()


async def test_reset_forgets_everything(
    receiver: WebhookReceiver, client: httpx.AsyncClient
) -> None:
    await client.post(receiver.url(), content=event("j", 2))
    await client.post(receiver.url(), content=event("j", 1))
    receiver.fail_next(3)
    receiver.reset()
    assert receiver.requests == [] and receiver.violations == []
    assert (await client.post(receiver.url(), content=event("j", 1))).status_code == 200


async def test_http_controls(receiver: WebhookReceiver, client: httpx.AsyncClient) -> None:
    base = receiver.url("/_receiver")
    r = await client.post(f"{base}/fail", json={"count": 1, "status": 429, "retry_after": 3})
    assert r.status_code == 200 and r.json()["pendingFaults"] == 1
    r = await client.post(f"{base}/delay", json={"seconds": 0.01})
    assert r.json()["pendingFaults"] == 2
    first = await client.post(receiver.url(), content=event("j", 1))
    assert (first.status_code, first.headers["retry-after"]) == (429, "3")
    assert (await client.post(receiver.url(), content=event("j", 1))).status_code == 200

    summary = (await client.get(f"{base}/summary")).json()
    assert summary["total"] == 2 and summary["delivered"] == 1
    assert summary["jobs"]["j"] == {"maxSeq": 1, "delivered": 1, "terminalSeq": None, "gaps": []}
    assert summary["violations"] == [] and summary["alive"] is True

    listing = (await client.get(f"{base}/requests", params={"job": "j", "limit": 1})).json()
    assert listing["total"] == 2
    assert [r["status"] for r in listing["requests"]] == [429]
    assert listing["requests"][0]["body"] == event("j", 1).decode()
    assert listing["requests"][0]["signatureError"] == "the request is not signed"

    assert (await client.post(f"{base}/reset")).json()["total"] == 0
    assert receiver.requests == []


@pytest.mark.parametrize(
    ("path", "payload", "status"),
    [
        ("/fail", {"count": 0}, 422),
        ("/fail", {"status": 700}, 422),
        ("/fail", {"bogus": 1}, 422),
        ("/delay", None, 400),
        ("/delay", {"seconds": -1}, 422),
        ("/die", {"seconds": 0}, 422),
        ("/die", {}, 422),
    ],
)
async def test_http_controls_reject_bad_input(
    receiver: WebhookReceiver,
    client: httpx.AsyncClient,
    path: str,
    payload: dict[str, object] | None,
    status: int,
) -> None:
    response = await client.post(receiver.url("/_receiver" + path), json=payload)
    assert response.status_code == status
    assert "error" in response.json()
    assert receiver.summary()["pendingFaults"] == 0


async def test_http_requests_query_is_validated(
    receiver: WebhookReceiver, client: httpx.AsyncClient
) -> None:
    response = await client.get(receiver.url("/_receiver/requests"), params={"limit": "x"})
    assert response.status_code == 400


async def test_http_die_comes_back(
    receiver: WebhookReceiver, client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    # Virtual time: the receiver cannot come back before the test has seen it dead.
    response = await client.post(receiver.url("/_receiver/die"), json={"seconds": 0.05})
    assert response.json() == {"dying": True, "seconds": 0.05}
    with trio.fail_after(2):
        await receiver.wait_until(lambda: not receiver.alive)
        with pytest.raises(httpx.ConnectError):
            await client.post(receiver.url(), content=event("j", 1))
        await receiver.wait_until(lambda: receiver.alive)
    assert (await client.post(receiver.url(), content=event("j", 1))).status_code == 200


async def test_run_reports_address_and_stops(nursery: trio.Nursery) -> None:
    receiver = WebhookReceiver()
    host, port = await nursery.start(receiver.run)
    assert host == "127.0.0.1" and port > 0
    assert receiver.url() == f"http://127.0.0.1:{port}/hook"
    receiver.stop()
    with trio.fail_after(2):
        await receiver.wait_until(lambda: not receiver.alive)


def test_cli_help() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
