from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from daemon import settings as config
from tests.test_docs import config_keys

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
    # Uploads have their own limit, Firecrawl's 50 MB, far over [http] max_body (issue 35);
    # OCR is on wherever the engine is installed.
    assert cfg.parse.enabled and cfg.parse.max_bytes == 50 * 1024 * 1024 > 1_500_000
    assert cfg.http.max_body < 1_500_000 < cfg.parse.max_bytes
    assert (cfg.ocr.enabled, cfg.ocr.engine) == ("auto", "tesseract")


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


def _key_paths(info: msgspec.inspect.Type, prefix: str) -> set[str]:
    """The path of every key holding a value (not a table) in `info`: a list of tables adds no
    step (`collector.tasks.id`), a table of named tables adds `*` (`llm.providers.*.model`)."""
    if isinstance(info, msgspec.inspect.StructType):
        paths: set[str] = set()
        for f in info.fields:
            path = f"{prefix}.{f.name}" if prefix else f.name
            paths |= _key_paths(f.type, path) or {path}
        return paths
    if isinstance(info, msgspec.inspect.UnionType):
        return set().union(*(_key_paths(t, prefix) for t in info.types))
    if isinstance(info, msgspec.inspect.ListType):
        return _key_paths(info.item_type, prefix)
    if isinstance(info, msgspec.inspect.DictType):
        return _key_paths(info.value_type, f"{prefix}.*")
    return set()


SHOWN_ELSEWHERE = {"collector.accounts.api_key_env"}
"""Keys config.toml names in a comment of another key (`# or api_key_env = ...`)."""


def test_every_key_of_the_whole_config_is_shown_in_config_toml() -> None:
    """config.toml (and so the config reference, kept in step with it by tests/test_docs.py)
    shows every key the assembled Config reads, from the core's and each area's sections: a key
    counts as shown when it is, or when the value holding it is (`crawl.stealth_proxies`, whose
    row describes its tables); a provider's key counts as shown when `llm.<key>` is."""
    shown = config_keys((ROOT / "config.toml").read_text())
    # The example `[llm.providers.openai]` stands for any provider name.
    shown |= {re.sub(r"^llm\.providers\.[^.]+\.", "llm.providers.*.", key) for key in shown}
    paths = _key_paths(msgspec.inspect.type_info(config.Config), "") - {"source"}
    missing = {
        path
        for path in paths
        if not any(".".join(path.split(".")[:n]) in shown for n in range(1, path.count(".") + 2))
        and not (path.startswith("llm.providers.*.") and "llm." + path.split(".")[-1] in shown)
    }
    assert sorted(missing - SHOWN_ELSEWHERE) == []
    assert not SHOWN_ELSEWHERE - missing, "shown on a line of its own now: remove it above"
