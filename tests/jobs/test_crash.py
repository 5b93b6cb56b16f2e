"""kill -9 of a real crawld process mid-delivery: after a restart every event arrives, in
order, and only the event in flight at the kill may arrive twice (same webhookId and bytes)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver
from tests.jobs.conftest import SECRET, SECRET_ENV

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
PAGES = 300
EVENTS = PAGES + 2  # started, pages, completed

CONFIG = f"""
[daemon]
state_dir = "state"
[http]
enabled = false
[webhooks]
secret_env = "{SECRET_ENV}"
timeout = "2s"
retry_schedule = ["10ms", "20ms"]
allow_cidrs = ["127.0.0.0/8"]
"""


async def poll(predicate: object, timeout: float) -> None:
    assert callable(predicate)
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_kill_9_mid_stream_then_restart_delivers_everything(
    tmp_path: Path, rx: WebhookReceiver
) -> None:
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(CONFIG)
    marker = tmp_path / "job"
    env = {**os.environ, SECRET_ENV: SECRET}
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY"):
        env.pop(name, None)
    command = [
        sys.executable, "-m", "tests.jobs.crash_daemon",
        str(config_file), rx.url(), str(PAGES), str(marker),
    ]  # fmt: skip
    rx.delay_next(10 * EVENTS, 0.004)  # slow the receiver so the kill lands mid-stream

    def delivered() -> set[int]:
        return {r.seq for r in rx.events() if r.seq is not None}

    first = await trio.lowlevel.open_process(command, env=env, cwd=ROOT)
    try:
        await poll(lambda: marker.exists() and len(delivered()) >= 40, 30)
        first.kill()  # SIGKILL: no cleanup of any kind
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    at_kill = len(delivered())
    assert at_kill < EVENTS, "the stream finished before the kill; slow the receiver down"
    job = marker.read_text().split()[0]

    second = await trio.lowlevel.open_process(command, env=env, cwd=ROOT)
    try:
        await poll(lambda: len(delivered()) == EVENTS, 60)
        second.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await second.wait() == 0
    finally:
        if second.returncode is None:
            second.kill()

    rx.check()  # in order, nothing after the terminal, resends identical, signatures valid
    assert delivered() == set(range(1, EVENTS + 1))
    assert rx.events(job)[-1].type == "crawl.completed"
    assert len(rx.duplicates) <= 1, rx.duplicates
    seqs = rx.seqs(job)
    assert seqs == sorted(seqs)
    first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
    assert first_time == list(range(1, EVENTS + 1))
