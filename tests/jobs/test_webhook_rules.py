from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import trio

from daemon import settings as config
from daemon.__main__ import main
from daemon.app import Daemon, run_daemon
from daemon.config import WebhookSpec
from daemon.jobs.webhook_rules import (
    MAX_HEADERS,
    MAX_METADATA_KEYS,
    header_problem,
    headers_problem,
    metadata_problem,
    secret_problem,
    url_problem,
)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("Authorization", "Bearer abc", None),
        ("X-Team", "", None),
        ("X-Latin", "caf\xe9", "'X-Latin' contains a character outside ASCII"),  # httpx sends ASCII
        ("X-Tab", "a\tb", None),
        ("x!#$%&'*+-.^_`|~1", "v", None),
        ("X Bad", "v", "'X Bad' is not a valid HTTP header name (RFC 9110 token)"),
        ("", "v", "'' is not a valid HTTP header name"),
        ("X-Bad:", "v", "is not a valid HTTP header name"),
        ("X-\u00e9", "v", "is not a valid HTTP header name"),
        ("X-A\r\nX-B", "v", "is not a valid HTTP header name"),
        ("X-" + "a" * 300, "v", "is longer than 256 characters"),
        ("Content-Type", "text/plain", "'Content-Type' is managed by crawld"),
        ("webhook-id", "x", "is managed by crawld"),
        ("X-Firecrawl-Signature", "x", "is managed by crawld"),
        ("X-Inject", "a\r\nEvil: 1", "contains CR, LF, NUL or another control character"),
        ("X-Inject", "a\nb", "CR, LF, NUL or another control character (position 1)"),
        ("X-Nul", "a\x00", "CR, LF, NUL or another control character"),
        ("X-Del", "a\x7f", "control character"),
        (
            "X-Snow",
            "\u2603",
            "contains a character outside ASCII (header values are sent as ASCII) (position 0)",
        ),
        ("X-Emoji", "ok \U0001f600", "outside ASCII"),
    ],
)
def test_header_rules(name: str, value: str, problem: str | None) -> None:
    got = header_problem(name, value)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got and got.startswith("headers: ")


def test_header_problems_never_repeat_the_value() -> None:
    got = header_problem("Authorization", "Bearer s3cret\u2603")
    assert got is not None and "s3cret" not in got


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({}, None),
        ({f"X-{i}": "v" for i in range(MAX_HEADERS)}, None),
        ({f"X-{i}": "v" for i in range(MAX_HEADERS + 1)}, "33 headers; at most 32"),
        ({"X-A": "a" * 8000, "X-B": "b" * 200}, "bytes of names and values; at most 8192"),
        ({"X-A": "1", "x-a": "2"}, "'x-a' is given twice"),
    ],
)
def test_header_set_rules(headers: dict[str, str], problem: str | None) -> None:
    got = headers_problem(headers)
    assert got is None if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({}, None),
        ({"team": "a", "队": "中文"}, None),
        ({f"k{i}": "v" for i in range(MAX_METADATA_KEYS)}, None),
        ({f"k{i}": "v" for i in range(MAX_METADATA_KEYS + 1)}, "65 keys; at most 64"),
        ({"": "v"}, "keys cannot be empty"),
        ({"k" * 257: "v"}, "is longer than 256 characters"),
        ({"k": "v" * 2049}, "the value of 'k' is 2049 characters long; at most 2048"),
        ({f"k{i}": "v" * 2000 for i in range(9)}, "bytes of keys and values; at most 16384"),
        ({"k": "中" * 2000, "j": "中" * 2000, "l": "中" * 2000}, "at most 16384"),
    ],
)
def test_metadata_rules(metadata: dict[str, str], problem: str | None) -> None:
    got = metadata_problem(metadata)
    assert got is None if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example.com/in?token=x", None),
        ("http://127.0.0.1:8080/", None),
        ("ftp://x/", "must be an http:// or https:// URL"),
        ("https://", "must be an http:// or https:// URL"),
        ("https://h/" + "a" * 2048, "characters long; at most 2048"),
        ("https://h/a\r\nb", "CR, LF or NUL"),
    ],
)
def test_url_rules(url: str, problem: str | None) -> None:
    got = url_problem(url)
    assert got is None if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", None),  # 24 bytes
        ("whsec_" + "A" * 86 + "==", None),  # 64 bytes
        ("whsec_" + "A" * 88, "must decode to 24-64 bytes, this one decodes to 66"),
        ("plain secret text", None),
        ("", "the secret is empty"),
        (" whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whitespace"),
        ("whsec_not base64!", "must be followed by base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS", "must be followed by base64"),  # bad padding
        ("whsec_AAAA", "must decode to 24-64 bytes, this one decodes to 3"),
        ("whsec_", "decodes to 0"),
    ],
)
def test_secret_rules(secret: str, problem: str | None) -> None:
    got = secret_problem(secret)
    assert got is None if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    ("webhook", "message"),
    [
        ({"url": "https://h/", "headers": {"X Bad": "v"}}, "not a valid HTTP header name"),
        ({"url": "https://h/", "headers": {"X-A": "\u2603"}}, "outside ASCII"),
        ({"url": "https://h/", "headers": {"X-A": "a\r\nb"}}, "control character"),
        ({"url": "https://h/", "metadata": {"k": "v" * 5000}}, "metadata: the value of 'k'"),
    ],
)
def test_a_request_webhook_is_refused_naming_the_field(
    webhook: dict[str, object], message: str
) -> None:
    class Start(msgspec.Struct):
        webhook: str | WebhookSpec | None = None

    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(msgspec.json.encode({"webhook": webhook}), type=Start)
    assert message in str(caught.value) and "$.webhook" in str(caught.value)


