"""The crawl watcher WebSocket on /v2/crawl/{id} and /v2/batch/scrape/{id} through a whole daemon:
messages and close codes as firecrawl-js reads them, 10k documents, the key and same-origin
rules of the edge, and a reader too slow to keep up (issue 18)."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from daemon.api import watch
from daemon.app import Daemon
from daemon.jobs.manager import JobManager
from tests.api.conftest import KEY, KEY_ENV, StartDaemon, client
from tests.conftest import unlabelled

UNKNOWN = "00000000-0000-4000-8000-000000000000"
NO_COLLECTOR = "[collector]\nenabled = false"


@dataclass
class Watched:
    messages: list[dict[str, Any]] = field(default_factory=list)
    code: int | None = None
    reason: str | None = None
    subprotocol: str | None = None

    def types(self) -> list[str]:
        return [m["type"] for m in self.messages]

    def documents(self) -> list[Any]:
        catchup = [d for m in self.messages if m["type"] == "catchup" for d in m["data"]["data"]]
        return catchup + [m["data"] for m in self.messages if m["type"] == "document"]


def ws_url(daemon: Daemon, path: str) -> str:
    assert daemon.http_address is not None
    host, port = daemon.http_address
    return f"ws://{host}:{port}{path}"


async def watch_job(daemon: Daemon, path: str, **kw: Any) -> Watched:
    """Open the watcher in a thread (the websockets sync client) and read it to its close."""

    def run() -> Watched:
        got = Watched()
        with connect(ws_url(daemon, path), open_timeout=10, **kw) as ws:
            got.subprotocol = ws.subprotocol
            try:
                while True:
                    got.messages.append(json.loads(ws.recv(timeout=20)))
            except ConnectionClosed as closed:
                assert closed.rcvd is not None
                got.code, got.reason = closed.rcvd.code, closed.rcvd.reason
        return got

    return await trio.to_thread.run_sync(run)


async def refused(daemon: Daemon, path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    def run() -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as caught:
            connect(ws_url(daemon, path), open_timeout=10, **kw)
        response = caught.value.response
        return response.status_code, json.loads(response.body or b"{}")

    return await trio.to_thread.run_sync(run)


async def test_catchup_documents_final_status_and_done_for_10k_pages(
    start_daemon: StartDaemon,
) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={})
    pad = "x" * 1500  # 10k x 1.5 kB: far more than the catchup holds
    await jobs.page(job, [{"n": n, "pad": pad} for n in range(5000)])

    async def grow() -> None:
        for start in range(5000, 10_000, 1000):
            await trio.sleep(0.05)
            await jobs.page(job, [{"n": n, "pad": pad} for n in range(start, start + 1000)])
        await jobs.finish(job, "completed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(grow)
        got = await watch_job(daemon, f"/v2/crawl/{job}")
    assert got.types()[0] == "catchup" and got.types()[-1] == "status"
    catchup = got.messages[0]["data"]
    assert catchup["status"] == "scraping" and catchup["success"] is True
    assert [d["n"] for d in got.documents()] == list(range(10_000))
    assert set(got.types()[1:-1]) == {"document"}
    final = got.messages[-1]["data"]
    assert (final["status"], final["completed"], final["total"], final["data"]) == (
        "completed", 10_000, 10_000, [])  # fmt: skip
    assert (got.code, got.reason) == (1000, '{"type":"done"}')


async def test_a_finished_job_and_the_batch_path(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("batch_scrape", webhook=None, source={})
    await jobs.page(job, [{"n": 1}, {"n": 2}])
    await jobs.finish(job, "failed", "kickoff failed at http://u:pw@site.test/")
    got = await watch_job(daemon, f"/v2/batch/scrape/{job}")
    assert got.types() == ["catchup", "error", "status"]
    assert got.messages[0]["data"]["status"] == "failed"  # everything fits: the real status
    assert [d["n"] for d in got.documents()] == [1, 2]
    assert got.messages[1]["error"] == "kickoff failed at http://u:***@site.test/"
    assert got.messages[2]["data"]["status"] == "failed"
    assert (got.code, got.reason) == (1000, '{"type":"done"}')


def raw_frames(daemon: Daemon, path: str) -> list[tuple[int, bytes]]:
    """(opcode, payload) of every frame the server sends, read off a plain socket up to its
    close frame (the websockets client may drop a message that arrives with the handshake)."""
    assert daemon.http_address is not None
    host, port = daemon.http_address
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, data = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101")
        frames: list[tuple[int, bytes]] = []
        while not frames or frames[-1][0] != 8:
            while len(data) < 2 or len(data) < _frame_size(data):
                data += sock.recv(65536)
            size, start = _frame_size(data), _frame_size(data) - _payload_len(data)
            if data[0] & 0x0F != 9:  # hypercorn's pings
                frames.append((data[0] & 0x0F, data[start:size]))
            data = data[size:]
        return frames


def _payload_len(data: bytes) -> int:
    n = data[1] & 0x7F
    if n == 126:
        return int.from_bytes(data[2:4], "big") if len(data) >= 4 else 1 << 40
    if n == 127:
        return int.from_bytes(data[2:10], "big") if len(data) >= 10 else 1 << 40
    return n


def _frame_size(data: bytes) -> int:
    n = data[1] & 0x7F
    return {126: 4, 127: 10}.get(n, 2) + _payload_len(data)


@pytest.mark.parametrize(
    ("job", "error"),
    [(UNKNOWN, "Job not found"), ("not-a-uuid", "invalid job id: expected a UUID")],
)
async def test_unknown_or_malformed_jobs_get_an_error_and_close_1008(
    start_daemon: StartDaemon, job: str, error: str
) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    frames = await trio.to_thread.run_sync(raw_frames, daemon, f"/v2/crawl/{job}")
    assert [op for op, _ in frames] == [1, 8]  # one text message, then the close
    assert json.loads(frames[0][1]) == {"type": "error", "error": error}
    code, reason = int.from_bytes(frames[1][1][:2], "big"), frames[1][1][2:]
    assert code == 1008 and json.loads(reason) == {"type": "error", "error": error}


async def test_the_key_comes_as_subprotocol_or_authorization(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    daemon = await start_daemon(f'api_key_env = "{KEY_ENV}"', NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={})
    await jobs.finish(job, "completed")
    path = f"/v2/crawl/{job}"
    by_protocol = await watch_job(daemon, path, subprotocols=[KEY])
    assert by_protocol.subprotocol == KEY and by_protocol.code == 1000
    by_header = await watch_job(daemon, path, additional_headers={"Authorization": f"Bearer {KEY}"})
    assert by_header.types() == ["catchup", "status"] and by_header.code == 1000
    for kw in ({}, {"subprotocols": ["wrong-key-0123456789"]}):
        status, body = await refused(daemon, path, **kw)
        assert (status, body["success"], body["error"]) == (401, False, "Unauthorized")
        assert body["detail"] == (
            "the API key is not valid" if kw else
            "send Authorization: Bearer <key> (or the key as Sec-WebSocket-Protocol)")  # fmt: skip
    # same-origin rules as every route: a page of another site may not open it
    status, body = await refused(daemon, path, subprotocols=[KEY], origin="http://evil.example")  # type: ignore[arg-type]
    assert status == 403 and body["detail"] == "Origin is not this server"
    status, _ = await refused(daemon, path, subprotocols=[KEY], additional_headers={
        "Sec-Fetch-Site": "cross-site"})  # fmt: skip
    assert status == 403
    async with client(daemon, KEY) as http:
        refusals = (await http.get("/status")).json()["http"]["refused"]
    assert refusals["unauthorized"] == 2 and refusals["cross_site"] == 2


async def test_a_host_not_listed_is_refused(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    assert daemon.http_address is not None
    host, port = daemon.http_address

    def run() -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as caught:
            connect(f"ws://evil.example:{port}/v2/crawl/{UNKNOWN}", open_timeout=10,
                    sock=socket.create_connection((host, port)))  # fmt: skip
        return caught.value.response.status_code, json.loads(caught.value.response.body or b"")

    status, body = await trio.to_thread.run_sync(run)
    assert status == 421 and body["detail"]["host"] == f"evil.example:{port}"


async def test_a_reader_too_slow_is_closed_not_buffered(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client takes about 6 MB/s; the watcher has 1 MB documents for it and waits at most
    # 50 ms for room in its queue of 2: it closes the socket (1008) instead of queueing more.
    monkeypatch.setattr(watch, "QUEUE_MESSAGES", 2)
    monkeypatch.setattr(watch, "SLOW_READER_S", 0.05)
    daemon = await start_daemon('read_timeout = "2s"', NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={})
    await jobs.page(job, [{"n": n, "pad": "x" * 1_000_000} for n in range(60)])
    assert daemon.http_address is not None
    host, port = daemon.http_address

    def slow_client() -> tuple[int, bytes]:
        received, tail = 0, b""
        with socket.create_connection((host, port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.settimeout(20)
            sock.sendall(
                f"GET /v2/crawl/{job} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                .encode()
            )  # fmt: skip
            while data := sock.recv(65536):
                received += len(data)
                tail = (tail + data)[-256:]
                time.sleep(0.01)
        return received, tail

    received, tail = await trio.to_thread.run_sync(slow_client)
    assert received < 40_000_000  # far from the 60 MB the job holds
    assert b"\x88" in tail and b'\x03\xf0{"type":"error","error":"client too slow: closed"}' in tail
    async with client(daemon) as http:
        metrics = unlabelled((await http.get("/metrics")).text)
        assert 'crawld_watchers_total{outcome="slow_reader"} 1.0' in metrics
        assert (await http.get("/status")).json()["http"]["websockets"] == 0
