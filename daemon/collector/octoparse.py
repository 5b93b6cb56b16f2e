# The Octoparse / 八爪鱼 OpenAPI as typed async calls (httpx under trio), one client per account.
#
# Everything that makes the upstream awkward is handled here so the crawler sees pages or one
# typed error: tokens are cached and refreshed before they run out (serialised, so tasks sharing
# the account never log in twice), an auth failure triggers one fresh login, error bodies are
# checked even under HTTP 200, and everything that may pass (429, 5xx, timeouts, and any error
# code we do not know to be permanent) is retried with jittered exponential backoff. Upstream
# invents codes (`SystemBusy`) faster than it documents them, so failing at once is reserved for
# the codes that cannot heal by waiting: bad credentials, no permission, an unknown task or a
# malformed request. A `Retry-After` (seconds or HTTP date) sets a floor on the wait, capped so a
# bad header cannot park a task for hours. Classification and the wait are pure functions;
# sleeping and the clocks are injectable so tests cost no real time. Every request first takes a
# slot from the account's shared rate limiter. Secrets never reach a log line; the upstream
# `requestId` always does.
from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx
import msgspec
import trio

from daemon.collector.config import AccountConfig
from daemon.config import resolve_secret
from daemon.jobs.retry import parse_retry_after
from daemon.logs import get_logger
from daemon.net.ratelimit import RateLimiter

REFRESH_MARGIN = 600.0
"""Refresh a token when fewer than this many seconds of its life remain."""

AUTH_ERRORS = frozenset({"Invalid.Grant", "Invalid.Token"})
"""Codes that mean the credentials were refused: log in again once, then fail."""
PERMANENT_ERRORS = frozenset(
    {
        "Invalid.Grant",
        "Invalid.Token",
        "Invalid.ApiKey",
        "Unauthorized",
        "Forbidden",
        "NoPermission",
        "PermissionDenied",
        "InvalidParameter",
        "InvalidTaskId",
        "GroupNotFound",
        "BadResponse",
    }
)
"""Codes no wait can fix (credentials, permission, an unknown task or group, a malformed request
or answer): fail at once. Every other code is retried."""
PERMANENT_STATUSES = frozenset({401, 403, 404})
"""HTTP statuses that fail at once whatever code the body carries."""
RETRY_STATUSES = frozenset({408, 425, 429})
"""Client-error statuses that still mean "try again later"."""

Verdict = Literal["retry", "auth", "permanent"]


def classify(status: int | None, code: str) -> Verdict:
    """What to do about an error answer: `auth` (log in again once, then fail), `permanent`
    (fail now) or `retry` (back off and try again).

    `status` is None when no HTTP answer came (timeout, connection error). Unknown upstream codes
    are retried under any status: Octoparse reports transient trouble under 200 and 400 alike. A
    bare 4xx without an upstream code is the request's fault and fails at once."""
    if status == 401 or code in AUTH_ERRORS:
        return "auth"
    if code in PERMANENT_ERRORS or status in PERMANENT_STATUSES:
        return "permanent"
    if status is None or status >= 500 or status in RETRY_STATUSES:
        return "retry"
    if status >= 400 and code == f"HTTP{status}":
        return "permanent"
    return "retry"


class OctoparseError(Exception):
    """An error answer (or no usable answer) from Octoparse."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.status = status
        self.retry_after = retry_after
        """Seconds the answer's `Retry-After` asked for (uncapped), if it had one."""

    @property
    def retryable(self) -> bool:
        return classify(self.status, self.code) == "retry"

    @property
    def auth_failed(self) -> bool:
        return classify(self.status, self.code) == "auth"


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """One answer of `GET /data/all`."""

    offset: int
    """The position to request next, as upstream returned it."""
    total: int
    rest_total: int
    rows: list[dict[str, Any]]
    malformed: int = 0
    """Entries that were not JSON objects (skipped, but they occupied positions)."""
    request_id: str | None = None

    @property
    def returned(self) -> int:
        """Positions this page covered: the number paging rules reason with."""
        return len(self.rows) + self.malformed


