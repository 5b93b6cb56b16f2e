"""kill -9 in the middle of a bulk tick of a real `crawld run`, then a restart: no schedule is
lost, no snapshot is stored twice, and the recovered schedules run at once."""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.config_types import Duration
from daemon.fakes.bilibili import BilibiliSim, Curve, serve_sim
from daemon.store import Store, open_store
from daemon.store.postgres import PostgresBackend
from daemon.tracker.config import Limit
from tests.conftest import Deployment, NotifySocket

pytestmark = pytest.mark.process

SONGS = 600
HOUR = 3_600_000
CONFIG = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[collector]
auto_start = false
[tracker]
enabled = true
base_url = "{base}"
bulk_tick = "1s"
window = "5s"
[[tracker.proxies]]
name = "direct"
limits = [{{ requests = 200, per = "1s" }}]
bulk_limits = [{{ requests = 20, per = "1s" }}]
"""


async def seed(
    db: Path | PostgresBackend, sim: BilibiliSim, now: int, songs: int = SONGS
) -> list[int]:
    """Songs with one snapshot an hour old and a normal schedule due in the next seconds (what
    the regular dispatcher would have left), the same videos in the simulator."""
    aids = [sim.add_video(aid=500_000 + i, song=True, published_ms=now - 48 * HOUR,
                          curve=Curve.linear(10, start=1000)) for i in range(songs)]  # fmt: skip

    def fill(conn: Any) -> None:
        conn.execute("UPDATE tracker_settings SET window_ms = 5000")
        for i, aid in enumerate(aids):
            conn.execute(
                "INSERT INTO tracker_videos(aid, title, published_ms, status, added_ms)"
                " VALUES (?, 'song', ?, 0, ?)",
                (aid, now - 48 * HOUR, now - 2 * HOUR),
            )
            conn.execute("INSERT INTO tracker_songs VALUES (?, 1, ?)", (aid, now - 2 * HOUR))
            conn.execute("INSERT INTO tracker_labels VALUES (?, 'rules-1', 1, '[]', ?)", (aid, now))
            conn.execute(
                "INSERT INTO tracker_snapshots VALUES (?, ?, 1000, 0, 0, 0, 0, 0, 0)",
                (aid, now - HOUR),
            )
            for type_ in ("archive",):  # not due for days: the archive dispatcher adds none
                conn.execute(
                    "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                    " VALUES (?, ?, ?, ?)",
                    (aid, type_, now + 5 * 24 * HOUR, now),
                )
            conn.execute(
                "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                " VALUES (?, 'normal', ?, ?)",
                (aid, now + 2000 + i * 5, now),
            )

    async with open_store(db) as store:
        await store.write(fill)
    return aids


async def start(
    path: Path, sock: NotifySocket, extra_env: dict[str, str]
) -> tuple[trio.Process, str]:
    env = {**os.environ, "NOTIFY_SOCKET": sock.address, **extra_env}
    env.pop("WATCHDOG_USEC", None)
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "daemon", "run", "--config", str(path)],
        env=env,
        stderr=open(path.with_suffix(".log"), "a"),  # noqa: SIM115, ASYNC230
    )
    while True:
        message = await sock.areceive(timeout=30)
        if message.get("READY") == "1":
            match = re.search(r"http on ([\d.]+):(\d+)", message["STATUS"])
            assert match, message
            return proc, f"http://{match.group(1)}:{match.group(2)}"


async def read(db: Path | PostgresBackend, sql: str, *args: Any) -> list[Any]:
    """Rows of `sql`, through a store of its own. Opening and closing it (connections, on
    PostgreSQL) happen in a worker thread: the simulator the instances talk to runs on this
    trio thread, and a test polling this every few milliseconds would otherwise hold it up."""
    store = await trio.to_thread.run_sync(lambda: Store(db, readers=1))
    try:
        await trio.to_thread.run_sync(store.backend.open_readers)
        return await store.read(lambda c: c.execute(sql, args).fetchall())
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)


async def wait_snapshotted(
    db: Path | PostgresBackend, now: int, songs: int, timeout: float
) -> None:
    """Until each of `songs` seeded songs has a snapshot newer than `seed` left."""
    with trio.fail_after(timeout):
        while True:
            done = await read(
                db, "SELECT count(DISTINCT aid) FROM tracker_snapshots WHERE at_ms > ?", now - HOUR
            )
            if done[0][0] == songs:
                return
            await trio.sleep(0.2)


async def assert_snapshotted_once(db: Path | PostgresBackend, now: int, aids: list[int]) -> None:
    """What `seed` planned ran once: no seeded schedule was deleted (recovered ones keep their
    id), each one completed or found no proxy and left a retry that completed, each song has
    exactly one new snapshot and its next normal schedule."""
    seeded = dict(
        await read(
            db,
            "SELECT status, count(*) FROM tracker_schedules WHERE type = 'normal'"
            " AND created_ms = ? GROUP BY 1",
            now,
        )
    )
    assert sum(seeded.values()) == len(aids) and set(seeded) <= {"completed", "no_proxy"}, seeded
    per_aid = await read(
        db,
        "SELECT aid, count(*) FROM tracker_snapshots WHERE at_ms > ? GROUP BY aid",
        now - HOUR,
    )
    assert sorted(a for a, _ in per_aid) == aids and {n for _, n in per_aid} == {1}
    chained = await read(
        db,
        "SELECT count(DISTINCT aid) FROM tracker_schedules WHERE type = 'normal'"
        " AND status = 'pending'",
    )
    assert chained[0][0] == len(aids)


async def test_kill_during_bulk_tick_and_restart(
    tmp_path: Path, notify_socket: NotifySocket, deployment: Deployment
) -> None:
    sim = BilibiliSim(
        seed=1,
        limits=[Limit(requests=200, per=Duration(1))],
        bulk_limits=[Limit(requests=20, per=Duration(1))],
        latency_ms=(50, 150),
    )
    now = int(time.time() * 1000)
    (tmp_path / "state").mkdir()
    db = deployment.target(tmp_path / "state")
    aids = await seed(db, sim, now)
    path = tmp_path / "crawld.toml"
    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        host, port = await nursery.start(
            functools.partial(serve_sim, sim, "127.0.0.1:0", shutdown=shutdown)
        )
        path.write_text(CONFIG.format(base=f"http://{host}:{port}") + deployment.toml)

        proc, _ = await start(path, notify_socket, deployment.env)
        try:
            with trio.fail_after(20):
                while sim.requests["bulk"] < 3:  # the bulk tick has claimed its rows
                    await trio.sleep(0.002)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        killed_at = sim.requests["bulk"]
        processing = await read(
            db, "SELECT count(*) FROM tracker_schedules WHERE status = 'processing'"
        )
        assert processing[0][0] > 0  # killed with schedules in flight

        proc, base = await start(path, notify_socket, deployment.env)
        try:
            await wait_snapshotted(db, now, SONGS, 30)
            async with httpx.AsyncClient() as http:
                status = (await http.get(base + "/status", timeout=10)).json()["tracker"]
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        shutdown.set()

    assert sim.requests["bulk"] > killed_at
    await assert_snapshotted_once(db, now, aids)
    assert sim.rejected_412 == 0
    assert status["lag"]["normal"]["count"] > 0  # the recovered schedules ran after restart
