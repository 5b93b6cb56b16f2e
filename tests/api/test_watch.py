"""The crawl watcher WebSocket on /v2/crawl/{id} and /v2/batch/scrape/{id} through a whole daemon:
messages and close codes as firecrawl-js reads them, 10k documents, the key and same-origin
rules of the edge, and a reader too slow to keep up (issue 18)."""

from __future__ import annotations

import functools
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from firecrawl import Firecrawl
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from daemon.api import watch
from daemon.app import Daemon
from daemon.jobs.manager import JobManager
from tests.api.conftest import KEY, KEY_ENV, StartDaemon, base_url, client
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


async def test_catchup_documents_and_done_for_10k_pages(
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
    assert got.types()[0] == "catchup"
    catchup = got.messages[0]["data"]
    assert catchup["status"] == "scraping" and catchup["success"] is True
    assert [d["n"] for d in got.documents()] == list(range(10_000))
    assert set(got.types()[1:]) == {"document"}  # no message type Firecrawl does not send
    assert (got.code, got.reason) == (1000, '{"type":"done"}')


async def test_a_finished_job_and_the_batch_path(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("batch_scrape", webhook=None, source={})
    await jobs.page(job, [{"n": 1}, {"n": 2}])
    await jobs.finish(job, "failed", "kickoff failed at http://u:pw@site.test/")
    got = await watch_job(daemon, f"/v2/batch/scrape/{job}")
    assert got.types() == ["catchup", "error"]
    assert got.messages[0]["data"]["status"] == "failed"  # everything fits: the real status
    assert [d["n"] for d in got.documents()] == [1, 2]
    assert got.messages[1]["error"] == "kickoff failed at http://u:***@site.test/"
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
    assert by_header.types() == ["catchup"] and by_header.code == 1000
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
    # The client takes about 1.3 MB/s, slower than a daemon on a busy machine sends (at 6 MB/s
    # one was not); the watcher has 1 MB documents for it and waits at most 50 ms for room in
    # its queue of 2: it closes the socket (1008) instead of queueing more. (A client that reads
    # nothing at all is not closed until it reads or goes: the server's socket writes cannot be
    # cancelled.)
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
                time.sleep(0.05)
        return received, tail

    received, tail = await trio.to_thread.run_sync(slow_client)
    assert received < 40_000_000  # far from the 60 MB the job holds
    # The close frame (1008, the reason) is sent when the reader's buffer takes it; a reader too
    # slow for that too has its socket closed without it (the metric below counts it either way).
    if b"\x88" in tail:
        assert b'\x03\xf0{"type":"error","error":"client too slow: closed"}' in tail
    async with client(daemon) as http:
        metrics = unlabelled((await http.get("/metrics")).text)
        assert 'crawld_watchers_total{outcome="slow_reader"} 1.0' in metrics
        assert (await http.get("/status")).json()["http"]["websockets"] == 0


async def test_documents_finishing_while_watchers_connect_arrive_exactly_once(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each round: a job with some documents and a watcher connecting while the rest finish. In
    # even rounds every read the watcher makes (the catchup's first) is followed at once by the
    # next document's commit, then by the job's end: a document always finishes between the
    # catchup and the first poll, and between any two polls. In odd rounds the documents finish
    # on their own, one commit every few scheduling points, wherever the reads fall. Every
    # watcher must see 0..n-1 once each, in order, nothing but catchup and document messages,
    # and the close 1000 done.
    monkeypatch.setattr(watch, "POLL_S", 0.01)
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    after_read: dict[str, Any] = {}
    read = jobs.job_rows_after

    async def reading(job_id: str, after: int, limit: int, max_bytes: int) -> Any:
        got = await read(job_id, after, limit, max_bytes)
        if (step := after_read.get(job_id)) is not None:
            await step()
        return got

    monkeypatch.setattr(jobs, "job_rows_after", reading)
    for round_ in range(60):
        kind, before, total = (
            ("crawl", round_ % 4, 10) if round_ % 4 < 2 else ("batch_scrape", 1, 6)
        )
        job = await jobs.create_job(kind, webhook=None, source={})
        await jobs.page(job, [{"n": n} for n in range(before)])
        left = list(range(before, total))

        async def next_one(job: str = job, left: list[int] = left) -> None:
            if left:
                await jobs.page(job, [{"n": left.pop(0)}])
            elif job in after_read:
                del after_read[job]
                await jobs.finish(job, "completed")

        async def on_their_own(
            job: str = job, left: list[int] = left, pause: int = round_ % 5
        ) -> None:
            while left:
                for _ in range(pause):
                    await trio.lowlevel.checkpoint()
                await jobs.page(job, [{"n": left.pop(0)}])
            await jobs.finish(job, "completed")

        path = f"/v2/crawl/{job}" if kind == "crawl" else f"/v2/batch/scrape/{job}"
        async with trio.open_nursery() as nursery:
            if round_ % 2:
                nursery.start_soon(on_their_own)
            else:
                after_read[job] = next_one
            got = await watch_job(daemon, path)
        assert [d["n"] for d in got.documents()] == list(range(total)), (round_, got)
        assert set(got.types()) <= {"catchup", "document"}, got.types()
        assert got.types()[0] == "catchup" and (got.code, got.reason) == (1000, '{"type":"done"}')


def _open_raw(daemon: Daemon, path: str) -> tuple[socket.socket, bytes]:
    """A plain-socket WebSocket handshake: the socket and what came after the 101 answer."""
    assert daemon.http_address is not None
    host, port = daemon.http_address
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101")
    return sock, rest


def _until_close_frame(sock: socket.socket, data: bytes) -> list[int]:
    opcodes: list[int] = []
    while not opcodes or opcodes[-1] != 8:
        while len(data) < 2 or len(data) < _frame_size(data):
            data += sock.recv(65536)
        opcodes.append(data[0] & 0x0F)
        data = data[_frame_size(data) :]
    return opcodes


async def test_the_connection_stays_open_until_the_client_answers_the_close(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closing the TCP connection right after the Close frame makes the kernel answer what the
    # client sends next (its Pong, its Close reply) with a RST, which can destroy messages the
    # client has not read yet: the websockets client lost the catchup of a finished job so in
    # about 1 connection in 70. The server waits for the client's Close (at most
    # CLOSE_TIMEOUT_S), then closes.
    monkeypatch.setattr(watch, "CLOSE_TIMEOUT_S", 1.0)
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={})
    await jobs.page(job, [{"n": 0}])
    await jobs.finish(job, "completed")

    def answering_late() -> tuple[list[int], bool, bytes]:
        sock, rest = _open_raw(daemon, f"/v2/crawl/{job}")
        with sock:
            opcodes = [op for op in _until_close_frame(sock, rest) if op != 9]  # no pings
            time.sleep(0.3)  # a client far away: its Close reply comes later
            sock.setblocking(False)
            try:
                open_still = sock.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                open_still = True
            sock.setblocking(True)
            sock.sendall(b"\x88\x82\x00\x00\x00\x00\x03\xe8")  # masked Close 1000
            return opcodes, open_still, sock.recv(65536)

    def never_answering() -> float:
        sock, rest = _open_raw(daemon, f"/v2/crawl/{job}")
        with sock:
            _until_close_frame(sock, rest)
            started = time.monotonic()
            while sock.recv(65536):
                pass
            return time.monotonic() - started

    opcodes, open_still, after = await trio.to_thread.run_sync(answering_late)
    assert opcodes == [1, 8] and open_still
    assert after == b""  # then a clean end, no reset
    waited = await trio.to_thread.run_sync(never_answering)
    assert 0.5 < waited < 5  # closed by the server once CLOSE_TIMEOUT_S is over
    async with client(daemon) as http:
        assert (await http.get("/status")).json()["http"]["websockets"] == 0


async def test_every_watcher_of_a_finished_job_gets_its_catchup(start_daemon: StartDaemon) -> None:
    # What clients saw before the closing handshake: a catchup lost now and then (see above).
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("batch_scrape", webhook=None, source={})
    await jobs.page(job, [{"n": 0}])
    await jobs.finish(job, "completed")
    for _ in range(150):
        got = await watch_job(daemon, f"/v2/batch/scrape/{job}")
        assert got.types() == ["catchup"] and got.documents() == [{"n": 0}], got
        assert (got.code, got.reason) == (1000, '{"type":"done"}')


async def test_firecrawl_py_watcher_sees_every_document_once(start_daemon: StartDaemon) -> None:
    # firecrawl-py's own watcher (websockets underneath) on a job whose documents finish while
    # it connects and reads: every document dispatched once, then `done` (it asks over HTTP for
    # the final status after the close, as against Firecrawl).
    daemon = await start_daemon(extra=NO_COLLECTOR)
    jobs: JobManager = daemon.jobs
    app = Firecrawl(api_key="unused", api_url=base_url(daemon))
    for round_ in range(3):
        job = await jobs.create_job("batch_scrape", webhook=None, source={})
        await jobs.page(job, [{"n": 0, "metadata": {}}])
        seen: list[int] = []
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()
        watcher = app.watcher(job, kind="batch", poll_interval=1, timeout=30)
        add_seen, set_done = (
            seen.append,
            functools.partial(trio.from_thread.run_sync, done.set, trio_token=token),
        )
        watcher.add_event_listener("document", lambda e, add=add_seen: add(e["data"]["n"]))
        watcher.add_event_listener("done", lambda e, end=set_done: end())
        watcher.start()
        try:
            for n in range(1, 6):
                await trio.sleep(0.01 * round_)
                await jobs.page(job, [{"n": n, "metadata": {}}])
            await jobs.finish(job, "completed")
            with trio.fail_after(20):
                await done.wait()
        finally:
            await trio.to_thread.run_sync(watcher.stop)
        assert seen == list(range(6)), (round_, seen)
