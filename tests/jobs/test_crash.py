"""kill -9 of a real crawld process mid-delivery: after a restart every event arrives, in
order, and only the event in flight at the kill may arrive twice (same webhookId and bytes), for
one job and for each of many jobs draining at once."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver
from tests.conftest import Deployment
from tests.jobs.conftest import SECRET, SECRET_ENV

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]

CONFIG = f"""
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
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


async def kill_then_restart(
    tmp_path: Path,
    rx: WebhookReceiver,
    deployment: Deployment,
    *,
    jobs: int,
    pages: int,
    kill_after: int,
) -> list[str]:
    """Run crash_daemon producing `jobs` jobs of `pages` pages, kill -9 it once `kill_after`
    events arrived, restart it and wait for every event; returns the job ids."""
    events = jobs * (pages + 2)  # started, pages, completed
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(CONFIG + deployment.toml)
    marker = tmp_path / "job"
    env = {**os.environ, SECRET_ENV: SECRET, **deployment.env}
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY"):
        env.pop(name, None)
    command = [
        sys.executable, "-m", "tests.jobs.crash_daemon",
        str(config_file), rx.url(), str(pages), str(marker), str(jobs),
    ]  # fmt: skip
    # The first `kill_after` answers come quickly, every later one stalls: the kill lands
    # mid-stream however fast the daemon drains (the stalled answers are dropped before the restart).
    rx.delay_next(kill_after, 0.004)
    rx.delay_next(events, 60.0)

    def delivered() -> int:
        return len({(r.job_id, r.seq) for r in rx.events() if r.seq is not None})

    first = await trio.lowlevel.open_process(command, env=env, cwd=ROOT)
    try:
        await poll(lambda: marker.exists() and delivered() >= kill_after, 120)
        first.kill()  # SIGKILL: no cleanup of any kind
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    assert delivered() < events, "the streams finished before the kill"
    ids = marker.read_text().split()[:-1]
    assert len(ids) == jobs
    rx.clear_faults()

    second = await trio.lowlevel.open_process(command, env=env, cwd=ROOT)
    try:
        await poll(lambda: delivered() == events, 120)
        second.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await second.wait() == 0
    finally:
        if second.returncode is None:
            second.kill()

    rx.check()  # in order, nothing after the terminal, resends identical, signatures valid
    for job in ids:
        seqs = rx.seqs(job)
        assert seqs == sorted(seqs)
        first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
        assert first_time == list(range(1, pages + 3))
        assert rx.events(job)[-1].type == "crawl.completed"
        assert len(seqs) - len(first_time) <= 1, f"job {job} repeated more than one event"
    return ids


async def test_kill_9_mid_stream_then_restart_delivers_everything(
    tmp_path: Path, rx: WebhookReceiver, deployment: Deployment
) -> None:
    await kill_then_restart(tmp_path, rx, deployment, jobs=1, pages=300, kill_after=40)
    assert len(rx.duplicates) <= 1, rx.duplicates


async def test_kill_9_with_many_jobs_repeats_at_most_one_event_per_job(
    tmp_path: Path, rx: WebhookReceiver, deployment: Deployment
) -> None:
    # Eight drainers at once (per_host_concurrency 8), their acks sharing the store's commits.
    ids = await kill_then_restart(tmp_path, rx, deployment, jobs=8, pages=40, kill_after=80)
    assert len(rx.duplicates) <= len(ids), rx.duplicates
