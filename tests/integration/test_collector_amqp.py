"""The collector end to end with a real RabbitMQ: simulator -> filter -> outbox -> queue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from daemon import broker
from daemon.app import Daemon
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from tests.conftest import Deployment, serve_daemon
from tests.integration.conftest import RabbitCtl
from tests.integration.test_broker import close_connections_named

pytestmark = pytest.mark.broker
DAY = 86_400_000

TEMPLATE = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:{http_port}"
[broker]
kind = "amqp"
url = "{url}"
password_env = "TEST_AMQP_PW"
queue = "{queue}"
confirm_window = {window}
reconnect_max = "500ms"
[collector]
auto_start = {auto_start}
batch_size = 100
interval = "1h"
[[collector.accounts]]
name = "main"
base_url = "{base}"
username = "demo"
password_env = "SIM_PW"
[[collector.tasks]]
id = "jobs"
account = "main"
task_id = "{task_id}"
date_field = "发布时间"
"""


def split_url(url: str, name: str) -> tuple[str, str]:
    """The config's URL (no password, a connection name to find it by) and the password."""
    plain, password = broker.split_password(broker.amqp_url(url, connection_name=name))
    return plain, password or "guest"


@dataclass
class Setup:
    sim: OctoparseSim
    task_id: str
    base: str

    def config_text(self, amqp_url: str, queue: str, *, auto_start: bool = False,
                    window: int = 100, http_port: int = 0) -> str:  # fmt: skip
        url, password = split_url(amqp_url, f"crawld-{queue}")
        os.environ["TEST_AMQP_PW"] = password
        return TEMPLATE.format(
            url=url, queue=queue, base=self.base, task_id=self.task_id, window=window,
            auto_start=str(auto_start).lower(), http_port=http_port,
        )  # fmt: skip


@pytest.fixture
async def setup(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    sim = OctoparseSim()
    task_id = sim.add_task("jobs")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                sim, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        yield Setup(sim, task_id, f"http://{host}:{port}")
        stop.set()


def add_rows(sim: OctoparseSim, task_id: str, old: int, new: int) -> None:
    now = int(time.time() * 1000)
    sim.append_dated(task_id, [now - 10 * DAY - i for i in range(old)])
    sim.append_dated(task_id, [now - DAY + i for i in range(new)])


def api(daemon: Daemon, path: str) -> str:
    assert daemon.http_address is not None
    return f"http://{daemon.http_address[0]}:{daemon.http_address[1]}{path}"


async def drained(daemon: Daemon, expected_size: int, http: httpx.AsyncClient) -> None:
    with trio.fail_after(30):
        while (await http.get(api(daemon, "/queue/size"))).json().get("size") != expected_size:
            await trio.sleep(0.05)


async def test_rows_reach_rabbitmq_with_ttl_and_properties(
    setup: Setup, amqp_url: str, queue_name: str, tmp_path: Path
) -> None:
    add_rows(setup.sim, setup.task_id, old=50, new=250)
    path = tmp_path / "crawld.toml"
    path.write_text(setup.config_text(amqp_url, queue_name))
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=30) as http:
        daemon = await serve_daemon(nursery, path)
        started = await http.post(api(daemon, "/crawl/start"), json={"task_id": "jobs"})
        assert started.status_code == 200
        await drained(daemon, 250, http)
        got = (await http.get(api(daemon, "/consume"), params={"count": 1000})).json()
        assert got["kind"] == "amqp" and got["count"] == 250
        message = got["messages"][0]
        assert message["expiration"] == "604800000"
        assert message["delivery_mode"] == 2
        assert message["headers"]["task_id"] == "jobs"
        assert len({m["message_id"] for m in got["messages"]}) == 250
        assert sorted(int(m["body"]["序号"]) for m in got["messages"]) == list(range(50, 300))
        status = (await http.get(api(daemon, "/status"))).json()
        assert status["broker"]["connected"] is True
        assert status["collector"]["undelivered"] == 0
        daemon.request_stop()


async def test_broker_connection_closed_mid_run_loses_nothing(
    setup: Setup, amqp_url: str, queue_name: str, tmp_path: Path, rabbitmqctl: RabbitCtl
) -> None:
    add_rows(setup.sim, setup.task_id, old=0, new=3000)
    path = tmp_path / "crawld.toml"
    path.write_text(setup.config_text(amqp_url, queue_name, window=50))
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=30) as http:
        daemon = await serve_daemon(nursery, path)
        await http.post(api(daemon, "/crawl/start"), json={"task_id": "jobs"})
        with trio.fail_after(30):
            while (await http.get(api(daemon, "/queue/size"))).json().get("size", 0) < 200:
                await trio.sleep(0.01)
        await close_connections_named(rabbitmqctl, f"crawld-{queue_name}")
        ids: list[str] = []
        with trio.fail_after(60):
            while len(set(ids)) < 3000:
                r = await http.get(api(daemon, "/consume"), params={"count": 1000})
                if r.status_code == 200:
                    ids.extend(m["message_id"] for m in r.json()["messages"])
                await trio.sleep(0.02)
        assert len(set(ids)) == 3000
        assert len(ids) - len(set(ids)) <= 50  # at most the unconfirmed batch again
        status = (await http.get(api(daemon, "/status"))).json()
        assert status["broker"]["reconnects"] >= 1
        daemon.request_stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_kill_9_between_publish_and_checkpoint(
    setup: Setup, amqp_url: str, queue_name: str, tmp_path: Path, deployment: Deployment
) -> None:
    """kill -9 while rows are being published: after a restart every kept row is in the queue,
    and duplicates are bounded by one confirm window."""
    add_rows(setup.sim, setup.task_id, old=100, new=6000)
    path = tmp_path / "crawld.toml"
    port = free_port()
    path.write_text(
        setup.config_text(amqp_url, queue_name, auto_start=True, window=100, http_port=port)
        + deployment.toml
    )
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, **deployment.env}

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(path)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async with httpx.AsyncClient(timeout=30) as http:
        proc = spawn()
        try:
            with trio.fail_after(120):  # a guard: a start and 1,000 rows on a busy machine
                while True:
                    try:
                        size = (await http.get(base + "/queue/size")).json().get("size", 0)
                    except httpx.HTTPError:
                        size = 0
                    if size >= 1000:
                        break
                    await trio.sleep(0.005)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        proc = spawn()
        try:
            ids: list[str] = []
            with trio.fail_after(90):
                while len(set(ids)) < 6000:
                    try:
                        r = await http.get(base + "/consume", params={"count": 1000})
                        if r.status_code == 200:
                            ids.extend(m["message_id"] for m in r.json()["messages"])
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(0.02)
            await trio.sleep(0.5)  # anything still in flight would show up as an extra duplicate
            r = await http.get(base + "/consume", params={"count": 1000})
            ids.extend(m["message_id"] for m in r.json()["messages"])
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert len(set(ids)) == 6000
    assert len(ids) - len(set(ids)) <= 100, "more duplicates than one confirm window"