class TaskGroup(msgspec.Struct, frozen=True):
    group_id: int
    name: str


class TaskSummary(msgspec.Struct, frozen=True):
    task_id: str
    name: str


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    attempts: int = 6
    """Tries per request, the first included."""
    base: float = 0.5
    cap: float = 30.0
    """Longest backoff between two tries."""
    retry_after_cap: float = 120.0
    """Longest wait a `Retry-After` header can impose."""


def retry_delay(attempt: int, *, base: float, cap: float, rand: float) -> float:
    """Seconds to wait before retry number `attempt` (0-based): equal jitter over base * 2^n.

    `rand` in [0, 1) chooses within [ceiling / 2, ceiling], so a retry never goes at once."""
    ceiling = min(cap, base * 2.0**attempt)
    return ceiling / 2 + rand * ceiling / 2


def retry_wait(
    attempt: int, policy: RetryPolicy, *, rand: float, retry_after: float | None = None
) -> float:
    """Seconds to wait before retry number `attempt` (0-based): the jittered backoff, or the
    answer's `Retry-After` when that is longer, at most `policy.retry_after_cap`."""
    delay = retry_delay(attempt, base=policy.base, cap=policy.cap, rand=rand)
    if retry_after is None:
        return delay
    return max(delay, min(retry_after, policy.retry_after_cap))


def retry_schedule(policy: RetryPolicy, rands: list[float]) -> list[float]:
    """The waits between the tries of one request, for given random draws."""
    return [
        retry_delay(i, base=policy.base, cap=policy.cap, rand=r)
        for i, r in enumerate(rands[: policy.attempts - 1])
    ]


class _Token(msgspec.Struct):
    access: str
    refresh: str | None
    refresh_at: float
    expires_at: float


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _int(value: Any, name: str, request_id: str | None) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise OctoparseError(
            "BadResponse", f"field {name!r} is not an integer: {value!r}", request_id=request_id
        ) from None


