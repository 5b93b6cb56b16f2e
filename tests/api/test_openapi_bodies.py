"""/openapi.json declares every request body with the rules the server enforces (issue 32): each
POST/PUT/PATCH route has its body, each route that reads input names a 4xx of its own, what the
document calls valid the server takes and what it calls invalid the server refuses with 400, and
what depends on the config (an [llm], a search provider) follows the config. A fast sample of
what scripts/api_fuzz.py checks at length with schemathesis."""

from __future__ import annotations

from typing import Any

import jsonschema

from daemon.api.app import CHANGE_ERRORS, EDGE_ERRORS
from tests.api.conftest import StartDaemon, client

NO_COLLECTOR = "[collector]\nenabled = false"
UNUSED = "http://127.0.0.1:9"
"""Nothing listens there: the upstreams of a deployment that has them configured."""
CONFIGURED = f"""{NO_COLLECTOR}
[search]
base_url = "{UNUSED}"
retries = 0
[llm]
base_url = "{UNUSED}/v1"
model = "m"
retries = 0
"""
PAGE = f"{UNUSED}/page"
"""A loopback page: the SSRF guard refuses it (403) before anything is sent."""


def body_validator(spec: dict[str, Any], method: str, path: str) -> jsonschema.Validator:
    schema = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**schema, "components": spec["components"]})


async def test_every_route_declares_its_body_and_its_refusals(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=CONFIGURED)
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
    shared = set(map(str, EDGE_ERRORS)) | set(map(str, CHANGE_ERRORS))
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            if method in ("post", "put", "patch"):  # a body, or one said to be ignored
                assert all("schema" in c for c in op["requestBody"]["content"].values()), path
            if "requestBody" in op or op.get("parameters"):
                own = {s for s in op["responses"] if s.startswith("4")} - shared
                assert own, f"{method} {path} reads input but declares no 4xx of its own"
    for path in ("/v2/scrape", "/v2/crawl", "/v2/batch/scrape", "/v2/map", "/v2/search",
                 "/v2/extract", "/v1/scrape", "/v1/crawl", "/v1/batch/scrape", "/v1/map",
                 "/v1/search", "/v1/extract"):  # fmt: skip
        assert spec["paths"][path]["post"]["requestBody"]["required"] is True, path
    for path in ("/v2/search", "/v1/search", "/v2/extract", "/v1/extract"):
        assert "501" in spec["paths"][path]["post"]["responses"], path


SAMPLES: list[tuple[str, dict[str, Any], bool, int]] = [
    ("/v2/scrape", {"url": PAGE}, True, 403),
    ("/v2/scrape", {}, False, 400),
    ("/v2/scrape", {"url": "ftp://a.test/"}, False, 400),
    ("/v2/scrape", {"url": PAGE, "timeout": 5}, False, 400),
    ("/v2/scrape", {"url": PAGE, "formats": ["json"]}, True, 403),
    ("/v2/scrape", {"url": PAGE, "formats": ["screenshot"]}, False, 400),  # no browser
    ("/v2/scrape", {"url": PAGE, "formats": ["changeTracking"]}, False, 400),
    ("/v2/scrape", {"url": PAGE, "formats": ["markdown", "changeTracking"]}, True, 403),
    ("/v2/scrape", {"url": PAGE, "redactPII": True}, False, 400),
    ("/v2/scrape", {"url": PAGE, "zeroDataRetention": {}}, False, 400),
    ("/v2/search", {"query": " "}, False, 400),
    ("/v2/search", {"query": "q", "sources": []}, False, 400),
    ("/v2/search", {"query": "q", "includeDomains": ["a.test"], "excludeDomains": ["b.test"]},
     False, 400),
    ("/v2/search", {"query": "q", "includeDomains": ["https://a.test/"]}, True, 502),
    ("/v2/extract", {}, False, 400),
    ("/v2/extract", {"urls": ["nope"], "ignoreInvalidURLs": False, "prompt": "p"}, False, 400),
    ("/v2/batch/scrape", {"urls": ["nope"]}, False, 400),
    ("/v2/batch/scrape", {"urls": ["http://a.test/x"], "ignoreInvalidURLs": {}}, False, 400),
    ("/v2/crawl", {"url": PAGE, "limit": 0}, False, 400),
    ("/v2/map", {"url": PAGE, "limit": 0}, False, 400),
    ("/v1/scrape", {"url": PAGE, "formats": ["extract"]}, False, 400),
    ("/v1/scrape", {"url": PAGE, "formats": ["extract"], "extract": {"prompt": "p"}}, True,
     403),
    ("/v1/map", {"url": PAGE, "limit": 30_001}, False, 400),
    ("/v1/crawl", {"url": PAGE, "allowBackwardLinks": "yes"}, False, 400),
    ("/v1/crawl", {"url": PAGE, "maxDepth": 2**53}, False, 400),
    ("/v2/scrape", {"url": PAGE, "maxAge": 2**64}, False, 400),
]  # fmt: skip
"""(path, body, valid by the document, the server's status): 400 exactly for the invalid ones."""


async def test_what_the_document_calls_valid_the_server_takes(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=CONFIGURED)
    wrong = []
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
        for path, body, valid, status in SAMPLES:
            errors = [e.message for e in body_validator(spec, "post", path).iter_errors(body)]
            answer = await http.post(path, json=body)
            if (not errors) is not valid or answer.status_code != status:
                wrong.append((path, body, errors, answer.status_code, answer.text[:200]))
    assert not wrong


def formats(spec: dict[str, Any]) -> set[str]:
    return set(spec["components"]["schemas"]["ScrapeFormats"]["items"]["anyOf"][0]["enum"])


async def test_without_llm_search_or_browser_the_document_says_so(
    start_daemon: StartDaemon,
) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
    assert not formats(spec) & {"json", "summary", "screenshot"}
    assert spec["components"]["schemas"]["ScrapeActions"]["maxItems"] == 0
    notification = spec["components"]["schemas"]["MonitorNotification"]["properties"]
    assert notification["email"]["properties"]["enabled"] == {"enum": [False]}  # no relay
    assert notification["targets"]["items"] == {"not": {}}  # no targets configured
    extract = body_validator(spec, "post", "/v2/extract")
    assert list(extract.iter_errors({"prompt": "find x"}))  # urls needed: no [search]
    assert not list(extract.iter_errors({"urls": [PAGE]}))


async def test_with_llm_and_search_the_document_says_so(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=CONFIGURED)
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
    assert {"json", "summary"} <= formats(spec)
    assert spec["components"]["schemas"]["LlmProvider"] == {"enum": ["default"]}
    assert not list(body_validator(spec, "post", "/v2/extract").iter_errors({"prompt": "x"}))


async def test_answers_without_input_match_their_declared_schema(start_daemon: StartDaemon) -> None:
    """GET routes that need no id answer what the document declares for their 200 (a model
    named as a deployment schema once declared /v2/parse/formats as the scrape formats)."""
    daemon = await start_daemon(extra=CONFIGURED)
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
        for path in ("/v2/parse/formats", "/v2/monitor", "/v2/team/credit-usage"):
            if path not in spec["paths"]:
                continue
            declared = spec["paths"][path]["get"]["responses"]["200"]["content"]
            schema = declared["application/json"]["schema"]
            answer = await http.get(path)
            assert answer.status_code == 200, (path, answer.text)
            validator = jsonschema.Draft202012Validator(
                {**schema, "components": spec["components"]}
            )
            assert not list(validator.iter_errors(answer.json())), path
