from __future__ import annotations

import email.utils
import functools
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import trio

from daemon.collector.config import AccountConfig
from daemon.collector.octoparse import (
    OctoparseClient,
    OctoparseError,
    RetryPolicy,
    TaskGroup,
    classify,
    retry_delay,
    retry_schedule,
    retry_wait,
)
from daemon.config import ConfigError
from daemon.fakes.octoparse import DEMO_API_KEY, DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.net.ratelimit import RateLimiter

PASSWORD_ENV = "CRAWLD_TEST_OCTOPARSE_PASSWORD"
API_KEY_ENV = "CRAWLD_TEST_OCTOPARSE_API_KEY"
NOW_MS = 1_741_591_800_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, sim: OctoparseSim, base_url: str, http: httpx.AsyncClient) -> None:
        self.sim = sim
        self.base_url = base_url
        self.http = http
        self.clock = FakeClock()
        self.sleeps: list[float] = []

    async def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await trio.lowlevel.checkpoint()

    def client(
        self,
        *,
        api_key: bool = False,
        retry: RetryPolicy | None = None,
        real_sleep: bool = False,
        **account: Any,
    ) -> OctoparseClient:
        """With `real_sleep` the client waits with trio.sleep (run it under autojump_clock)."""
        settings: dict[str, Any] = {"name": "main", "base_url": self.base_url, "rate_limit": 1000}
        if api_key:
            settings["api_key_env"] = API_KEY_ENV
        else:
            settings.update(username="demo", password_env=PASSWORD_ENV)
        settings.update(account)
        return OctoparseClient(
            AccountConfig(**settings),
            self.http,
            RateLimiter(rate=1000, burst=100),
            retry=retry,
            sleep=trio.sleep if real_sleep else self._sleep,
            clock=self.clock,
            wall_clock=lambda: NOW_MS / 1000,
            rand=lambda: 0.5,
        )


