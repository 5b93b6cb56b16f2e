# The SearXNG client: one GET /search?format=json per result page and source type, the pages of
# the requested sources fetched side by side, each request bounded by the configured timeout and
# retried (timeouts, refused connections, 429, 5xx) with a short capped backoff. The rules module
# decides everything else; this is the shell that moves bytes.
from __future__ import annotations

import math
import time
from typing import Any

import httpx
import msgspec
import trio
from prometheus_client import Counter, Histogram

from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.net import tls
from daemon.redact import cap_message, redact_url
from daemon.search import rules
from daemon.search.config import SearchConfig
from daemon.search.rules import Hit, Item, SearchError, SearchQuery

log = get_logger("search")

provider_requests = Counter(
    "crawld_search_provider_requests",
    "Requests to the search provider by outcome (ok, timeout, unreachable, http_<status>,"
    " bad_json)",
    ["outcome"],
    registry=REGISTRY,
)
provider_seconds = Histogram(
    "crawld_search_provider_seconds",
    "Time of one request to the search provider",
    registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

RETRY_AFTER_MAX_S = 5.0


class SearxngClient:
    """Searches one SearXNG instance (`[search] base_url`)."""

    def __init__(self, config: SearchConfig, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.base = config.base_url.strip().rstrip("/")
        self.http = http or httpx.AsyncClient(
            trust_env=False, follow_redirects=False, verify=tls.verifying(trust_env=False)
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def search(self, q: SearchQuery, *, timeout_s: float) -> dict[str, list[Item]]:
        """Up to `q.limit` items per requested source, in the provider's order; SearchError
        (code SEARCH_TIMEOUT, 408) when `timeout_s` passes first."""
        hits = {source: Hit(source) for source in q.sources}
        try:
            with trio.move_on_after(timeout_s) as scope:
                async with trio.open_nursery() as nursery:
                    for hit in hits.values():
                        nursery.start_soon(self._fill, hit, q)
        except BaseExceptionGroup as group:
            failed, _ = group.split(SearchError)
            if failed is None:
                raise
            raise _first(failed) from None
        if scope.cancelled_caught:
            raise SearchError("SEARCH_TIMEOUT", f"search timed out after {timeout_s:g} s", 408)
        return {source: hit.items for source, hit in hits.items()}

    async def _fill(self, hit: Hit, q: SearchQuery) -> None:
        for pageno in range(1, self.config.max_pages + 1):
            answer = await self._page(rules.params(q, hit.source, pageno, self.config.engines))
            if rules.add_page(hit, answer.get("results"), q) == 0 or len(hit.items) >= q.limit:
                return

    async def _page(self, params: dict[str, str]) -> dict[str, Any]:
        tries = self.config.retries + 1
        for attempt in range(tries):
            answer, error = await self._try(params)
            if error is None:
                return answer
            if attempt + 1 == tries or not error.retry:
                raise error
            pause = min(RETRY_AFTER_MAX_S, float(answer.get("retry_after", 0.5 * 2**attempt)))
            log.info("search provider request failed; trying again", error=error.message,
                     attempt=attempt + 1, wait_s=round(pause, 2))  # fmt: skip
            await trio.sleep(pause)
        raise AssertionError("unreachable")

    async def _try(self, params: dict[str, str]) -> tuple[dict[str, Any], SearchError | None]:
        """One request: (the answer, None), or (hints such as `retry_after`, the error)."""
        where = redact_url(self.base)
        started = time.monotonic()
        try:
            response = await self.http.get(
                f"{self.base}/search",
                params=params,
                headers={"Accept": "application/json"},
                timeout=float(self.config.timeout),
            )
        except httpx.TimeoutException:
            provider_requests.labels("timeout").inc()
            return {}, _retry(
                SearchError("SEARCH_PROVIDER_ERROR", f"SearXNG at {where} timed out", 504)
            )
        except httpx.HTTPError as exc:
            provider_requests.labels("unreachable").inc()
            message = f"SearXNG at {where} is unreachable: {type(exc).__name__}"
            return {}, _retry(SearchError("SEARCH_PROVIDER_ERROR", message, 502))
        finally:
            provider_seconds.observe(time.monotonic() - started)
        status = response.status_code
        if status != 200:
            provider_requests.labels(f"http_{status}").inc()
            error = _status_error(status, response, where)
            if status == 429 or status >= 500:
                _retry(error)
            return _hints(response), error
        try:
            answer = msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            answer = None
        if not isinstance(answer, dict):
            provider_requests.labels("bad_json").inc()
            message = f"SearXNG at {where} answered something that is not a JSON object"
            return {}, SearchError("SEARCH_PROVIDER_ERROR", message, 502)
        provider_requests.labels("ok").inc()
        return answer, None


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _retry(error: SearchError) -> SearchError:
    error.retry = True
    return error


def _hints(response: httpx.Response) -> dict[str, Any]:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return {}
    return {"retry_after": seconds} if math.isfinite(seconds) and seconds >= 0 else {}


def _status_error(status: int, response: httpx.Response, where: str) -> SearchError:
    if status == 403:
        message = (f"SearXNG at {where} refused the JSON format (403): add `json` to "
                   "search.formats in its settings.yml")  # fmt: skip
        return SearchError("SEARCH_PROVIDER_ERROR", message, 502)
    if status == 429:
        return SearchError("SEARCH_RATE_LIMITED", f"SearXNG at {where} is rate limiting", 502)
    detail = ""
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            detail = f": {cap_message(body['error'], 200)}"
    except ValueError:
        pass
    return SearchError("SEARCH_PROVIDER_ERROR", f"SearXNG at {where} answered {status}{detail}",
                       502 if status >= 500 else 400)  # fmt: skip
