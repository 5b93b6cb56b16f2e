"""kill -9 of a real crawld process while a monitor notification waits for its retry (its target
answered 503): after a restart the notification is sent at its stored time, once, and the check
says `sent` — recorded with the check's end, it outlives the process that recorded it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim, serve_site
from tests.conftest import Deployment

from .crawld_process import config_head, crawld, free_port, running

pytestmark = pytest.mark.process


async def notification_status(client: httpx.AsyncClient, monitor_id: str, check_id: str) -> Any:
    answer = await client.get(f"/v2/monitor/{monitor_id}/checks/{check_id}")
    return answer.json()["data"]["notificationStatus"]


async def test_kill_9_between_attempts_then_the_notification_is_sent_once(
    tmp_path: Path, rx: WebhookReceiver, nursery: trio.Nursery, deployment: Deployment
) -> None:
    site = SiteSim(pages=3, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    port = free_port()
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(
        config_head(port) + '[monitors]\nnotify_retry_schedule = ["2s", "2s", "2s"]\n'
        f'[[monitors.notification_targets]]\nname = "ops"\nurl = "json://{rx.netloc}/notify"\n'
        + deployment.toml
    )
    command, env = crawld(config_file, deployment)
    rx.fail_next(1000, 503)

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                 timeout=10) as client:  # fmt: skip
        async with running(command, env, client) as first:
            body = {"name": "crash", "schedule": {"cron": "0 9 * * *"},
                    "notification": {"targets": ["ops"]},
                    "targets": [{"type": "scrape",
                                 "urls": [f"http://127.0.0.1:{site.port}/pages/1"]}]}  # fmt: skip
            monitor_id = (await client.post("/v2/monitor", json=body)).json()["data"]["id"]
            check_id = (await client.post(f"/v2/monitor/{monitor_id}/run")).json()["data"]["id"]
            with trio.fail_after(60):  # the first attempt failed and its retry is stored
                while (await client.get("/status")).json()["crawl"]["monitors"][
                        "notifications"]["retried"] < 1:  # fmt: skip
                    await trio.sleep(0.01)
            first.kill()  # SIGKILL: no cleanup of any kind
            await first.wait()
        rx.clear_faults()

        async with running(command, env, client) as second:
            with trio.fail_after(60):
                while await notification_status(client, monitor_id, check_id) != {
                        "targets": {"ops": "sent"}}:  # fmt: skip
                    await trio.sleep(0.05)
            second.terminate()
            with trio.fail_after(30):
                await second.wait()

    answers = [r.status for r in rx.requests if r.path == "/notify"]
    assert answers[-1] == 200 and answers.count(200) == 1, answers  # sent once
    assert set(answers[:-1]) == {503}
    told = next(r for r in rx.requests if r.path == "/notify" and r.status == 200)
    assert check_id in told.json["message"]
