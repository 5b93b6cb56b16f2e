"""Credentials in URLs and headers never leave through the API, errors or logs (issue 7,
finding 3): /tasks, /status, /v2/crawl/{id}/errors, error answers and log values."""

from __future__ import annotations

import logging

import pytest

from daemon.logs import JournalFormatter, format_context
from daemon.redact import redact_text, redact_tree
from tests.api.conftest import StartDaemon, client

SECRETS = ("hunter2", "tok-123", "s3cr3t-bearer", "sig-456")
HOOK = "https://alice:hunter2@hooks.example/rows?token=tok-123&sig=sig-456"

COLLECTOR = f"""
[collector]
auto_start = false
[[collector.accounts]]
name = "main"
base_url = "http://127.0.0.1:9"
username = "demo"
password_env = "CRAWLD_TEST_OCTO_PW"
[[collector.tasks]]
id = "plain"
account = "main"
task_id = "t1"
date_field = "d"
webhook = "{HOOK}"
[[collector.tasks]]
id = "spec"
account = "main"
task_id = "t2"
date_field = "d"
webhook = {{ url = "{HOOK}", headers = {{ Authorization = "Bearer s3cr3t-bearer", "X-Trace" = "on" }} }}
"""


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


async def test_tasks_answer_redacts_webhook_urls_and_headers(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRAWLD_TEST_OCTO_PW", "pw")
    daemon = await start_daemon(extra=COLLECTOR)
    async with client(daemon) as c:
        answer = await c.get("/tasks")
    assert answer.status_code == 200
    assert_no_secret(answer.text)
    tasks = {t["settings"]["id"]: t["settings"] for t in answer.json()["tasks"]}
    redacted = "https://alice:***@hooks.example/rows?token=***&sig=***"
    assert tasks["plain"]["webhook"] == redacted
    assert tasks["spec"]["webhook"]["url"] == redacted
    assert tasks["spec"]["webhook"]["headers"] == {"Authorization": "***", "X-Trace": "***"}


async def test_status_sections_and_component_errors_are_redacted(
    start_daemon: StartDaemon,
) -> None:
    daemon = await start_daemon()

    async def leaky() -> dict[str, object]:
        return {"url": HOOK, "headers": {"Authorization": "Bearer s3cr3t-bearer"}, "n": 1}

    daemon.status_sections["webhooks"] = leaky
    daemon.component_states["http"].last_error = f"ConnectError: {HOOK} refused"
    async with client(daemon) as c:
        status = await c.get("/status")
    assert status.status_code == 200
    assert_no_secret(status.text)
    assert status.json()["webhooks"]["n"] == 1


async def test_job_errors_show_only_the_redacted_url(start_daemon: StartDaemon) -> None:
    """Errors stored before URLs were redacted at the source still leave redacted."""
    daemon = await start_daemon()
    job = await daemon.jobs.create_job("crawl", webhook=None, source={})
    await daemon.jobs.add_error(job, "WEBHOOK_FAILED", f"POST {HOOK} answered 500", url=HOOK)
    async with client(daemon) as c:
        errors = await c.get(f"/v2/crawl/{job}/errors")
    assert errors.status_code == 200
    assert_no_secret(errors.text)
    [error] = errors.json()["errors"]
    assert error["url"] == "https://alice:***@hooks.example/rows?token=***&sig=***"


async def test_error_answers_redact_urls_they_quote(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    async with client(daemon) as c:
        r = await c.post("/crawl/stop", json={"task_id": HOOK})
        assert r.status_code == 404
        assert_no_secret(r.text)
        bad = await c.post("/crawl/start", json={"webhook": "ftp://u:hunter2@x/?token=tok-123"})
        assert bad.status_code == 422
        assert_no_secret(bad.text)


def test_log_values_with_urls_are_redacted() -> None:
    line = format_context({"url": HOOK, "error": f"timeout calling {HOOK}", "task": "a"})
    assert_no_secret(line)
    assert "task=a" in line and "hooks.example/rows" in line
    record = logging.LogRecord("crawld.jobs", logging.WARNING, __file__, 1, "failed", (), None)
    record.ctx = {"url": HOOK}
    assert_no_secret(JournalFormatter().format(record))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no url here", "no url here"),
        ("GET https://h.example/p ok", "GET https://h.example/p ok"),
        ("amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("'https://h/?a=1' and http://t@h/", "'https://h/?a=***' and http://***@h/"),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_redact_tree_masks_headers_anywhere() -> None:
    tree = {"a": [{"headers": {"Authorization": "x", "Content-Type": "json"}}], "n": None}
    assert redact_tree(tree) == {
        "a": [{"headers": {"Authorization": "***", "Content-Type": "json"}}],
        "n": None,
    }
