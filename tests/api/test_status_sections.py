"""/status answers within its bound when a section is stuck (a store read waiting out a cut), with
every other section in full, and a stuck section's read is joined, not started again."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from daemon.api import sections
from tests.api.conftest import StartDaemon, client


async def test_a_stuck_section_is_shown_missing_and_its_read_joined(autojump_clock: Any) -> None:
    release = trio.Event()
    calls = {"fast": 0, "stuck": 0}

    async def fast() -> dict[str, Any]:
        calls["fast"] += 1
        return {"n": 1}

    async def stuck() -> dict[str, Any]:
        calls["stuck"] += 1
        await release.wait()
        return {"n": 2}

    async def failing() -> dict[str, Any]:
        raise ValueError("boom")

    every = {"fast": fast, "stuck": stuck, "failing": failing}
    started = trio.current_time()
    answers = await sections.read_all(every, wait_s=2.0)
    assert trio.current_time() - started == 2.0
    assert list(answers) == ["fast", "stuck", "failing"]
    assert answers["fast"] == {"n": 1}
    assert answers["stuck"]["unavailable"].startswith("no answer within 2 s")
    assert answers["failing"] == {"unavailable": "this section failed: ValueError: boom"}

    again = await sections.read_all(every, wait_s=2.0)
    assert again["stuck"] == answers["stuck"]
    assert calls == {"fast": 2, "stuck": 1}  # the stuck read is joined, not started again

    release.set()
    await trio.testing.wait_all_tasks_blocked()
    started = trio.current_time()
    answers = await sections.read_all(every, wait_s=2.0)
    assert trio.current_time() == started  # nobody waits when every section answers
    assert answers["stuck"] == {"n": 2} and calls["stuck"] == 2


async def test_status_answers_in_full_but_for_a_stuck_section(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    release = trio.Event()

    async def stuck() -> dict[str, Any]:
        await release.wait()
        return {}

    daemon.status_sections["webhooks"] = stuck
    try:
        async with client(daemon) as c:
            with trio.fail_after(sections.WAIT_S + 8):
                status = await c.get("/status")
        assert status.status_code == 200
        body = status.json()
        assert body["webhooks"]["unavailable"].startswith("no answer within")
        assert body["state"] == "running" and body["store"]["writable"] is True
        assert "collector" in body  # the other sections answered
    finally:
        release.set()
