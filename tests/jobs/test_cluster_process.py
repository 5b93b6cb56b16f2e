"""Webhook delivery across crawld processes on one PostgreSQL schema: kill -9 of the instance
draining the jobs, and SIGSTOP of it past its lease then SIGCONT; the receiver counts every
event, in order per job, at most the one in flight repeated, nothing stale after the wake-up.

A minimal local launcher (tests/jobs/crash_daemon.py per instance): instance "a" creates the
jobs, the others only run (their marker file exists, so they produce nothing)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from daemon.cluster import store as cs
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import store as jobstore
from daemon.store import open_store
from tests.conftest import pg_backend
from tests.jobs.conftest import SECRET, SECRET_ENV
from tests.jobs.test_crash import CONFIG, poll

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2.0


def _config(name: str, schema: str, state_dir: Path) -> str:
    return (
        CONFIG.replace('"state"', f'"{state_dir}"')
        + f"""
[store]
kind = "postgres"
dsn_env = "CRAWLD_TEST_STORE_DSN"
schema = "{schema}"
[cluster]
instance = "{name}"
lease = "{LEASE_S:g}s"
"""
    )


class Instances:
    """crawld processes (crash_daemon) sharing one schema; every one is killed on exit."""

    def __init__(self, tmp_path: Path, pg: tuple[str, str], rx: WebhookReceiver) -> None:
        self.tmp_path, self.pg, self.rx = tmp_path, pg, rx
        self.procs: dict[str, trio.Process] = {}
        self.marker = tmp_path / "jobs"

    async def start(self, name: str, *, jobs: int = 0, pages: int = 0) -> trio.Process:
        """Instance `name`; with `jobs`, it creates that many jobs of `pages` pages."""
        config = self.tmp_path / f"{name}.toml"
        config.write_text(_config(name, self.pg[1], self.tmp_path / f"state-{name}"))
        marker = self.marker
        if not jobs:
            marker = self.tmp_path / f"{name}.idle"
            marker.write_text("done\n")
        env = {**os.environ, SECRET_ENV: SECRET, "CRAWLD_TEST_STORE_DSN": self.pg[0]}
        for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY"):
            env.pop(var, None)
        command = [
            sys.executable, "-m", "tests.jobs.crash_daemon",
            str(config), self.rx.url(), str(pages), str(marker), str(max(1, jobs)),
        ]  # fmt: skip
        with (self.tmp_path / f"{name}.log").open("ab") as log:
            proc = await trio.lowlevel.open_process(command, env=env, cwd=ROOT, stderr=log)
        self.procs[name] = proc
        return proc

    async def alive_members(self) -> int:
        async with open_store(pg_backend(*self.pg)) as store:
            rows = await store.read(cs.members)
        return sum(1 for m in rows if m["expires_ms"] >= m["now_ms"])

    async def holders(self) -> dict[str, str]:
        """Job id → instance holding its drainer lease now."""
        async with open_store(pg_backend(*self.pg)) as store:
            rows = await store.read(lambda c: cs.leases(c, jobstore.STREAM_PREFIX))
        return {r["name"][len(jobstore.STREAM_PREFIX) :]: r["holder"] for r in rows if r["held"]}

    def job_ids(self) -> list[str]:
        return self.marker.read_text().split()[:-1]

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with _suppress_lookup():
                    proc.send_signal(signal.SIGCONT)
                proc.kill()


@asynccontextmanager
async def instances(
    tmp_path: Path, pg: tuple[str, str], rx: WebhookReceiver
) -> AsyncIterator[Instances]:
    group = Instances(tmp_path, pg, rx)
    try:
        yield group
    finally:
        group.cleanup()
        with trio.move_on_after(10):
            for proc in group.procs.values():
                await proc.wait()


class _suppress_lookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is ProcessLookupError


def delivered(rx: WebhookReceiver) -> int:
    return len({(r.job_id, r.seq) for r in rx.events() if r.seq is not None})


def check_every_event_once_in_order(rx: WebhookReceiver, ids: list[str], pages: int) -> None:
    rx.check()  # no event after a later one, resends identical, signatures valid
    for job in ids:
        seqs = rx.seqs(job)
        first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
        assert first_time == list(range(1, pages + 3)), job
        assert rx.events(job)[-1].type == "crawl.completed"
        assert len(seqs) - len(first_time) <= 1, f"job {job} repeated more than one event"


async def test_kill_9_of_the_draining_instance_others_continue_every_job(
    tmp_path: Path, rx: WebhookReceiver, pg_schema: tuple[str, str]
) -> None:
    jobs, pages, kill_after = 6, 30, 40
    events = jobs * (pages + 2)
    async with instances(tmp_path, pg_schema, rx) as group:
        await group.start("b")
        await group.start("c")
        # Quick answers first, then every answer stalls: the kill lands mid-stream.
        rx.delay_next(kill_after, 0.004)
        rx.delay_next(events, 60.0)
        a = await group.start("a", jobs=jobs, pages=pages)
        await poll(lambda: group.marker.exists() and delivered(rx) >= kill_after, 60)
        ids = group.job_ids()
        with trio.fail_after(10):
            while await group.alive_members() < 3:
                await trio.sleep(0.1)
        assert set((await group.holders()).values()) == {"a"}  # the creator drains its jobs
        a.kill()
        assert await a.wait() == -signal.SIGKILL
        killed_at = trio.current_time()
        before = delivered(rx)
        assert before < events, "the jobs were delivered before the kill"
        rx.clear_faults()
        rx.delay_next(events, 0.05)
        await poll(lambda: delivered(rx) > before, LEASE_S + 5)
        failover_s = trio.current_time() - killed_at
        takers: dict[str, str] = {}
        with trio.fail_after(60):
            while delivered(rx) < events:
                takers.update(await group.holders())
                await trio.sleep(0.1)
        spread = sorted(takers[job] for job in ids if job in takers)
        assert set(spread) == {"b", "c"}, spread  # the survivors share a's jobs
        check_every_event_once_in_order(rx, ids, pages)
        assert len(rx.duplicates) <= jobs, rx.duplicates
        print(f"failover {failover_s:.2f}s, {spread=}, repeated {len(rx.duplicates)} of {events}")
        for name in ("b", "c"):
            group.procs[name].send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await group.procs[name].wait() == 0


async def test_sigstop_past_the_lease_the_woken_drainer_delivers_nothing_stale(
    tmp_path: Path, rx: WebhookReceiver, pg_schema: tuple[str, str]
) -> None:
    pages, stop_after = 60, 15
    events = pages + 2
    async with instances(tmp_path, pg_schema, rx) as group:
        await group.start("b")
        # Quick answers, then one held for 3 s: a is paused with that event in flight, and its
        # answer (200) waits in a's socket until it wakes.
        rx.delay_next(stop_after, 0.004)
        rx.delay_next(1, 3.0)
        a = await group.start("a", jobs=1, pages=pages)
        await poll(lambda: group.marker.exists() and delivered(rx) >= stop_after, 60)
        [job] = group.job_ids()
        assert (await group.holders()) == {job: "a"}
        a.send_signal(signal.SIGSTOP)
        rx.clear_faults()
        await poll(lambda: delivered(rx) == events, LEASE_S + 30)
        assert (await group.holders()).get(job) in (None, "b")
        requests = len(rx.requests)
        a.send_signal(signal.SIGCONT)
        await trio.sleep(LEASE_S + 1.5)  # a wakes: its answer arrives, its lease is gone
        assert a.returncode is None, "the woken instance died"
        assert len(rx.requests) == requests, "the woken instance sent again"
        check_every_event_once_in_order(rx, [job], pages)
        print(f"repeated after the pause: {rx.duplicates}")
        async with open_store(pg_backend(*pg_schema)) as store:
            stream = await store.read(lambda c: jobstore.undelivered(c))
            errors = await store.read(lambda c: jobstore.list_errors(c, job))
        assert stream == {} and errors == []
        for proc in (a, group.procs["b"]):
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await proc.wait() == 0