class OctoparseClient:
    """Calls of one Octoparse account; safe to share between that account's tasks."""

    def __init__(
        self,
        account: AccountConfig,
        http: httpx.AsyncClient,
        limiter: RateLimiter,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = trio.sleep,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        key_path = f"$.collector.accounts[name={account.name}]"
        self.account = account
        self._api_key = resolve_secret(account.api_key_env, f"{key_path}.api_key_env")
        self._password = (
            None
            if self._api_key is not None
            else resolve_secret(account.password_env, f"{key_path}.password_env")
        )
        self._base = account.base_url.rstrip("/")
        self._http = http
        self._limiter = limiter
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._rand = rand
        self._timeout = float(account.timeout)
        self._token: _Token | None = None
        self._token_lock = trio.Lock()
        self._log = get_logger("collector.octoparse", account=account.name)

    async def data_page(self, task_id: str, offset: int, size: int) -> Page:
        """`GET /data/all`: up to `size` (1..1000) rows from `offset` (<= 0: from the start)."""
        if not 1 <= size <= 1000:
            raise ValueError("size must be between 1 and 1000")
        params = {"taskId": task_id, "offset": str(offset), "size": str(size)}
        data, request_id = await self._call("GET", "/data/all", params=params)
        if not isinstance(data, dict):
            raise OctoparseError("BadResponse", "data is not an object", request_id=request_id)
        raw_rows = data.get("data")
        if raw_rows is None:
            raw_rows = data.get("dataList") or []
        if not isinstance(raw_rows, list):
            raise OctoparseError("BadResponse", "data.data is not a list", request_id=request_id)
        rows = [row for row in raw_rows if isinstance(row, dict)]
        page = Page(
            offset=_int(data.get("offset"), "offset", request_id),
            total=_int(data.get("total"), "total", request_id),
            rest_total=_int(data.get("restTotal"), "restTotal", request_id),
            rows=rows,
            malformed=len(raw_rows) - len(rows),
            request_id=request_id,
        )
        if page.malformed:
            self._log.warning(
                "rows that are not objects skipped",
                task=task_id,
                offset=offset,
                malformed=page.malformed,
                request_id=request_id,
            )
        self._log.debug(
            "page",
            task=task_id,
            offset=offset,
            size=size,
            rows=page.returned,
            total=page.total,
            rest_total=page.rest_total,
            request_id=request_id,
        )
        return page

    async def total(self, task_id: str) -> int:
        """Rows the task holds now (one 1-row page)."""
        return (await self.data_page(task_id, 0, 1)).total

    async def task_groups(self) -> list[TaskGroup]:
        """`GET /taskGroup`."""
        data, request_id = await self._call("GET", "/taskGroup")
        return [
            TaskGroup(
                _int(g.get("taskGroupId"), "taskGroupId", request_id),
                str(g.get("taskGroupName", "")),
            )
            for g in self._objects(data, request_id)
        ]

    async def tasks(self, group_id: int) -> list[TaskSummary]:
        """`GET /task/search?taskGroupId=`."""
        params = {"taskGroupId": str(group_id)}
        data, request_id = await self._call("GET", "/task/search", params=params)
        return [
            TaskSummary(str(t.get("taskId", "")), str(t.get("taskName", "")))
            for t in self._objects(data, request_id)
        ]

    @staticmethod
    def _objects(data: Any, request_id: str | None) -> list[dict[str, Any]]:
        if data is None:
            return []
        if not isinstance(data, list):
            raise OctoparseError("BadResponse", "data is not a list", request_id=request_id)
        return [item for item in data if isinstance(item, dict)]

    async def login(self) -> None:
        """Get a fresh token with the password (no-op for an api-key account)."""
        if self._api_key is not None:
            return
        async with self._token_lock:
            await self._password_login()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, str] | None = None,
        auth: bool = True,
    ) -> tuple[Any, str | None]:
        attempt = 0
        logged_in_again = False
        while True:
            headers: dict[str, str] = {}
            used: _Token | None = None
            if auth:
                if self._api_key is not None:
                    headers["x-api-key"] = self._api_key
                else:
                    used = await self._current_token()
                    headers["Authorization"] = f"Bearer {used.access}"
            try:
                return await self._send(method, path, params, body, headers)
            except OctoparseError as error:
                if auth and used is not None and error.auth_failed and not logged_in_again:
                    logged_in_again = True
                    self._log.warning(
                        "token rejected, logging in again",
                        path=path,
                        code=error.code,
                        status=error.status,
                        request_id=error.request_id,
                    )
                    await self._relogin(used)
                    continue
                if not error.retryable or attempt + 1 >= self._retry.attempts:
                    raise
                delay = retry_wait(
                    attempt, self._retry, rand=self._rand(), retry_after=error.retry_after
                )
                attempt += 1
                self._log.warning(
                    "octoparse request failed, retrying",
                    path=path,
                    code=error.code,
                    status=error.status,
                    request_id=error.request_id,
                    attempt=attempt,
                    delay=round(delay, 3),
                    retry_after=error.retry_after,
                )
                await self._sleep(delay)

    async def _send(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        body: dict[str, str] | None,
        headers: dict[str, str],
    ) -> tuple[Any, str | None]:
        await self._limiter.acquire()
        try:
            response = await self._http.request(
                method,
                self._base + path,
                params=params,
                json=body,
                headers=headers,
                timeout=self._timeout,
            )
        except httpx.TimeoutException as exc:
            raise OctoparseError("Timeout", type(exc).__name__) from exc
        except httpx.TransportError as exc:
            raise OctoparseError("Transport", f"{type(exc).__name__}: {exc}") from exc
        return _unwrap(response, self._wall_clock())

    async def _current_token(self) -> _Token:
        async with self._token_lock:
            token = self._token
            now = self._clock()
            if token is not None and now < token.refresh_at:
                return token
            if token is not None and token.refresh is not None:
                try:
                    return await self._refresh(token.refresh)
                except OctoparseError as error:
                    if error.retryable:
                        raise
                    self._log.warning(
                        "token refresh refused, logging in with the password",
                        code=error.code,
                        request_id=error.request_id,
                    )
            return await self._password_login()

    async def _relogin(self, rejected: _Token) -> None:
        async with self._token_lock:
            if self._token is rejected:
                self._token = None
                await self._password_login()

    async def _password_login(self) -> _Token:
        body = {
            "username": self.account.username or "",
            "password": self._password or "",
            "grant_type": "password",
        }
        return await self._grant(body, "password")

    async def _refresh(self, refresh_token: str) -> _Token:
        body = {"refresh_token": refresh_token, "grant_type": "refresh_token"}
        return await self._grant(body, "refresh_token")

    async def _grant(self, body: dict[str, str], grant: str) -> _Token:
        data, request_id = await self._call("POST", "/token", body=body, auth=False)
        access = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(access, str) or not access:
            raise OctoparseError(
                "BadResponse", "token answer without access_token", request_id=request_id
            )
        assert isinstance(data, dict)
        lifetime = _seconds(data.get("expires_in"))
        if lifetime is None:
            self._log.warning(
                "token answer with an unreadable expires_in, assuming 30 minutes",
                request_id=request_id,
            )
            lifetime = 1800.0
        refresh = data.get("refresh_token")
        now = self._clock()
        self._token = _Token(
            access=access,
            refresh=refresh if isinstance(refresh, str) and refresh else None,
            refresh_at=now + max(lifetime - REFRESH_MARGIN, lifetime / 2),
            expires_at=now + lifetime,
        )
        self._log.info(
            "token obtained", grant=grant, expires_in=round(lifetime), request_id=request_id
        )
        return self._token


