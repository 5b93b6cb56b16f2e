"""API keys, the Host allow-list, cross-site browser requests and JSON-only changes, through a
whole daemon over real HTTP (issue 7, finding 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from daemon import settings as config
from daemon.app import check_secrets
from tests.api.conftest import (
    KEY,
    KEY_ENV,
    OLD_KEY,
    StartDaemon,
    client,
    queue_rows,
    queue_size,
)

KEYED = f'api_key_env = "{KEY_ENV}"'


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, f"{KEY}, {OLD_KEY}")


async def test_every_route_but_healthz_needs_a_key(keys: None, start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(KEYED)
    async with client(daemon) as anonymous, client(daemon, "wrong-key-0123456789") as wrong:
        assert (await anonymous.get("/healthz")).status_code == 200
        spec = (await client(daemon, KEY).get("/openapi.json")).json()
        for path, methods in spec["paths"].items():
            concrete = path.replace("{id}", "00000000-0000-4000-8000-000000000000")
            for method in methods:
                if path == "/healthz":
                    continue
                for c in (anonymous, wrong):
                    r = await c.request(method.upper(), concrete)
                    assert r.status_code == 401, (method, path, r.text)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert r.json()["success"] is False
                    assert r.json()["error"] == "Unauthorized"
        for path in ("/openapi.json", "/nope"):
            assert (await anonymous.get(path)).status_code == 401
        assert (await anonymous.get("/metrics")).status_code == 401
        assert "send Authorization" in (await anonymous.get("/status")).json()["detail"]
        lowercase = await anonymous.get("/status", headers={"Authorization": f"bearer {KEY}"})
        assert lowercase.status_code == 200


async def test_both_rotated_keys_work(keys: None, start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(KEYED)
    for key in (KEY, OLD_KEY):
        async with client(daemon, key) as c:
            assert (await c.get("/status")).status_code == 200
            assert (await c.get("/metrics")).status_code == 200


async def test_metrics_public_opens_only_metrics(keys: None, start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(f"{KEYED}\nmetrics_public = true")
    async with client(daemon) as anonymous:
        metrics = await anonymous.get("/metrics")
        assert metrics.status_code == 200 and "crawld_" in metrics.text
        assert (await anonymous.get("/status")).status_code == 401


async def test_a_missing_or_empty_key_variable_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = config.decode(f"[http]\n{KEYED}\n")
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(config.ConfigError, match=r"\$\.http\.api_key_env"):
        check_secrets(cfg)
    monkeypatch.setenv(KEY_ENV, " , ")
    with pytest.raises(config.ConfigError, match="holds no API key"):
        check_secrets(cfg)
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(config.ConfigError, match="shorter than 16"):
        check_secrets(cfg)
    monkeypatch.setenv(KEY_ENV, KEY)
    check_secrets(cfg)


def test_check_config_secrets_names_the_key_variable(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.toml"
    path.write_text(f"[http]\n{KEYED}\n")
    monkeypatch.delenv(KEY_ENV, raising=False)
    run = subprocess.run(
        [sys.executable, "-m", "daemon", "check-config", "--secrets", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "$.http.api_key_env" in run.stderr


@pytest.mark.parametrize("bind", ["0.0.0.0:8700", "[::]:8700", "192.168.1.5:8700", "example:1"])
def test_a_public_bind_without_a_key_is_a_config_error(bind: str) -> None:
    with pytest.raises(config.ConfigError, match=r"\$\.http\.api_key_env"):
        config.decode(f'[http]\nbind = "{bind}"\n')
    config.decode(f'[http]\nbind = "{bind}"\n{KEYED}\n')


@pytest.mark.parametrize("bind", ["127.0.0.1:8700", "127.1.2.3:1", "[::1]:8700", "localhost:80"])
def test_a_loopback_bind_needs_no_key(bind: str) -> None:
    config.decode(f'[http]\nbind = "{bind}"\n')


async def test_foreign_host_headers_are_refused(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    assert daemon.http_address is not None
    port = daemon.http_address[1]
    async with client(daemon) as c:
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
            r = await c.get("/status", headers={"Host": host})
            assert r.status_code == 421, host
            assert r.json()["error"] == "Host not accepted by this server"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
            assert (await c.get("/status", headers={"Host": host})).status_code == 200, host
        assert (await c.get("/status", headers={"Host": "localhost:1"})).status_code == 421
        # a monitor reaching the daemon by another name still gets /healthz
        assert (await c.get("/healthz", headers={"Host": "evil.example"})).status_code == 200


async def test_configured_hosts_replace_the_defaults(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon('hosts = ["crawld.internal", "proxy.example:8443"]')
    async with client(daemon) as c:
        ok = {"crawld.internal", "CRAWLD.INTERNAL.", "proxy.example:8443"}
        for host in ok:
            assert (await c.get("/status", headers={"Host": host})).status_code == 200, host
        for host in ("localhost", "proxy.example", "proxy.example:1"):
            assert (await c.get("/status", headers={"Host": host})).status_code == 421, host


async def test_a_text_plain_start_from_another_host_changes_nothing(
    start_daemon: StartDaemon,
) -> None:
    """The attack from the issue: a page posts text/plain with its own Host and webhook."""
    daemon = await start_daemon()
    async with client(daemon) as c:
        body = b'{"webhook": "https://evil.example/rows"}'
        forged = await c.post(
            "/crawl/start",
            content=body,
            headers={"Host": "evil.example", "Content-Type": "text/plain"},
        )
        assert forged.status_code == 421
        plain = await c.post("/crawl/start", content=body, headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415
        assert plain.json() == {
            "error": "unsupported media type",
            "detail": "Content-Type must be application/json",
        }
        form = await c.post("/crawl/stop", data={"task_id": "x"})
        assert form.status_code == 415
        untyped = await c.post("/crawl/stop", content=b'{"task_id": "x"}')
        assert untyped.status_code == 415
        assert (await c.post("/crawl/stop", json={})).status_code == 200
        assert (await c.post("/crawl/stop")).status_code == 200  # no body needs no type
        assert (
            await c.post(
                "/crawl/stop",
                content=b"{}",
                headers={"Content-Type": "application/json; charset=utf-8"},
            )
        ).status_code == 200


async def test_a_cross_site_image_cannot_drain_the_queue(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    await queue_rows(daemon, 5)
    img = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    async with client(daemon) as c:
        for headers in (
            img,
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": "https://evil.example"},
            {"Origin": "null"},
            {"Origin": "http://localhost:3000"},  # another local web app
        ):
            for method in ("GET", "POST"):
                r = await c.request(method, "/consume", params={"count": 5}, headers=headers)
                assert r.status_code == 403, (headers, method)
                assert r.json()["error"] == "cross-site browser requests are refused"
        assert await queue_size(daemon) == 5
        own_page = {
            "Sec-Fetch-Site": "same-origin",
            "Origin": c.base_url.scheme + "://" + c.base_url.netloc.decode(),
        }
        taken = await c.post("/consume", json={"count": 2}, headers=own_page)
        assert taken.status_code == 200 and taken.json()["count"] == 2
        assert (await c.get("/consume", params={"count": 1})).json()["count"] == 1
        assert await queue_size(daemon) == 2


async def test_post_consume_takes_count_from_body_or_query(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    await queue_rows(daemon, 10)
    async with client(daemon) as c:
        assert (await c.post("/consume")).json()["count"] == 1
        assert (await c.post("/consume", params={"count": 3})).json()["count"] == 3
        assert (await c.post("/consume", json={"count": 4})).json()["count"] == 4
        bad = await c.post("/consume", json={"count": 0})
        assert bad.status_code == 422 and "count" in bad.json()["detail"]
        assert await queue_size(daemon) == 2


async def test_get_consume_is_served_with_a_key(keys: None, start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(KEYED)
    await queue_rows(daemon, 2)
    async with client(daemon, KEY) as c:
        assert (await c.get("/consume")).json()["count"] == 1
    async with client(daemon) as anonymous:
        assert (await anonymous.get("/consume")).status_code == 401
    assert await queue_size(daemon) == 1


def test_status_command_sends_the_key(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from daemon.__main__ import status_request

    path = tmp_path / "c.toml"
    path.write_text(f'[http]\nbind = "127.0.0.1:9999"\n{KEYED}\n')
    monkeypatch.setenv(KEY_ENV, f"{KEY},{OLD_KEY}")
    url, headers = status_request(str(path), None)
    assert url == "http://127.0.0.1:9999/status"
    assert headers == {"Authorization": f"Bearer {KEY}"}
    monkeypatch.setenv("CRAWLD_API_KEY", OLD_KEY)
    url, headers = status_request(None, "http://h:1/")
    assert url == "http://h:1/status" and headers == {"Authorization": f"Bearer {OLD_KEY}"}
    monkeypatch.delenv("CRAWLD_API_KEY")
    assert status_request(None, None) == ("http://127.0.0.1:8700/status", {})


async def test_reload_checks_the_key_variable(
    keys: None, start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await start_daemon(KEYED)
    path = trio.Path(daemon.config.source)
    monkeypatch.delenv("CRAWLD_TEST_OTHER_KEY", raising=False)
    await path.write_text((await path.read_text()).replace(KEY_ENV, "CRAWLD_TEST_OTHER_KEY"))
    assert not await daemon.reload()
    assert daemon.last_reload is not None and "$.http.api_key_env" in daemon.last_reload.message
    assert daemon.config.http.api_key_env == KEY_ENV


async def test_status_shows_the_edge(keys: None, start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(KEYED)
    async with client(daemon) as anonymous:
        assert (await anonymous.get("/status")).status_code == 401
        assert (await anonymous.get("/status", headers={"Host": "evil.example"})).status_code == 421
    async with client(daemon, KEY) as c:
        http = (await c.get("/status")).json()["http"]
    assert daemon.http_address is not None
    assert http["address"] == list(daemon.http_address)
    assert http["api_keys"] == 2 and http["metrics_public"] is False
    assert http["hosts"] == ["127.0.0.1", "localhost", "[::1]"]
    assert http["refused"] == {"unauthorized": 1, "host": 1}
    assert http["active_requests"] == 1  # this request
    assert KEY not in str(http) and OLD_KEY not in str(http)
