"""The browser supervisor, its DevTools pipe and the SOCKS5 vetting proxy: the pure parts with
plain values, then a real Chromium (skipped without one, failed under CI=true)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import msgspec
import pytest
import trio

from daemon import settings as config_module
from daemon.crawl.config import BrowserChoice, BrowserConfig
from daemon.crawl.fetching.proxy import (
    REP_COMMAND,
    REP_NOT_ALLOWED,
    SocksError,
    SocksRequest,
    parse_greeting,
    parse_request,
    reply,
)
from daemon.crawl.rendering.browser import DIR_PREFIX, browser_args, stale_browsers
from daemon.crawl.rendering.cdp import CdpClosed
from tests.crawl.conftest import live_browser_processes, start_browser

# -- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "need"),
    [(b"", None), (b"\x05", None), (b"\x05\x01\x00", 3), (b"\x05\x02\x02\x00", 4)],
)
def test_socks_greeting(data: bytes, need: int | None) -> None:
    assert parse_greeting(data) == need


@pytest.mark.parametrize("data", [b"\x04\x01\x00", b"\x05\x01\x02"])
def test_socks_greeting_refused(data: bytes) -> None:
    with pytest.raises(SocksError):
        parse_greeting(data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x05\x01\x00\x03\x09site.test\x00\x50", (SocksRequest("site.test", 80), 16)),
        (b"\x05\x01\x00\x01\x7f\x00\x00\x01\x01\xbb", (SocksRequest("127.0.0.1", 443), 10)),
        (b"\x05\x01\x00\x04" + bytes(15) + b"\x01\x00\x50", (SocksRequest("::1", 80), 22)),
        (b"\x05\x01\x00\x03\x09site", None),
        (b"\x05\x01", None),
    ],
)
def test_socks_request(data: bytes, expected: tuple[SocksRequest, int] | None) -> None:
    assert parse_request(data) == expected


def test_socks_only_connect() -> None:
    with pytest.raises(SocksError) as info:
        parse_request(b"\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50")  # BIND
    assert info.value.rep == REP_COMMAND
    assert reply(REP_NOT_ALLOWED)[:2] == b"\x05\x02"


def test_browser_args_close_every_way_out() -> None:
    args = browser_args("/x/udd", 4242, sandbox=True)
    for switch in (
        "--headless",
        "--remote-debugging-pipe",
        "--user-data-dir=/x/udd",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--proxy-server=socks5://127.0.0.1:4242",
        "--proxy-bypass-list=<-loopback>",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    ):
        assert switch in args
    assert "--no-sandbox" not in args
    assert not any(a.startswith("--remote-debugging-port") for a in args)
    assert "--no-sandbox" in browser_args("/x/udd", 4242, sandbox=False)


def test_stale_browsers_are_those_whose_crawld_is_gone(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    base = "/base"
    gone = 4_194_304 + 7  # above Linux's largest pid: never running
    cases = {
        "101": [b"chromium", f"--user-data-dir={base}/{DIR_PREFIX}{gone}-1-abc".encode()],
        "102": [b"crashpad", f"--database={base}/{DIR_PREFIX}{gone}-1-abc/config/x".encode()],
        "103": [b"chromium", f"--user-data-dir={base}/{DIR_PREFIX}{os.getppid()}-1-x".encode()],
        "104": [b"chromium", f"--user-data-dir={base}/{DIR_PREFIX}{os.getpid()}-2-x".encode()],
        "105": [b"chromium", b"--user-data-dir=/home/me/.config/chromium"],
    }
    for pid, argv in cases.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (proc / "self").mkdir()
    assert sorted(stale_browsers(proc, base)) == [101, 102]


def test_enabled_without_a_browser_is_a_clear_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[crawl.browser]\nenabled = true\nexecutable = "/nonexistent/chromium"\n')
    with pytest.raises(config_module.ConfigError) as info:
        config_module.load(path)
    text = str(info.value)
    assert "$.crawl.browser" in text and "no browser found" in text
    assert "apt-get install chromium" in text


def test_disabled_browser_needs_nothing() -> None:
    cfg = msgspec.convert({"enabled": False, "executable": "/nonexistent"}, BrowserConfig)
    assert cfg.choice() == BrowserChoice(mode="off", enabled=False, reason="enabled = false")
    cfg.check()


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox check applies to root")
def test_sandbox_as_root_is_refused_with_the_way_out() -> None:
    from tests.crawl.conftest import need_chromium

    need_chromium()
    with pytest.raises(ValueError, match="sandbox = false"):
        BrowserConfig(enabled=True, sandbox=True).check()


ON_PATH = "on PATH"
CHOICES = [  # ([crawl.browser] lines, a chromium on PATH, crawld's uid, what it comes to)
    ("", True, 1000, ("auto", True, ON_PATH, None)),
    ('enabled = "auto"', True, 1000, ("auto", True, ON_PATH, None)),
    ('enabled = "auto"', False, 1000, ("auto", False, None, "no browser found (none of")),
    ('enabled = "auto"', True, 0, ("auto", True, ON_PATH, None)),  # sandbox "auto": off as root
    ('enabled = "auto"\nsandbox = true', True, 0,
     ("auto", False, ON_PATH, "cannot use its sandbox as root")),
    ('enabled = "auto"\nsandbox = false', True, 0, ("auto", True, ON_PATH, None)),
    ('enabled = "auto"\nexecutable = "/nonexistent/chromium"', True, 1000,
     ("auto", False, None, "no browser found ('/nonexistent/chromium')")),
    ("enabled = true", True, 1000, ("on", True, ON_PATH, None)),
    ("enabled = true", False, 1000, "no browser found (none of chromium, chromium-headless-shell,"
     " chromium-browser, google-chrome is on PATH); install Debian's chromium (apt-get install"
     " chromium) or set [crawl.browser] enabled = false - at `$.crawl.browser.enabled`"),
    ("enabled = true", True, 0, ("on", True, ON_PATH, None)),
    ("enabled = true\nsandbox = true", True, 0, "- at `$.crawl.browser.sandbox`"),
    ("enabled = false", False, 0, ("off", False, None, "enabled = false")),
    ('enabled = "yes"', True, 1000, "- at `$.crawl.browser.enabled`"),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "found", "uid", "expected"), CHOICES)
def test_what_enabled_comes_to_on_this_machine(
    lines: str,
    found: bool,
    uid: int,
    expected: tuple[str, bool, str | None, str | None] | str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake chromium on an otherwise empty PATH, or none; root or a user."""
    if found:
        fake = tmp_path / "chromium"
        fake.write_text("#!/bin/sh\nexit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    text = f"[crawl.browser]\n{lines}\n"
    if isinstance(expected, str):
        with pytest.raises(config_module.ConfigError) as info:
            config_module.decode(text, "c.toml")
        assert expected in str(info.value)
        return
    choice = config_module.decode(text, "c.toml").crawl.browser.choice()
    mode, enabled, binary, reason = expected
    assert (choice.mode, choice.enabled) == (mode, enabled)
    assert choice.binary == (str(tmp_path / "chromium") if binary == ON_PATH else binary)
    assert (choice.reason is None) if reason is None else reason in str(choice.reason)
    if choice.enabled:  # the sandbox is used unless "auto" meets root, or it is off
        assert choice.sandbox is (uid != 0 and "sandbox = false" not in lines)
    assert ("binary" in choice.status(), "reason" in choice.status()) == (
        choice.binary is not None, choice.reason is not None)  # fmt: skip


def test_the_shipped_config_says_auto() -> None:
    root = Path(__file__).resolve().parents[2]
    assert config_module.load(root / "config.toml").crawl.browser.enabled == "auto"
    assert config_module.decode(b"", "empty.toml").crawl.browser.enabled == "auto"


# -- a real Chromium --------------------------------------------------------------------------


async def _wait_until(predicate: object, seconds: float = 15.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.05)


@pytest.mark.browser
async def test_tab_runs_scripts_and_is_closed_afterwards(nursery: trio.Nursery) -> None:
    browser = await start_browser(nursery, tabs=1, pages_per_context=1)
    pool = browser.pool
    async with pool.tab() as tab:
        await tab.session.call("Page.enable")
        with tab.session.subscribe("Page.loadEventFired") as loaded:
            await tab.session.call(
                "Page.navigate", url="data:text/html,<script>document.title='ran'</script>"
            )
            await loaded.receive()
        answer = await tab.session.call(
            "Runtime.evaluate", expression="document.title", returnByValue=True
        )
        assert answer["result"]["value"] == "ran"
        conn = tab.browser.conn
        contexts = await conn.call("Target.getBrowserContexts")
        assert tab.context_id in contexts["browserContextIds"]
    with trio.fail_after(10):  # disposed in the background
        while tab.context_id in (await conn.call("Target.getBrowserContexts"))["browserContextIds"]:
            await trio.sleep(0.05)
    targets = (await conn.call("Target.getTargets"))["targetInfos"]
    assert all(t.get("browserContextId") != tab.context_id for t in targets)
    assert pool.counts["pages"] == 1
    nursery.cancel_scope.cancel()


@pytest.mark.browser
async def test_crash_fails_only_its_pages_and_the_browser_comes_back(
    nursery: trio.Nursery,
) -> None:
    browser = await start_browser(nursery)
    pool = browser.pool
    failed: list[BaseException] = []

    async def hung_page() -> None:
        try:
            async with pool.tab() as tab:
                await tab.session.call(
                    "Runtime.evaluate", expression="new Promise(() => {})", awaitPromise=True
                )
        except CdpClosed as exc:
            failed.append(exc)

    async with trio.open_nursery() as pages:
        pages.start_soon(hung_page)
        await _wait_until(lambda: pool.status()["tabs_busy"] == 1)
        first = pool.status()["pid"]
        await trio.sleep(0.2)
        os.kill(first, signal.SIGKILL)
    assert len(failed) == 1
    await _wait_until(lambda: pool.status()["pid"] not in (None, first))
    async with pool.tab() as tab:
        answer = await tab.session.call("Runtime.evaluate", expression="6*7", returnByValue=True)
        assert answer["result"]["value"] == 42
    assert pool.counts["crashed"] == 1 and pool.counts["started"] == 2
    assert not live_browser_processes(f"{DIR_PREFIX}{os.getpid()}-1-")
    nursery.cancel_scope.cancel()


@pytest.mark.browser
async def test_browser_is_replaced_after_restart_after_pages(nursery: trio.Nursery) -> None:
    browser = await start_browser(nursery, restart_after=2)
    pool = browser.pool
    pids = []
    for _ in range(3):
        async with pool.tab() as tab:
            pids.append(tab.browser.pid)
    assert pids[0] == pids[1] != pids[2]
    assert pool.counts["recycled"] == 1
    nursery.cancel_scope.cancel()


@pytest.mark.browser
async def test_browser_over_max_memory_is_replaced(nursery: trio.Nursery) -> None:
    browser = await start_browser(nursery, tabs=1, max_memory=64 * 1024 * 1024)
    pool = browser.pool
    async with pool.tab():
        pass
    await _wait_until(lambda: pool.counts["recycled"] >= 1, 20)
    nursery.cancel_scope.cancel()


@pytest.mark.browser
async def test_no_chromium_outlives_the_pool() -> None:
    async with trio.open_nursery() as nursery:
        browser = await start_browser(nursery)
        async with browser.pool.tab():
            pass
        udd = browser.pool._current.user_data_dir  # type: ignore[union-attr]
        assert live_browser_processes(udd)
        nursery.cancel_scope.cancel()
    await _wait_until(lambda: not live_browser_processes(udd), 10)
    assert not await trio.Path(udd).exists()


@pytest.mark.browser
async def test_browser_traffic_of_its_own_goes_nowhere(nursery: trio.Nursery) -> None:
    """Chromium's own services (update checks, sign-in) use the closed port: nothing resolved,
    nothing connected; pages' contexts use the vetting port."""
    browser = await start_browser(nursery)
    async with browser.pool.tab() as tab:
        await tab.session.call("Page.navigate", url="http://203.0.113.9/")  # documentation range
    await _wait_until(lambda: browser.proxy.counts["refused"] >= 1)
    assert any("203.0.113.9" in r for r in browser.proxy.refused)
    assert browser.proxy.counts["tunnels"] == 0
    nursery.cancel_scope.cancel()


def test_proxy_knows_who_connected() -> None:
    from daemon.crawl.fetching.proxy import socket_owner

    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
        "   0: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001 0 1\n"
        "   1: 0100007F:1F90 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000   0 0 2\n"
    )
    assert socket_owner(table, ("127.0.0.1", 0xA1B2), ("127.0.0.1", 8080)) == 1001
    assert socket_owner(table, ("127.0.0.1", 0xA1B3), ("127.0.0.1", 8080)) is None


