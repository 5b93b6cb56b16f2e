# The notify contract is tested against a real abstract AF_UNIX datagram socket standing in for
# systemd's, so the exact bytes systemd would read are what the assertions see.
from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from functools import partial

import pytest
import trio

from daemon.systemd import Notifier, run_watchdog, watchdog_interval


class Receiver:
    """A bound abstract datagram socket: `address` is what $NOTIFY_SOCKET would hold."""

    def __init__(self) -> None:
        self.address = f"@crawld-test-{os.getpid()}-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.address[1:].encode())
        self.sock.setblocking(False)

    def datagrams(self) -> list[bytes]:
        """Every datagram received so far (each send has completed when it returned)."""
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536))
            except BlockingIOError:
                return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.sock.close()


@pytest.fixture
def notifier(receiver: Receiver) -> Notifier:
    return Notifier(receiver.address)


def test_ready_with_status(notifier: Notifier, receiver: Receiver) -> None:
    assert notifier.ready("serving on 127.0.0.1:8700")
    assert notifier.ready()
    assert receiver.datagrams() == [b"READY=1\nSTATUS=serving on 127.0.0.1:8700", b"READY=1"]


def test_reloading_sends_monotonic_usec_in_the_same_datagram(
    notifier: Notifier, receiver: Receiver
) -> None:
    before = time.monotonic_ns() // 1000
    assert notifier.reloading()
    after = time.monotonic_ns() // 1000
    [datagram] = receiver.datagrams()
    first, second = datagram.split(b"\n")
    assert first == b"RELOADING=1"
    key, _, value = second.partition(b"=")
    assert key == b"MONOTONIC_USEC"
    assert value.isdigit()
    assert before <= int(value) <= after


def test_reloading_with_status(notifier: Notifier, receiver: Receiver) -> None:
    notifier.reloading("reloading config")
    [datagram] = receiver.datagrams()
    lines = datagram.split(b"\n")
    assert lines[0] == b"RELOADING=1"
    assert lines[1].startswith(b"MONOTONIC_USEC=")
    assert lines[2:] == [b"STATUS=reloading config"]


def test_stopping_status_watchdog_extend_timeout(notifier: Notifier, receiver: Receiver) -> None:
    notifier.stopping()
    notifier.stopping("draining HTTP")
    notifier.status("3 tasks, 0 failing")
    notifier.watchdog()
    notifier.extend_timeout(12.5)
    assert receiver.datagrams() == [
        b"STOPPING=1",
        b"STOPPING=1\nSTATUS=draining HTTP",
        b"STATUS=3 tasks, 0 failing",
        b"WATCHDOG=1",
        b"EXTEND_TIMEOUT_USEC=12500000",
    ]


def test_status_stays_one_line_and_bounded(notifier: Notifier, receiver: Receiver) -> None:
    notifier.status("bad config\nREADY=1")
    notifier.status("é" * 5000)
    injected, long = receiver.datagrams()
    assert injected == b"STATUS=bad config READY=1"
    assert long.startswith("STATUS=é".encode())
    assert long.endswith(b"...")
    assert len(long) <= len(b"STATUS=") + 1024
    long.decode()  # never cut inside a UTF-8 sequence


def test_notify_socket_from_environment(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.address)
    assert Notifier().enabled
    assert Notifier().watchdog()
    assert Notifier(environ={"NOTIFY_SOCKET": receiver.address}).ready()
    assert receiver.datagrams() == [b"WATCHDOG=1", b"READY=1"]


def test_path_socket(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert Notifier(path).ready("up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_no_op_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    for notifier in (Notifier(), Notifier(environ={}), Notifier(environ={"NOTIFY_SOCKET": ""})):
        assert not notifier.enabled
        assert notifier.address is None
        assert not notifier.ready("x")
        assert not notifier.reloading()
        assert not notifier.stopping()
        assert not notifier.status("x")
        assert not notifier.watchdog()
        assert not notifier.extend_timeout(1)


def test_failed_send_does_not_raise(
    tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="crawld.systemd")
    gone = Notifier(f"@crawld-test-nobody-{uuid.uuid4().hex}")
    missing = Notifier(os.path.join(tmp_path, "no-such-socket"))
    for notifier in (gone, missing):
        assert notifier.enabled
        assert not notifier.ready("x")
        assert not notifier.reloading()
        assert not notifier.watchdog()
    failures = [r for r in caplog.records if r.getMessage() == "sd_notify failed"]
    assert len(failures) == 6
    assert all(r.levelno == logging.DEBUG for r in failures)


def test_full_receiver_does_not_block_or_raise(notifier: Notifier, receiver: Receiver) -> None:
    receiver.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    started = time.monotonic()
    results = [notifier.watchdog() for _ in range(2000)]
    assert time.monotonic() - started < 5
    assert any(results)
    assert not all(results)  # the queue filled up; later sends failed without waiting


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "500"}, 0.0005),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4243"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": ""}, 30.0),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(environ, pid=4242) == expected


def test_watchdog_interval_defaults_to_our_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 10.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval() is None


async def test_run_watchdog_pings_every_half_interval(
    autojump_clock: trio.testing.MockClock, notifier: Notifier, receiver: Receiver
) -> None:
    # The receiving side is a trio socket awaited on the same loop: under autojump the clock only
    # jumps when every task is blocked, and a ping is fully queued in the receiver's buffer by the
    # time sendto() returns, so each arrival is seen at the virtual instant it was sent.
    arrivals: list[tuple[float, bytes]] = []
    tsock = trio.socket.from_stdlib_socket(receiver.sock)

    async def listen() -> None:
        while True:
            datagram = await tsock.recv(4096)
            arrivals.append((trio.current_time(), datagram))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        t0 = trio.current_time()
        period = await nursery.start(partial(run_watchdog, notifier, interval=30.0))
        assert period == 15.0
        await trio.sleep(50)
        nursery.cancel_scope.cancel()
    assert [(round(t - t0, 6), d) for t, d in arrivals] == [
        (0.0, b"WATCHDOG=1"),
        (15.0, b"WATCHDOG=1"),
        (30.0, b"WATCHDOG=1"),
        (45.0, b"WATCHDOG=1"),
    ]


async def test_run_watchdog_reads_the_environment(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    notifier: Notifier,
    receiver: Receiver,
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(run_watchdog, notifier) == 2.0
        await trio.sleep(9)
        nursery.cancel_scope.cancel()
    assert receiver.datagrams() == [b"WATCHDOG=1"] * 5  # at 0, 2, 4, 6, 8


async def test_run_watchdog_returns_when_there_is_nothing_to_do(
    monkeypatch: pytest.MonkeyPatch, notifier: Notifier, receiver: Receiver
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(run_watchdog, notifier) is None
        assert (
            await nursery.start(partial(run_watchdog, Notifier(environ={}), interval=10.0)) is None
        )
    assert receiver.datagrams() == []