def test_config_webhook_is_refused_with_its_key_path() -> None:
    text = """
[[collector.accounts]]
name = "main"
api_key_env = "K"
[[collector.tasks]]
id = "a"
account = "main"
task_id = "t"
date_field = "time"
webhook = { url = "https://h/", headers = { "X-A" = "caf\u00e9 \u2603" } }
"""
    with pytest.raises(config.ConfigError, match=r"outside ASCII .*\$\.collector\.tasks\[0\]"):
        config.decode(text, "f.toml")


BAD_SECRET = "whsec_AAAA"


def test_check_config_secrets_refuses_a_bad_whsec_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[webhooks]\nsecret_env = "CRAWLD_TEST_RULES_SECRET"\n')
    monkeypatch.setenv("CRAWLD_TEST_RULES_SECRET", BAD_SECRET)
    assert main(["check-config", str(path)]) == 0  # without --secrets, env is not read
    assert main(["check-config", "--secrets", str(path)]) == 2
    err = capsys.readouterr().err
    assert "CRAWLD_TEST_RULES_SECRET" in err and "$.webhooks.secret_env" in err
    assert "decodes to 3" in err and BAD_SECRET not in err
    monkeypatch.setenv("CRAWLD_TEST_RULES_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert main(["check-config", "--secrets", str(path)]) == 0


async def test_the_daemon_does_not_start_with_a_bad_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRAWLD_TEST_RULES_SECRET", BAD_SECRET)
    cfg = config.decode(
        f'[daemon]\nstate_dir = "{tmp_path}"\n[http]\nenabled = false\n'
        '[webhooks]\nsecret_env = "CRAWLD_TEST_RULES_SECRET"\n'
    )
    with trio.fail_after(10), pytest.raises(config.ConfigError, match="must decode to 24-64"):
        await run_daemon(cfg)


async def test_a_reload_with_a_bad_secret_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRAWLD_TEST_RULES_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    path = tmp_path / "c.toml"
    base = f'[daemon]\nstate_dir = "{tmp_path}"\n[http]\nenabled = false\n'
    base += "[crawl.browser]\nenabled = false\n"
    path.write_text(base + '[webhooks]\nsecret_env = "CRAWLD_TEST_RULES_SECRET"\n')

    async def runner(task_status: trio.TaskStatus[Daemon]) -> None:
        await run_daemon(config.load(path), task_status=task_status)

    async with trio.open_nursery() as nursery:
        daemon: Daemon = await nursery.start(runner)
        monkeypatch.setenv("CRAWLD_TEST_RULES_SECRET", BAD_SECRET)
        path.write_text(
            base + '[webhooks]\nsecret_env = "CRAWLD_TEST_RULES_SECRET"\ntimeout = "3s"\n'
        )
        assert not await daemon.reload()
        assert daemon.config.webhooks.timeout == 10 and daemon.generation == 1
        assert daemon.last_reload is not None and "decodes to 3" in daemon.last_reload.message
        daemon.request_stop()