_answer_decoder = msgspec.json.Decoder()
"""Pages are decoded with msgspec: about twice as fast as `json` on a 1,000-row page."""


def _unwrap(response: httpx.Response, now: float) -> tuple[Any, str | None]:
    """The `data` of an answer, or the OctoparseError it carries (even under HTTP 200).

    `now` (Unix seconds) reads a `Retry-After` given as an HTTP date."""
    status = response.status_code
    retry_after = parse_retry_after(response.headers.get("retry-after"), now, float("inf"))
    try:
        body = _answer_decoder.decode(response.content)
    except msgspec.DecodeError:
        body = None
    if not isinstance(body, dict):
        snippet = response.text[:200] if response.content else ""
        code = "BadResponse" if status < 400 else f"HTTP{status}"
        raise OctoparseError(
            code, snippet or "answer is not a JSON object", status=status, retry_after=retry_after
        )
    request_id = body.get("requestId")
    request_id = str(request_id) if request_id is not None else None
    error = body.get("error")
    if isinstance(error, dict):
        raise OctoparseError(
            str(error.get("code") or f"HTTP{status}"),
            str(error.get("message") or ""),
            request_id=request_id,
            status=status,
            retry_after=retry_after,
        )
    if isinstance(error, str) and error.lower() not in ("", "success"):
        message = body.get("error_Description") or body.get("message") or ""
        raise OctoparseError(
            error, str(message), request_id=request_id, status=status, retry_after=retry_after
        )
    if status >= 400:
        raise OctoparseError(
            f"HTTP{status}",
            str(body.get("message") or ""),
            request_id=request_id,
            status=status,
            retry_after=retry_after,
        )
    if "data" not in body:
        raise OctoparseError("BadResponse", "answer without data", request_id=request_id)
    return body["data"], request_id
