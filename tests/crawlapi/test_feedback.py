"""The routes firecrawl-mcp's feedback, developer-search and credit-usage tools call, over HTTP
against a whole crawld with the SearXNG simulator: feedback validated (400 naming the field,
nothing stored), stored and read back; developer search through `categories: ["developer"]`;
the credit history; all in /openapi.json and behind the API key."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl

from daemon.fakes.searxng import SearxngSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_search import searxng  # noqa: F401

KEY = "feedback-test-key-0123456789"
ALLOWED = {"agent_hints", "success", "error", "status", "feedbackErrorCode", "retryable",
           "message", "feedbackId", "creditsRefunded", "creditsRefundedToday", "dailyRefundCap",
           "dailyCapReached", "alreadySubmitted", "warning", "data", "raw"}  # fmt: skip
"""The keys firecrawl-mcp's feedback output schema allows (it refuses any other)."""


@pytest.fixture
def crawl_config(searxng: SearxngSim, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    monkeypatch.setenv("CRAWLD_FEEDBACK_KEY", KEY)
    address = searxng.address  # type: ignore[attr-defined]
    config = CONFIG + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'
    return config.replace(
        'bind = "127.0.0.1:0"', 'bind = "127.0.0.1:0"\napi_key_env = "CRAWLD_FEEDBACK_KEY"'
    )


@pytest.fixture
async def authed(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=30,
                             headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip


async def stored(http: httpx.AsyncClient) -> int:
    listing = await http.get("/v2/feedback")
    assert listing.status_code == 200, listing.text
    return int(listing.json()["total"])


async def test_search_feedback_is_stored_and_listed(authed: httpx.AsyncClient) -> None:
    async with authed as http:
        found = (await http.post("/v2/search", json={"query": "trio", "limit": 2,
                                                     "highlights": False})).json()  # fmt: skip
        search_id = found["id"]
        assert uuid.UUID(search_id)
        body = {"rating": "partial", "origin": "mcp-test@1",
                "valuableSources": [{"url": found["data"]["web"][0]["url"], "reason": "on topic"}],
                "missingContent": [{"topic": "cancel scopes"}]}  # fmt: skip
        first = await http.post(f"/v2/search/{search_id}/feedback", json=body)
        assert first.status_code == 200, first.text
        answer = first.json()
        assert set(answer) <= ALLOWED
        assert answer["success"] is True and answer["alreadySubmitted"] is False
        again = (await http.post(f"/v2/search/{search_id}/feedback", json=body)).json()
        assert again["alreadySubmitted"] is True and again["feedbackId"] != answer["feedbackId"]
        listing = (await http.get("/v2/feedback", params={"limit": 1, "offset": 1})).json()
        assert listing["total"] == 2 and len(listing["data"]) == 1
        item = listing["data"][0]
        assert item["id"] == answer["feedbackId"]  # the older one, newest first
        assert (item["endpoint"], item["targetId"], item["rating"]) == (
            "search",
            search_id,
            "partial",
        )
        assert item["body"] == body and item["createdAt"].endswith("Z")


async def test_job_feedback_and_alexandria(authed: httpx.AsyncClient) -> None:
    async with authed as http:
        job = str(uuid.uuid4())
        ok = await http.post(
            "/v2/feedback",
            json={
                "endpoint": "scrape",
                "jobId": job,
                "rating": "bad",
                "issues": ["missing_content"],
                "note": "the table was cut",
                "url": "https://example.org/a",
                "pageNumbers": [1, 2],
            },
        )
        assert ok.status_code == 200, ok.text
        assert set(ok.json()) <= ALLOWED and ok.json()["success"] is True
        alexandria = await http.post(
            "/v2/feedback",
            json={
                "endpoint": "alexandria",
                "rating": "good",
                "rationale": "fine",
                "requestedWebsite": {"url": "https://example.org", "requestedFunctionality": "x"},
            },
        )
        assert alexandria.status_code == 200, alexandria.text
        assert await stored(http) == 2
        # alexandria takes any jobId (the MCP's schema): kept, not used as a job's id
        odd = await http.post("/v2/feedback", json={"endpoint": "alexandria", "rating": "bad",
                                                    "jobId": {"not": "an id"}})  # fmt: skip
        assert odd.status_code == 200, odd.text
        assert await stored(http) == 3


BAD = [
    ("search", {"rating": "great"}, "$.rating"),
    ("search", {"rating": "good", "valuableSources": [{"url": "ftp://x"}]},
     "$.valuableSources[0].url"),
    ("search", {"rating": "good", "missingContent": [{"topic": ""}]}, "$.missingContent[0].topic"),
    ("search", {"rating": "good", "missingContent": [{"topic": "t"}] * 21}, "$.missingContent"),
    ("search", {"rating": "good", "id": "x"}, "$.id"),
    ("badid", {"rating": "good"}, "searchId"),
    ("job", {"endpoint": "crawl", "jobId": str(uuid.uuid4()), "rating": "good"}, "$.endpoint"),
    ("job", {"endpoint": "scrape", "rating": "good"}, "$.jobId"),
    ("job", {"endpoint": "map", "jobId": "12", "rating": "good"}, "$.jobId"),
    ("job", {"endpoint": "map", "jobId": str(uuid.uuid4()), "rating": "good",
             "issues": ["Bad Code"]}, "$.issues[0]"),
    ("job", {"endpoint": "parse", "jobId": str(uuid.uuid4()), "rating": "good",
             "pageNumbers": [0]}, "$.pageNumbers"),
    ("job", {"endpoint": "scrape", "jobId": str(uuid.uuid4()), "rating": "good",
             "note": "n" * 4001}, "$.note"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "body", "field"), BAD)
async def test_bad_feedback_is_refused_naming_the_field(
    authed: httpx.AsyncClient, kind: str, body: dict[str, object], field: str
) -> None:
    async with authed as http:
        path = {"search": f"/v2/search/{uuid.uuid4()}/feedback", "badid": "/v2/search/nope/feedback",
                "job": "/v2/feedback"}[kind]  # fmt: skip
        refused = await http.post(path, json=body)
        assert refused.status_code == 400, refused.text
        assert field in [d["path"] for d in refused.json()["details"]], refused.text
        assert await stored(http) == 0
        garbled = await http.post(path, content=b"{not json",
                                  headers={"Content-Type": "application/json"})  # fmt: skip
        assert garbled.status_code == 400
        assert await stored(http) == 0


async def test_developer_search(authed: httpx.AsyncClient, searxng: SearxngSim) -> None:  # noqa: F811
    async with authed as http:
        got = await http.get("/v2/search/developer", params={"query": "nurseries", "k": 3})
        assert got.status_code == 200, got.text
        results = got.json()["results"]
        assert len(results) == 3
        for item in results:
            assert set(item) == {"id", "url", "title", "passages"}
            assert item["url"].startswith("https://github.com/")
            assert item["id"].split(":")[0] in {"issue", "pr", "readme", "doc"}
            assert all(p["text"] for p in item["passages"])
        assert any(r.get("q") == "nurseries" and "it" in r["categories"] for r in searxng.requests)
        posted = await http.post("/v2/search/developer", json={"query": "nurseries", "k": 2})
        assert posted.status_code == 200 and len(posted.json()["results"]) == 2
        for params, field in [({"query": "q", "skills": "only"}, "$.skills"),
                              ({"query": "q", "k": "0"}, "$.k"), ({}, "$.query")]:  # fmt: skip
            refused = await http.get("/v2/search/developer", params=params)
            assert refused.status_code == 400
            assert field in [d["path"] for d in refused.json()["details"]], refused.text
        refused = await http.post("/v2/search/developer", json={"query": "q", "repos": ["a/b"]})
        assert refused.status_code == 400 and "not supported by crawld" in refused.text


async def test_credit_usage_history(authed: httpx.AsyncClient) -> None:
    async with authed as http:
        for params in ({}, {"byApiKey": "true"}):
            got = await http.get("/v2/team/credit-usage/historical", params=params)
            assert got.status_code == 200, got.text
            (period,) = got.json()["periods"]
            assert period["creditsUsed"] == 0 and period["endDate"] is None
            assert got.json()["success"] is True and period["startDate"].endswith("Z")
        refused = await http.get("/v2/team/credit-usage/historical", params={"byApiKey": "yes"})
        assert refused.status_code == 400 and "byApiKey" in refused.text


ROUTES = [("post", "/v2/feedback"), ("get", "/v2/feedback"),
          ("post", "/v2/search/{searchId}/feedback"), ("get", "/v2/search/developer"),
          ("post", "/v2/search/developer"), ("get", "/v2/team/credit-usage/historical")]  # fmt: skip


async def test_routes_are_documented_and_behind_the_key(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"})).json()
    for method, path in ROUTES:
        operation = spec["paths"][path][method]
        assert "401" in operation["responses"], (method, path)
        concrete = path.replace("{searchId}", str(uuid.uuid4()))
        denied = await client.request(method.upper(), concrete, json={"rating": "good"})
        assert denied.status_code == 401, (method, path)
    assert "400" in spec["paths"]["/v2/feedback"]["post"]["responses"]
    async with httpx.AsyncClient(base_url=str(client.base_url), trust_env=False,
                                 headers={"Authorization": f"Bearer {KEY}"}) as http:  # fmt: skip
        assert await stored(http) == 0


async def test_firecrawl_py_developer_search_and_credit_history(base_url: str, sdk: Any) -> None:
    fc = Firecrawl(api_url=base_url, api_key=KEY)
    found = await sdk(fc.developer_search, "nurseries", k=2, passages=1)
    assert found.success and len(found.results) == 2
    assert all(len(r.passages) == 1 and r.id.split(":")[0] in {"issue", "pr", "readme", "doc"}
               for r in found.results)  # fmt: skip
    history = await sdk(fc._v2_client.get_credit_usage_historical, True)  # not re-exported
    assert history.success and [p.creditsUsed for p in history.periods] == [0]