@pytest.fixture
async def octo(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.setenv(PASSWORD_ENV, DEMO_PASSWORD)
    monkeypatch.setenv(API_KEY_ENV, DEMO_API_KEY)
    sim = OctoparseSim(now_ms=lambda: NOW_MS, clock=lambda: 0.0)
    shutdown = trio.Event()
    host, port = await nursery.start(
        functools.partial(serve_sim, sim, "127.0.0.1:0", shutdown=shutdown)
    )
    async with httpx.AsyncClient() as http:
        yield Harness(sim, f"http://{host}:{port}", http)
    shutdown.set()


async def test_login_then_pages_by_row_index(octo: Harness) -> None:
    task = octo.sim.add_task("jobs", rows=250, days=5)
    client = octo.client()
    page = await client.data_page(task, 0, 100)
    assert (page.offset, page.total, page.rest_total, len(page.rows)) == (100, 250, 150, 100)
    assert page.rows[0]["序号"] == "0"
    assert page.request_id and page.request_id.startswith("sim-")
    page = await client.data_page(task, 200, 100)
    assert (page.offset, page.rest_total, page.returned) == (250, 0, 50)
    page = await client.data_page(task, -50, 10)
    assert page.rows[0]["序号"] == "0"
    assert await client.total(task) == 250
    assert octo.sim.grants == {"password": 1}


async def test_rows_are_dated_over_the_window_newest_last(octo: Harness) -> None:
    task = octo.sim.add_task("dated", rows=3, days=2, date_format="ms")
    page = await octo.client().data_page(task, 0, 10)
    assert [int(r["发布时间"]) for r in page.rows] == [
        NOW_MS - 2 * 86_400_000 * 2 // 3,
        NOW_MS - 2 * 86_400_000 // 3,
        NOW_MS,
    ]


async def test_concurrent_tasks_share_one_login(octo: Harness) -> None:
    task = octo.sim.add_task("shared", rows=50)
    client = octo.client()
    async with trio.open_nursery() as nursery:
        for offset in range(0, 50, 5):
            nursery.start_soon(client.data_page, task, offset, 5)
    assert octo.sim.grants == {"password": 1}
    assert octo.sim.request_count("/data/all") == 10


async def test_refreshes_when_less_than_ten_minutes_remain(octo: Harness) -> None:
    task = octo.sim.add_task("refresh", rows=10)
    client = octo.client()
    await client.data_page(task, 0, 10)
    octo.clock.now += 86_400 - 601
    await client.data_page(task, 0, 10)
    assert octo.sim.grants == {"password": 1}
    octo.clock.now += 2
    await client.data_page(task, 0, 10)
    assert octo.sim.grants == {"password": 1, "refresh_token": 1}
    await client.data_page(task, 0, 10)
    assert octo.sim.grants == {"password": 1, "refresh_token": 1}


async def test_refused_refresh_falls_back_to_password(octo: Harness) -> None:
    task = octo.sim.add_task("refused", rows=10)
    client = octo.client()
    await client.data_page(task, 0, 10)
    octo.sim.expire_tokens(refresh=True)
    octo.clock.now += 86_400
    page = await client.data_page(task, 0, 10)
    assert page.total == 10
    assert octo.sim.grants == {"password": 2}
    assert octo.sim.request_count("/token") == 3


@pytest.mark.parametrize("status", [401, 400])
async def test_token_expiring_mid_sequence_logs_in_again(octo: Harness, status: int) -> None:
    octo.sim.expired_token_status = status
    task = octo.sim.add_task("expiry", rows=300)
    client = octo.client()
    seen = []
    for offset in (0, 100, 200):
        if offset == 100:
            octo.sim.expire_tokens()
        seen.extend((await client.data_page(task, offset, 100)).rows)
    assert [r["序号"] for r in seen] == [str(i) for i in range(300)]
    assert octo.sim.grants == {"password": 2}
    assert octo.sleeps == []


async def test_logs_in_again_only_once(octo: Harness) -> None:
    task = octo.sim.add_task("stubborn", rows=10)
    client = octo.client()
    await client.login()
    octo.sim.fail(5, code="Invalid.Token", message="Token is invalid", path="/data/all")
    with pytest.raises(OctoparseError) as caught:
        await client.data_page(task, 0, 10)
    assert caught.value.code == "Invalid.Token"
    assert octo.sim.grants == {"password": 2}
    assert octo.sim.request_count("/data/all") == 2


async def test_bad_password_is_invalid_grant_without_retries(
    octo: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    task = octo.sim.add_task("nope", rows=1)
    with pytest.raises(OctoparseError) as caught:
        await octo.client().data_page(task, 0, 1)
    error = caught.value
    assert (error.code, error.status) == ("Invalid.Grant", 400)
    assert error.request_id is not None
    assert octo.sim.request_count("/token") == 1
    assert octo.sim.request_count("/data/all") == 0


async def test_api_key_instead_of_tokens(octo: Harness) -> None:
    task = octo.sim.add_task("keyed", rows=20)
    client = octo.client(api_key=True)
    page = await client.data_page(task, 0, 20)
    assert len(page.rows) == 20
    assert octo.sim.request_count("/token") == 0
    await client.login()
    assert octo.sim.request_count("/token") == 0


async def test_wrong_api_key_is_not_retried(octo: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "op_sk_wrong")
    task = octo.sim.add_task("keyed", rows=1)
    with pytest.raises(OctoparseError) as caught:
        await octo.client(api_key=True).data_page(task, 0, 1)
    assert (caught.value.code, caught.value.status) == ("Invalid.ApiKey", 401)
    assert octo.sim.request_count() == 1


async def test_simulator_refuses_both_auth_headers(octo: Harness) -> None:
    task = octo.sim.add_task("both", rows=1)
    response = await octo.http.get(
        f"{octo.base_url}/data/all",
        params={"taskId": task, "offset": 0, "size": 1},
        headers={"x-api-key": DEMO_API_KEY, "Authorization": "Bearer x"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "InvalidParameter"


async def test_missing_secret_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    account = AccountConfig(name="main", username="demo", password_env=PASSWORD_ENV)
    async with httpx.AsyncClient() as http:
        with pytest.raises(ConfigError, match=PASSWORD_ENV):
            OctoparseClient(account, http, RateLimiter())


async def test_429_is_retried_with_backoff(octo: Harness) -> None:
    task = octo.sim.add_task("busy", rows=10)
    client = octo.client(retry=RetryPolicy(attempts=5, base=0.5, cap=30))
    await client.login()
    octo.sim.throttle(next=3, path="/data/all")
    page = await client.data_page(task, 0, 10)
    assert len(page.rows) == 10
    assert octo.sim.request_count("/data/all") == 4
    assert octo.sleeps == [0.375, 0.75, 1.5]


async def test_every_nth_request_throttled(octo: Harness) -> None:
    task = octo.sim.add_task("busy", rows=100)
    client = octo.client()
    await client.login()
    octo.sim.throttle(every=3, path="/data/all")
    rows = []
    for offset in range(0, 100, 10):
        rows.extend((await client.data_page(task, offset, 10)).rows)
    assert len(rows) == 100
    assert len(octo.sleeps) == 4
    assert octo.sim.request_count("/data/all") == 14


async def test_gives_up_after_the_last_attempt(octo: Harness) -> None:
    task = octo.sim.add_task("down", rows=10)
    client = octo.client(retry=RetryPolicy(attempts=3, base=0.1))
    await client.login()
    octo.sim.throttle(next=100, path="/data/all")
    with pytest.raises(OctoparseError) as caught:
        await client.data_page(task, 0, 10)
    assert caught.value.status == 429
    assert caught.value.retryable
    assert octo.sim.request_count("/data/all") == 3
    assert len(octo.sleeps) == 2


async def test_login_itself_is_retried_on_429(octo: Harness) -> None:
    task = octo.sim.add_task("busy-login", rows=1)
    octo.sim.throttle(next=2, path="/token")
    assert (await octo.client().data_page(task, 0, 1)).total == 1
    assert octo.sim.request_count("/token") == 3


@pytest.mark.parametrize("status", [200, 500, 503])
async def test_server_error_body_is_retried(octo: Harness, status: int) -> None:
    task = octo.sim.add_task("flaky", rows=10)
    client = octo.client()
    await client.login()
    octo.sim.fail(2, code="ServerError", status=status, path="/data/all")
    assert len((await client.data_page(task, 0, 10)).rows) == 10
    assert len(octo.sleeps) == 2


async def test_error_body_under_http_200_raises_typed_error(octo: Harness) -> None:
    task = octo.sim.add_task("bad", rows=10)
    client = octo.client()
    await client.login()
    octo.sim.fail(1, code="InvalidTaskId", message="Invalid task ID", path="/data/all")
    with pytest.raises(OctoparseError) as caught:
        await client.data_page(task, 0, 10)
    error = caught.value
    assert (error.code, error.message, error.status) == ("InvalidTaskId", "Invalid task ID", 200)
    assert error.request_id is not None
    assert not error.retryable
    assert octo.sleeps == []


async def test_unknown_task_and_bad_size(octo: Harness) -> None:
    client = octo.client()
    with pytest.raises(OctoparseError) as caught:
        await client.data_page("no-such-task", 0, 10)
    assert caught.value.code == "InvalidTaskId"
    with pytest.raises(ValueError):
        await client.data_page("x", 0, 1001)


async def test_short_pages_report_rows_returned(octo: Harness) -> None:
    task = octo.sim.add_task("capped", rows=250)
    octo.sim.page_cap = 30
    page = await octo.client().data_page(task, 100, 100)
    assert (page.returned, page.offset, page.rest_total) == (30, 130, 120)
    assert [r["序号"] for r in page.rows] == [str(i) for i in range(100, 130)]


async def test_growth_while_paging(octo: Harness) -> None:
    task = octo.sim.add_task("growing", rows=100)
    octo.sim.grow(task, 7)
    client = octo.client()
    totals = [(await client.data_page(task, 0, 10)).total for _ in range(3)]
    assert totals == [107, 114, 121]


async def test_shrink_and_append(octo: Harness) -> None:
    task = octo.sim.add_task("shrinking", rows=100)
    client = octo.client()
    octo.sim.truncate(task, 40)
    assert await client.total(task) == 40
    octo.sim.append_rows(task, 5, days=1)
    page = await client.data_page(task, 40, 10)
    assert [r["序号"] for r in page.rows] == [str(i) for i in range(100, 105)]
    assert octo.sim.data_offsets(task) == [(0, 1), (40, 10)]


async def test_discovery(octo: Harness) -> None:
    default = octo.sim.add_group("默认分组")
    other = octo.sim.add_group("其他")
    first = octo.sim.add_task("a", rows=1)
    second = octo.sim.add_task("b", rows=1, group_id=other)
    client = octo.client()
    assert await client.task_groups() == [TaskGroup(default, "默认分组"), TaskGroup(other, "其他")]
    assert [t.task_id for t in await client.tasks(default)] == [first]
    assert [(t.task_id, t.name) for t in await client.tasks(other)] == [(second, "b")]
    with pytest.raises(OctoparseError) as caught:
        await client.tasks(999)
    assert caught.value.code == "GroupNotFound"


async def test_secrets_never_reach_the_log(octo: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="crawld")
    task = octo.sim.add_task("quiet", rows=5)
    client = octo.client()
    await client.data_page(task, 0, 5)
    octo.sim.expire_tokens()
    await client.data_page(task, 0, 5)
    text = "\n".join(f"{r.getMessage()} {getattr(r, 'ctx', '')}" for r in caplog.records)
    assert "'request_id': 'sim-" in text
    assert "token obtained" in text
    secrets = [DEMO_PASSWORD, DEMO_API_KEY, *octo.sim.issued_tokens]
    assert len(secrets) == 6
    assert all(secret not in text for secret in secrets)


def mock_client(
    handler: Callable[[httpx.Request], httpx.Response], monkeypatch: pytest.MonkeyPatch
) -> tuple[OctoparseClient, list[float]]:
    monkeypatch.setenv(API_KEY_ENV, "op_sk_x")
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    account = AccountConfig(name="m", base_url="http://upstream.test", api_key_env=API_KEY_ENV)
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = OctoparseClient(
        account,
        http,
        RateLimiter(rate=1000, burst=100),
        retry=RetryPolicy(attempts=3, base=1.0),
        sleep=sleep,
        rand=lambda: 0.0,
    )
    return client, sleeps


async def test_timeouts_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ReadTimeout("slow", request=request)
        assert request.headers["x-api-key"] == "op_sk_x"
        assert "authorization" not in request.headers
        body = {"data": {"offset": 1, "total": 1, "restTotal": 0, "data": [{"a": "1"}]}}
        return httpx.Response(200, json=body)

    client, sleeps = mock_client(handler, monkeypatch)
    page = await client.data_page("t", 0, 1)
    assert page.rows == [{"a": "1"}]
    assert sleeps == [0.5, 1.0]


async def test_connection_errors_give_up_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client, sleeps = mock_client(handler, monkeypatch)
    with pytest.raises(OctoparseError) as caught:
        await client.data_page("t", 0, 1)
    assert caught.value.code == "Transport"
    assert len(sleeps) == 2


@pytest.mark.parametrize(
    ("status", "content", "code"),
    [
        (200, b"<html>gateway</html>", "BadResponse"),
        (502, b"<html>bad gateway</html>", "HTTP502"),
        (200, b'{"requestId": "r"}', "BadResponse"),
        (200, b'{"error": "InvalidTask", "error_Description": "legacy"}', "InvalidTask"),
        (404, b'{"message": "nope"}', "HTTP404"),
        (200, b'{"data": {"offset": "x", "total": 1, "restTotal": 0, "data": []}}', "BadResponse"),
        (200, b'{"data": {"offset": 1, "total": 1, "restTotal": 0, "data": {}}}', "BadResponse"),
    ],
)
async def test_unusable_answers_are_typed_errors(
    monkeypatch: pytest.MonkeyPatch, status: int, content: bytes, code: str
) -> None:
    client, _ = mock_client(lambda request: httpx.Response(status, content=content), monkeypatch)
    with pytest.raises(OctoparseError) as caught:
        await client.data_page("t", 0, 1)
    assert caught.value.code == code


async def test_numbers_as_strings_and_malformed_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {
        "data": {"offset": "3", "total": "10", "restTotal": "7", "data": [{"a": 1}, "x", None]},
        "requestId": "r-1",
        "error": "success",
    }
    client, _ = mock_client(lambda request: httpx.Response(200, json=body), monkeypatch)
    page = await client.data_page("t", 0, 3)
    assert (page.offset, page.total, page.rest_total) == (3, 10, 7)
    assert (page.rows, page.malformed, page.returned) == ([{"a": 1}], 2, 3)


async def test_numeric_expires_in_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    tokens: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token":
            assert json.loads(request.content)["grant_type"] == "password"
            tokens.append("t")
            return httpx.Response(200, json={"data": {"access_token": "tok", "expires_in": 86399}})
        assert request.headers["authorization"] == "Bearer tok"
        return httpx.Response(200, json={"data": []})

    account = AccountConfig(
        name="m", base_url="http://upstream.test/", username="u", password_env=PASSWORD_ENV
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        client = OctoparseClient(account, http, RateLimiter(rate=1000))
        assert await client.task_groups() == []
        assert await client.task_groups() == []
    assert tokens == ["t"]


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (0, 0.0, 0.25),
        (0, 1.0, 0.5),
        (1, 0.5, 0.75),
        (3, 0.0, 2.0),
        (10, 0.0, 15.0),
        (10, 1.0, 30.0),
    ],
)
def test_retry_delay_table(attempt: int, rand: float, expected: float) -> None:
    assert retry_delay(attempt, base=0.5, cap=30.0, rand=rand) == expected


@pytest.mark.parametrize(
    ("attempt", "rand", "retry_after", "expected"),
    [
        (0, 0.5, None, 0.375),
        (0, 0.5, 2.0, 2.0),
        (0, 0.5, 0.1, 0.375),
        (3, 1.0, 2.0, 4.0),
        (0, 0.0, 0.0, 0.25),
        (0, 0.5, 120.0, 120.0),
        (0, 0.5, 86_400.0, 120.0),
        (10, 1.0, 86_400.0, 120.0),
    ],
)
def test_retry_wait_table(
    attempt: int, rand: float, retry_after: float | None, expected: float
) -> None:
    policy = RetryPolicy(base=0.5, cap=30.0, retry_after_cap=120.0)
    assert retry_wait(attempt, policy, rand=rand, retry_after=retry_after) == expected


@pytest.mark.parametrize(
    ("status", "code", "verdict"),
    [
        (200, "SystemBusy", "retry"),
        (200, "ServerError", "retry"),
        (200, "SomethingNew", "retry"),
        (400, "SystemBusy", "retry"),
        (429, "TooManyRequests", "retry"),
        (500, "HTTP500", "retry"),
        (503, "ServerError", "retry"),
        (None, "Timeout", "retry"),
        (None, "Transport", "retry"),
        (408, "HTTP408", "retry"),
        (200, "Invalid.Grant", "auth"),
        (400, "Invalid.Token", "auth"),
        (401, "Unauthorized", "auth"),
        (401, "Invalid.ApiKey", "auth"),
        (200, "InvalidTaskId", "permanent"),
        (400, "InvalidParameter", "permanent"),
        (400, "GroupNotFound", "permanent"),
        (200, "NoPermission", "permanent"),
        (403, "SystemBusy", "permanent"),
        (404, "HTTP404", "permanent"),
        (400, "HTTP400", "permanent"),
        (200, "BadResponse", "permanent"),
        (None, "BadResponse", "permanent"),
    ],
)
def test_error_classification_table(status: int | None, code: str, verdict: str) -> None:
    assert classify(status, code) == verdict


async def test_unknown_code_under_200_is_retried_with_backoff(
    octo: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    autojump_clock.autojump_threshold = 0.01
    task = octo.sim.add_task("busy-system", rows=10)
    client = octo.client(real_sleep=True, retry=RetryPolicy(attempts=5, base=0.5, cap=30))
    await client.login()
    octo.sim.fail(3, code="SystemBusy", message="System is busy", path="/data/all")
    start = trio.current_time()
    page = await client.data_page(task, 0, 10)
    assert len(page.rows) == 10
    assert octo.sim.faults_served == {"200 SystemBusy": 3}
    assert octo.sim.request_count("/data/all") == 4
    assert trio.current_time() - start == pytest.approx(0.375 + 0.75 + 1.5)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("InvalidTaskId", 200),
        ("InvalidParameter", 400),
        ("NoPermission", 200),
        ("SystemBusy", 403),
    ],
)
async def test_permanent_error_ends_the_retries_at_once(
    octo: Harness, autojump_clock: trio.testing.MockClock, code: str, status: int
) -> None:
    autojump_clock.autojump_threshold = 0.01
    task = octo.sim.add_task("wrong", rows=10)
    client = octo.client(real_sleep=True)
    await client.login()
    octo.sim.fail(1, code="SystemBusy", path="/data/all")
    octo.sim.fail(1, code=code, status=status, path="/data/all")
    octo.sim.fail(5, code="SystemBusy", path="/data/all")
    start = trio.current_time()
    with pytest.raises(OctoparseError) as caught:
        await client.data_page(task, 0, 10)
    assert (caught.value.code, caught.value.status) == (code, status)
    assert octo.sim.request_count("/data/all") == 2
    assert trio.current_time() - start == pytest.approx(0.375)


async def test_unknown_code_gives_up_after_the_last_attempt(
    octo: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    autojump_clock.autojump_threshold = 0.01
    task = octo.sim.add_task("always-busy", rows=10)
    client = octo.client(real_sleep=True, retry=RetryPolicy(attempts=3, base=1.0))
    await client.login()
    octo.sim.fail(100, code="SystemBusy", path="/data/all")
    with pytest.raises(OctoparseError) as caught:
        await client.data_page(task, 0, 10)
    assert (caught.value.code, caught.value.status, caught.value.retryable) == (
        "SystemBusy",
        200,
        True,
    )
    assert octo.sim.request_count("/data/all") == 3


@pytest.mark.parametrize(
    ("retry_after", "waited"),
    [
        ("2", 2.0),
        (email.utils.formatdate(NOW_MS / 1000 + 7, usegmt=True), 7.0),
        ("86400", 120.0),
        (email.utils.formatdate(NOW_MS / 1000 - 60, usegmt=True), 0.375),
        ("soon", 0.375),
    ],
)
async def test_429_honours_retry_after_capped(
    octo: Harness, autojump_clock: trio.testing.MockClock, retry_after: str, waited: float
) -> None:
    autojump_clock.autojump_threshold = 0.01
    task = octo.sim.add_task("throttled", rows=10)
    client = octo.client(real_sleep=True, retry=RetryPolicy(base=0.5, retry_after_cap=120.0))
    await client.login()
    octo.sim.throttle(next=1, path="/data/all", retry_after=retry_after)
    start = trio.current_time()
    assert len((await client.data_page(task, 0, 10)).rows) == 10
    assert trio.current_time() - start == pytest.approx(waited)
    assert octo.sim.faults_served == {"429 TooManyRequests": 1}


async def test_retry_after_on_503_is_a_floor_too(
    octo: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    autojump_clock.autojump_threshold = 0.01
    task = octo.sim.add_task("maintenance", rows=10)
    client = octo.client(real_sleep=True)
    await client.login()
    octo.sim.fail(1, code="ServerError", status=503, path="/data/all", retry_after="5")
    start = trio.current_time()
    assert len((await client.data_page(task, 0, 10)).rows) == 10
    assert trio.current_time() - start == pytest.approx(5.0)


async def test_sim_faults_with_retry_after_over_http(
    octo: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    autojump_clock.autojump_threshold = 0.01
    http, base = octo.http, octo.base_url
    task = octo.sim.add_task("controlled", rows=10)
    throttled = await http.post(
        f"{base}/_sim/throttle", json={"next": 1, "path": "/data/all", "retry_after": "3"}
    )
    assert throttled.status_code == 200
    await http.post(
        f"{base}/_sim/fail", json={"count": 1, "code": "SystemBusy", "path": "/data/all"}
    )
    bad = await http.post(f"{base}/_sim/throttle", json={"next": 1, "retry_after": "1\r\nX: y"})
    assert bad.status_code == 422
    client = octo.client(api_key=True, real_sleep=True)
    answer = await http.get(
        f"{base}/data/all",
        params={"taskId": task, "offset": 0, "size": 1},
        headers={"x-api-key": DEMO_API_KEY},
    )
    assert (answer.status_code, answer.headers["retry-after"]) == (429, "3")
    start = trio.current_time()
    assert len((await client.data_page(task, 0, 10)).rows) == 10
    assert trio.current_time() - start == pytest.approx(0.375)
    assert octo.sim.faults_served == {"429 TooManyRequests": 1, "200 SystemBusy": 1}


def test_retry_schedule_has_one_wait_between_tries() -> None:
    assert retry_schedule(RetryPolicy(attempts=4, base=1, cap=3), [0.0] * 10) == [0.5, 1.0, 1.5]


async def test_sim_control_over_http(octo: Harness) -> None:
    http, base = octo.http, octo.base_url
    created = (await http.post(f"{base}/_sim/tasks", json={"name": "ctl", "rows": 20})).json()
    task = created["taskId"]
    assert created["total"] == 20
    response = await http.post(f"{base}/_sim/tasks/{task}/append", json={"rows": 5, "days": 1})
    assert response.json()["total"] == 25
    await http.post(f"{base}/_sim/tasks/{task}/truncate", json={"total": 10})
    await http.post(f"{base}/_sim/tasks/{task}/grow", json={"per_request": 2})
    await http.post(f"{base}/_sim/page_cap", json={"rows": 4})
    await http.post(f"{base}/_sim/throttle", json={"next": 1, "path": "/data/all"})
    await http.post(f"{base}/_sim/fail", json={"count": 1, "code": "ServerError"})
    client = octo.client()
    page = await client.data_page(task, 0, 100)
    assert (page.total, page.returned) == (12, 4)
    assert len(octo.sleeps) == 2
    await http.post(f"{base}/_sim/tokens/expire", json={})
    await client.data_page(task, 0, 1)
    stats = (await http.get(f"{base}/_sim/stats")).json()
    assert stats["grants"] == {"password": 2}
    assert stats["tasks"][task]["total"] == 14
    rows = (await http.get(f"{base}/_sim/tasks/{task}/rows", params={"count": 2})).json()
    assert [r["序号"] for r in rows["rows"]] == ["0", "1"]
    bad = await http.post(f"{base}/_sim/tasks/{task}/grow", json={"per_request": "x"})
    assert bad.status_code == 422
    missing = await http.post(f"{base}/_sim/tasks/nope/append", json={"rows": 1})
    assert missing.status_code == 404


def test_command_line_entry_point_serves_a_demo_task() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.octoparse", "--bind", "127.0.0.1:0", "--rows", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert banner.startswith("Octoparse simulator on http://127.0.0.1:")
        base = banner.split()[-1]
        stats = httpx.get(f"{base}/_sim/stats", timeout=5).json()
        assert [t["total"] for t in stats["tasks"].values()] == [30]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
