from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from daemon import settings as config
from daemon.app import Daemon, run_daemon
from daemon.systemd import Notifier
from tests.conftest import NotifySocket

BASE = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
"""


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "crawld.toml"
    path.write_text(BASE + extra)
    return path


async def start(nursery: trio.Nursery, path: Path, notifier: Notifier) -> Daemon:
    cfg = config.load(path)

    async def runner(task_status: trio.TaskStatus[Daemon]) -> None:
        await run_daemon(cfg, notifier=notifier, task_status=task_status)

    daemon: Daemon = await nursery.start(runner)
    return daemon


def url(daemon: Daemon, path: str) -> str:
    assert daemon.http_address is not None
    host, port = daemon.http_address
    return f"http://{host}:{port}{path}"


async def test_serves_health_status_metrics_openapi(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    async with trio.open_nursery() as nursery:
        daemon = await start(nursery, write_config(tmp_path), Notifier(notify_socket.address))
        ready = await notify_socket.areceive()
        assert ready["READY"] == "1"
        assert "running" in ready["STATUS"]
        async with httpx.AsyncClient() as client:
            assert (await client.get(url(daemon, "/healthz"))).json() == {"status": "ok"}
            status = (await client.get(url(daemon, "/status"))).json()
            assert status["state"] == "running"
            assert status["config"]["generation"] == 1
            states = {c["name"]: c["state"] for c in status["components"]}
            assert states["http"] == states["collector"] == "running"
            assert status["store"]["schema_version"] >= 1
            metrics = await client.get(url(daemon, "/metrics"))
            assert "crawld_config_generation 1.0" in metrics.text
            spec = (await client.get(url(daemon, "/openapi.json"))).json()
            assert {"/healthz", "/status", "/metrics"} <= set(spec["paths"])
            missing = await client.get(url(daemon, "/nope"))
            assert missing.status_code == 404
            assert missing.json() == {"error": "not found", "detail": {"path": "/nope"}}
            wrong = await client.post(url(daemon, "/status"))
            assert wrong.status_code == 405 and wrong.json()["error"] == "method not allowed"
        daemon.request_stop()
    assert (tmp_path / "state" / "crawld.db").exists()


async def test_reload_applies_valid_and_keeps_old_on_error(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    path = write_config(tmp_path)
    async with trio.open_nursery() as nursery:
        daemon = await start(nursery, path, Notifier(notify_socket.address))
        await notify_socket.areceive()
        path.write_text(BASE + "[jobs]\nttl = '2h'\n")
        assert await daemon.reload()
        assert daemon.generation == 2 and daemon.config.jobs.ttl == 7200
        reloading = await notify_socket.areceive()
        assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0
        assert (await notify_socket.areceive())["READY"] == "1"

        path.write_text(BASE + "[jobs]\nttl = 'forever'\n")
        assert not await daemon.reload()
        assert daemon.generation == 2 and daemon.config.jobs.ttl == 7200
        assert (await notify_socket.areceive())["RELOADING"] == "1"
        after = await notify_socket.areceive()
        assert after["READY"] == "1"
        assert "keeping generation 2" in after["STATUS"] and "$.jobs.ttl" in after["STATUS"]
        assert daemon.last_reload is not None and not daemon.last_reload.ok
        daemon.request_stop()


async def test_missing_secret_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRAWLD_TEST_SECRET", raising=False)
    path = write_config(tmp_path, "[webhooks]\nsecret_env = 'CRAWLD_TEST_SECRET'\n")
    with pytest.raises(config.ConfigError, match="CRAWLD_TEST_SECRET"):
        await run_daemon(config.load(path), notifier=Notifier(None))
