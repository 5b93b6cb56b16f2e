"""The official JS SDK (@mendable/firecrawl-js, tests/js) against crawld and the generated site:
`node --test tests/js/sdk.test.mjs`, whose TAP summary is read here. Run with and without an API
key, and with and without a global WebSocket (Node 20 has one only with --experimental-websocket),
so the watcher's WebSocket path and its polling path both run. Under CI=true a missing Node or
missing node_modules fails the test instead of skipping it (scripts/test runs `npm ci`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from daemon.fakes.site import SiteSim

from .conftest import CONFIG

pytestmark = pytest.mark.node  # drives Node: the SDKs' wire formats, not the store

JS = Path(__file__).resolve().parent.parent / "js"
KEY = "js-sdk-test-key-0123456789"
KEY_ENV = "CRAWLD_TEST_JS_API_KEY"
TESTS = 7
"""test() calls in sdk.test.mjs: every one must pass."""


def node_or_fail() -> str:
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed (apt-get install nodejs npm)"
    elif not (JS / "node_modules" / "@mendable" / "firecrawl-js").is_dir():
        missing = "tests/js/node_modules is missing (cd tests/js && npm ci)"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    assert node is not None
    return node


def websocket_flag(node: str, on: bool) -> list[str]:
    """The flag giving (on) or withholding (off) Node's global WebSocket for this Node."""
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    if major < 22:
        return ["--experimental-websocket"] if on else []
    return [] if on else ["--no-experimental-websocket"]


@pytest.fixture(params=["no-key", "key"])
def api_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    if request.param == "no-key":
        return None
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def crawl_config(api_key: str | None) -> str:
    if api_key is None:
        return CONFIG
    return CONFIG.replace(
        'bind = "127.0.0.1:0"', f'bind = "127.0.0.1:0"\napi_key_env = "{KEY_ENV}"'
    )


@pytest.mark.parametrize("websocket", [True, False], ids=["websocket", "no-websocket"])
async def test_the_js_sdk_works_against_crawld(
    base_url: str, site: SiteSim, api_key: str | None, websocket: bool
) -> None:
    node = node_or_fail()
    site.slow_seconds = 30  # /slow stays running until it is cancelled
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "SITE_URL": site.url("").rstrip("/"),
        # The watcher opens a WebSocket only with a key (the key is its subprotocol); without
        # one, or without a global WebSocket, it polls.
        "EXPECT_WEBSOCKET": "1" if websocket and api_key else "0",
        "NODE_NO_WARNINGS": "1",
    }
    if api_key:
        env["CRAWLD_KEY"] = api_key
    command = [node, *websocket_flag(node, websocket), "--test", "--test-reporter=tap",
               str(JS / "sdk.test.mjs")]  # fmt: skip
    with trio.fail_after(240):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS), out[-3000:]
