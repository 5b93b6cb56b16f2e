from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon import config

ROOT = Path(__file__).resolve().parents[1]

TASKS = """
[[collector.accounts]]
name = "main"
username = "u"
password_env = "OCTO_PW"

[[collector.tasks]]
id = "a"
account = "main"
task_id = "t-a"
date_field = "time"

[[collector.tasks]]
id = "b"
account = "main"
task_id = "t-b"
date_field = "time"
interval = "15m"
webhook = { url = "https://example.com/hook", events = ["completed"] }
"""


def test_shipped_config_is_valid() -> None:
    cfg = config.load(ROOT / "config.toml")
    assert cfg.broker.kind == "embedded"
    assert cfg.webhooks.retry_schedule == [5, 60, 300, 900, 3600]


def test_defaults_without_file_content() -> None:
    cfg = config.decode(b"", "empty.toml")
    assert cfg.http.bind == "127.0.0.1:8700"
    assert cfg.store.synchronous == "normal"


def test_tasks_and_durations() -> None:
    cfg = config.decode(TASKS, "c.toml")
    a, b = cfg.collector.tasks
    assert a.interval is None and b.interval == 900
    assert config.webhook_spec(b.webhook) == config.WebhookSpec(
        url="https://example.com/hook", events=["completed"]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[daemon]\nlog_level = 'loud'", "$.daemon.log_level"),
        ("[bogus]\nx = 1", "unknown field `bogus`"),
        ("[http]\nport = 1", "unknown field `port` - at `$.http`"),
        ("[collector]\nbatch_size = 5000", "batch_size must be between 1 and 1000"),
        (TASKS.replace('account = "main"\ntask_id = "t-b"', 'account = "x"\ntask_id = "t-b"'),
         "unknown account 'x' - at `$.collector.tasks[1].account`"),
        (TASKS.replace('id = "b"', 'id = "a"'), "duplicate task id 'a' - at `$.collector.tasks[1].id`"),
        (TASKS.replace('interval = "15m"', 'interval = "soon"'),
         "expected a duration like '10m'"),
        (TASKS.replace("https://example.com/hook", "ftp://x"),
         "webhook url must be an http:// or https:// URL"),
        (TASKS.replace('events = ["completed"]', 'headers = { "X-Firecrawl-Signature" = "x" }'),
         "is managed by crawld"),
        (TASKS.replace('date_field = "time"\ninterval', 'date_field = "time"\ntimezone = "Mars/Base"\ninterval'),
         "unknown timezone 'Mars/Base'"),
        ("[webhooks]\nallow_cidrs = ['not-a-net']", "allow_cidrs"),
        ("[broker]\nkind = 'amqp'\nurl = 'http://x'", "must start with amqp://"),
        ("source = 'x'", "set by crawld"),
        ("[daemon\n", "f.toml"),
    ],
)  # fmt: skip
def test_errors_name_file_and_key_path(text: str, message: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.decode(text, "f.toml")
    assert str(info.value).startswith("f.toml: ")
    assert message in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load("/nonexistent/crawld.toml")


def test_resolve_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCTO_PW", "s3cret")
    assert config.resolve_secret("OCTO_PW", "$.x") == "s3cret"
    assert config.resolve_secret(None, "$.x") is None
    monkeypatch.delenv("OCTO_PW")
    with pytest.raises(config.ConfigError, match=r"OCTO_PW \(named at `\$.collector"):
        config.resolve_secret("OCTO_PW", "$.collector.accounts[0].password_env")


def test_diff_reports_tasks_and_sections() -> None:
    old = config.decode(TASKS)
    new_text = TASKS.replace('interval = "15m"', 'interval = "20m"') + (
        '\n[[collector.tasks]]\nid = "c"\naccount = "main"\ntask_id = "t-c"\ndate_field = "t"\n'
    )
    new = config.decode(
        new_text.replace('id = "a"\naccount', 'id = "z"\naccount') + "[jobs]\nttl = '1h'\n"
    )
    change = config.diff(old, new)
    assert change.tasks_added == ["z", "c"]
    assert change.tasks_removed == ["a"]
    assert change.tasks_changed == ["b"]
    assert change.sections_changed == ["jobs"]
    assert config.diff(old, old).empty


def test_state_dir_is_relative_to_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    path = tmp_path / "c.toml"
    path.write_text("[daemon]\nstate_dir = 'st'\n")
    assert config.state_dir(config.load(path)) == tmp_path / "st"
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/crawld")
    assert config.state_dir(config.load(path)) == Path("/var/lib/crawld")


def test_check_config_command(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(TASKS)
    bad = tmp_path / "bad.toml"
    bad.write_text("[collector]\nbatch_size = 0\n")
    ok = subprocess.run([sys.executable, "-m", "daemon", "check-config", str(good)],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "ok (2 collector tasks)" in ok.stdout
    err = subprocess.run([sys.executable, "-m", "daemon", "check-config", str(bad)],
                         capture_output=True, text=True)  # fmt: skip
    assert err.returncode == 2
    assert "bad.toml" in err.stderr and "batch_size" in err.stderr