async def test_proxy_serves_its_own_user(nursery: trio.Nursery) -> None:
    from daemon.crawl.fetching.proxy import VettingProxy

    proxy = VettingProxy(allow_cidrs=("127.0.0.0/8",))
    await nursery.start(proxy.run)
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    await stream.send_all(b"\x05\x01\x00")
    assert await stream.receive_some(2) == b"\x05\x00"
    await stream.aclose()
    assert proxy.counts["foreign"] == 0
    nursery.cancel_scope.cancel()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
async def test_proxy_refuses_other_users(nursery: trio.Nursery) -> None:
    import shutil
    import sys

    from daemon.crawl.fetching.proxy import VettingProxy

    proxy = VettingProxy(allow_cidrs=("127.0.0.0/8",))
    await nursery.start(proxy.run)
    client = (
        "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
        "s.sendall(b'\\x05\\x01\\x00'); s.settimeout(5)\n"
        "try: print(repr(s.recv(2)))\n"
        "except ConnectionResetError: print(repr(b''))"
    )
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    done = await trio.run_process(
        [python, "-c", client, str(proxy.port)],  # stdlib only: nobody may not read the venv
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd="/",
        preexec_fn=lambda: os.setuid(65534),  # nobody
    )
    assert done.stdout.strip() == b"b''", done.stderr  # closed without an answer
    assert proxy.counts["foreign"] == 1
    nursery.cancel_scope.cancel()
