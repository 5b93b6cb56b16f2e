"""crawld as systemd runs it: a subprocess, a NOTIFY_SOCKET, real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import NotifySocket

pytestmark = pytest.mark.process

CONFIG = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[jobs]
ttl = "{ttl}"
"""


@pytest.fixture
def crawld_process(
    tmp_path: Path, notify_socket: NotifySocket
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    path = tmp_path / "crawld.toml"
    path.write_text(CONFIG.format(ttl="24h"))
    # stderr is a pipe named in JOURNAL_STREAM, as systemd connects it to journald
    read_end, write_end = os.pipe()
    stat = os.fstat(write_end)
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify_socket.address,
        "WATCHDOG_USEC": "1000000",
        "JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}",
    }
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", "run", "--config", str(path)],
        env=env,
        stderr=write_end,
        text=True,
    )
    os.close(write_end)
    proc.stderr = os.fdopen(read_end, encoding="utf-8")
    try:
        yield proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()


def next_message(sock: NotifySocket, watchdogs: list[int]) -> dict[str, str]:
    while True:
        message = sock.receive(timeout=30)
        if message == {"WATCHDOG": "1"}:
            watchdogs.append(1)
            continue
        return message


def test_ready_reload_rejected_reload_and_stop(
    crawld_process: tuple[subprocess.Popen[str], Path], notify_socket: NotifySocket
) -> None:
    proc, path = crawld_process
    watchdogs: list[int] = []

    ready = next_message(notify_socket, watchdogs)
    assert ready["READY"] == "1", ready
    match = re.search(r"http on ([\d.]+):(\d+)", ready["STATUS"])
    assert match, ready
    base = f"http://{match.group(1)}:{match.group(2)}"

    path.write_text(CONFIG.format(ttl="2h"))
    before_usec = __import__("time").monotonic_ns() // 1000
    proc.send_signal(signal.SIGHUP)
    reloading = next_message(notify_socket, watchdogs)
    assert set(reloading) == {"RELOADING", "MONOTONIC_USEC", "STATUS"}
    assert reloading["RELOADING"] == "1"
    assert int(reloading["MONOTONIC_USEC"]) >= before_usec
    done = next_message(notify_socket, watchdogs)
    assert done["READY"] == "1" and "config generation 2" in done["STATUS"]

    path.write_text(CONFIG.format(ttl="2h") + "[broker]\nkind = 'carrier-pigeon'\n")
    proc.send_signal(signal.SIGHUP)
    assert next_message(notify_socket, watchdogs)["RELOADING"] == "1"
    rejected = next_message(notify_socket, watchdogs)
    assert rejected["READY"] == "1"
    assert "reload rejected, keeping generation 2" in rejected["STATUS"]
    assert "$.broker.kind" in rejected["STATUS"]

    status = httpx.get(base + "/status", timeout=10).json()
    assert status["config"]["generation"] == 2
    assert status["config"]["last_reload"]["ok"] is False

    proc.send_signal(signal.SIGTERM)
    assert next_message(notify_socket, watchdogs) == {"STOPPING": "1"}
    assert proc.wait(timeout=30) == 0
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert all(line.startswith("<") for line in log.splitlines() if line), log
    assert "<3>crawld.daemon: configuration reload rejected" in log
    assert watchdogs, "no WATCHDOG=1 while running"


def test_bad_config_exits_2_with_key_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[store]\nsynchronous = 'sometimes'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "daemon", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "$.store.synchronous" in proc.stderr and "bad.toml" in proc.stderr


def test_a_second_process_on_one_state_dir_refuses_naming_the_first(
    crawld_process: tuple[subprocess.Popen[str], Path], notify_socket: NotifySocket
) -> None:
    proc, path = crawld_process
    while next_message(notify_socket, []).get("READY") != "1":
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    second = subprocess.run(
        [sys.executable, "-m", "daemon", "run", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert f"in use by another crawld (pid {proc.pid})" in second.stderr
    assert proc.poll() is None  # the first one goes on
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0

    # a killed holder leaves nothing stuck: the lock went with it
    def ready() -> subprocess.Popen[bytes]:
        started = subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(path)],
            env={**env, "NOTIFY_SOCKET": notify_socket.address},
            stderr=subprocess.DEVNULL,
        )
        while next_message(notify_socket, []).get("READY") != "1":
            pass
        return started

    killed = ready()
    killed.kill()
    killed.wait(timeout=30)
    after = ready()
    after.send_signal(signal.SIGTERM)
    assert after.wait(timeout=30) == 0
