"""Request limits through a whole daemon (issue 7, findings 2 and 4): bodies are refused before
they are read, slow bodies time out, a full API answers 503 while /healthz still answers, and no
error repeats more than a short piece of what the client sent."""

from __future__ import annotations

import httpx
import trio

from daemon.app import Daemon
from tests.api.conftest import StartDaemon, client


async def raw_request(daemon: Daemon, head: str, body: bytes = b"") -> trio.SocketStream:
    assert daemon.http_address is not None
    stream = await trio.open_tcp_stream(*daemon.http_address)
    await stream.send_all(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    return stream


async def read_answer(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


def head(method: str, path: str, port: int, **headers: str) -> str:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return "\n".join(lines) + "\n"


async def test_a_huge_content_length_gets_413_without_sending_the_body(
    start_daemon: StartDaemon,
) -> None:
    daemon = await start_daemon()
    assert daemon.http_address is not None
    port = daemon.http_address[1]
    stream = await raw_request(
        daemon,
        head("POST", "/crawl/stop", port, Content_Type="application/json",
             Content_Length=str(500 * 1024 * 1024)),
        b'{"task_id": "',
    )  # fmt: skip
    answer = await read_answer(stream)
    assert answer.startswith(b"HTTP/1.1 413")
    assert answer.endswith(b'{"error":"request body too large","detail":{"max_body":1048576}}')
    await stream.aclose()


async def test_a_chunked_body_is_counted_as_it_streams(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon("max_body = 4096")
    sent = 0

    async def chunks():  # type: ignore[no-untyped-def]
        nonlocal sent
        for _ in range(1000):
            sent += 1024
            yield b" " * 1024

    async with client(daemon) as c:
        r = await c.post(
            "/crawl/stop", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 413 and r.json()["detail"] == {"max_body": 4096}
        assert sent < 1000 * 1024  # the server stopped listening long before the end

        async def small():  # type: ignore[no-untyped-def]
            yield b"{}"

        ok = await c.post(
            "/crawl/stop", content=small(), headers={"Content-Type": "application/json"}
        )
        assert ok.status_code == 200


async def test_a_trickling_body_times_out(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon('body_timeout = "300ms"')
    assert daemon.http_address is not None
    port = daemon.http_address[1]
    stream = await raw_request(
        daemon,
        head("POST", "/crawl/stop", port, Content_Type="application/json", Content_Length="100"),
        b'{"task_id":',
    )
    answer = await read_answer(stream)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"error":"request body not received in time"' in answer
    await stream.aclose()


async def test_a_full_api_answers_503_and_healthz_still_answers(
    start_daemon: StartDaemon,
) -> None:
    daemon = await start_daemon('max_concurrent_requests = 2\nbody_timeout = "20s"')
    assert daemon.http_address is not None
    port = daemon.http_address[1]
    slow = [
        await raw_request(
            daemon,
            head(
                "POST", "/crawl/stop", port, Content_Type="application/json", Content_Length="100"
            ),
            b"{",
        )
        for _ in range(2)
    ]
    async with client(daemon) as c:
        with trio.fail_after(10):
            while (busy := await c.get("/status")).status_code != 503:
                await trio.sleep(0.01)
        assert busy.json() == {
            "error": "too many requests in progress",
            "detail": {"max_concurrent_requests": 2},
        }
        assert busy.headers["retry-after"] == "1"
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        for stream in slow:
            await stream.aclose()
        with trio.fail_after(10):
            while (await c.get("/status")).status_code != 200:
                await trio.sleep(0.01)


async def test_errors_repeat_only_a_short_piece_of_the_input(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    long_id = "x" * 100_000
    async with client(daemon) as c:
        unknown = await c.post("/crawl/stop", json={"task_id": long_id})
        assert unknown.status_code == 404
        assert len(unknown.content) < 1000
        assert "more characters" in unknown.json()["error"]
        bad_hook = await c.post("/crawl/start", json={"webhook": "ftp://" + "y" * 100_000})
        assert bad_hook.status_code == 422
        detail = bad_hook.json()["detail"]
        assert len(detail) < 600 and detail.startswith("webhook url")
        wrong_type = await c.post("/crawl/stop", json={"task_id": [long_id]})
        assert wrong_type.status_code == 422 and len(wrong_type.content) < 1000
        bad_count = await c.get("/consume", params={"count": "9" * 5000})
        assert bad_count.status_code == 400 and len(bad_count.content) < 1000
        missing = await c.get("/" + "z" * 5000)
        assert missing.status_code == 404 and len(missing.content) < 1000
        not_json = await c.post(
            "/crawl/stop", content=b"[" * 50_000, headers={"Content-Type": "application/json"}
        )
        assert not_json.status_code in (400, 422) and len(not_json.content) < 1000


async def test_strict_integers_in_query_parameters(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    async with client(daemon) as c:
        for count in (" 5", "5 ", "٣", "1_000", "+5", "0x5", "５", "1e3", ""):
            r = await c.get("/consume", params={"count": count})
            assert r.status_code == 400, count
            assert r.json()["detail"] == {"count": count}
        assert (await c.get("/consume", params={"count": "05"})).status_code == 200


async def test_a_request_head_over_max_header_bytes_is_refused(start_daemon: StartDaemon) -> None:
    """A head that keeps growing (slowloris) is cut at max_header_bytes by hypercorn."""
    daemon = await start_daemon("max_header_bytes = 2048")
    assert daemon.http_address is not None
    port = daemon.http_address[1]
    assert daemon.http_address is not None
    stream = await trio.open_tcp_stream(*daemon.http_address)
    start = head("GET", "/status", port).replace("\n", "\r\n").encode()
    await stream.send_all(start + b"X-Big: " + b"a" * 4096)  # the head never ends
    assert (await read_answer(stream)).startswith(b"HTTP/1.1 431")
    await stream.aclose()
    async with client(daemon) as c:
        assert (await c.get("/status")).status_code == 200


async def test_httpx_sees_json_on_every_refusal(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon("max_body = 10")
    async with client(daemon) as c:
        r = await c.post("/crawl/stop", json={"task_id": "far too long for ten bytes"})
        assert r.status_code == 413 and r.headers["content-type"] == "application/json"
        assert isinstance(r, httpx.Response)


async def test_an_answer_before_the_body_was_read_closes_the_connection(
    start_daemon: StartDaemon,
) -> None:
    """The unread rest of the body goes with the connection, so clients must not reuse it."""
    daemon = await start_daemon("max_body = 100")
    async with client(daemon) as c:
        refused = await c.post(
            "/crawl/stop", content=b"x" * 50, headers={"Content-Type": "text/plain"}
        )
        assert refused.status_code == 415 and refused.headers["connection"] == "close"
        too_big = await c.post("/crawl/stop", json={"task_id": "y" * 200})
        assert too_big.status_code == 413 and too_big.headers["connection"] == "close"
        read = await c.post("/crawl/stop", json={})
        assert read.status_code == 200 and "connection" not in read.headers
        for _ in range(20):  # every answer arrives on a fresh or a still-open connection
            assert (await c.request("GET", "/status", content=b"{}")).status_code == 200


async def test_a_long_head_that_arrives_at_once_is_refused(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon("max_header_bytes = 2048")
    async with client(daemon) as c:
        long_query = await c.get("/status", params={"q": "a" * 3000})
        assert long_query.status_code == 431
        assert long_query.json()["detail"] == {"max_header_bytes": 2048}
        big_header = await c.get("/status", headers={"X-Big": "b" * 3000})
        assert big_header.status_code == 431
        assert (await c.get("/status", headers={"X-Small": "b" * 500})).status_code == 200
