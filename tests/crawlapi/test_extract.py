"""/v2/extract through a whole crawld (real HTTP, the generated site, the OpenAI-compatible
simulator as its model) and firecrawl-py 4.55: `extract` (which polls), `start_extract` +
`get_extract_status`, a `/*` URL expanded by crawling, the merge following the schema,
`showSources`, `tokensUsed`, webhooks in order, the 400s, and a model fault on one page."""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.utils.error_handler import FirecrawlError

from daemon.app import Daemon
from daemon.crawl.extract.service import ExtractService
from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim

from .conftest import CONFIG

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "products": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "products"],
}


def _page(title: str, body: str) -> tuple[bytes, str]:
    html = f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>"
    return html.encode(), "text/html"


SHOP = {
    "/shop/": _page(
        "Shop",
        "<p>name: Acme</p><ul><li>Widget</li><li>Gadget</li></ul>"
        '<p>See <a href="/shop/a">A</a>, <a href="/shop/b">B</a> and <a href="/about">about</a>.</p>',
    ),
    "/shop/a": _page("Shop A", "<p>name: Acme</p><ul><li>Gadget</li><li>Gizmo</li></ul>"),
    "/shop/b": _page("Shop B", "<p>Nothing named here.</p><ul><li>Doohickey</li></ul>"),
    "/solo": _page("Solo", "<p>name: Solo Corp</p><ul><li>Thing</li></ul>"),
    "/empty": (b"<html><body></body></html>", "text/html"),
}


@pytest.fixture
def crawl_config(llm: tuple[OpenAICompatService, str]) -> str:
    return CONFIG + f'[llm]\nbase_url = "{llm[1]}"\nmodel = "sim"\ncache_ttl = "0s"\nretries = 0\n'


@pytest.fixture
def sim(llm: tuple[OpenAICompatService, str]) -> OpenAICompatService:
    return llm[0]


@pytest.fixture
def shop(site: SiteSim) -> SiteSim:
    site.files.update(SHOP)
    return site


def _quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kw: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return fn(*args, **kw)

    return call


async def wait_extract(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    with trio.fail_after(30):
        while True:
            body: dict[str, Any] = (await client.get(f"/v2/extract/{job_id}")).json()
            if body["status"] != "processing":
                return body
            await trio.sleep(0.02)


async def test_sdk_extract_polls_until_the_merged_object(
    fc: Firecrawl, shop: SiteSim, sim: OpenAICompatService, sdk: Callable[..., Awaitable[Any]]
) -> None:
    result = await sdk(
        _quiet(fc.extract),
        [shop.url("/solo")],
        prompt="The company",
        schema=SCHEMA,
        poll_interval=1,
        timeout=30,
    )
    assert result.status == "completed" and result.success
    assert result.data == {"name": "Solo Corp", "products": ["Thing"]}
    assert result.tokens_used and result.tokens_used > 0
    assert result.expires_at is not None
    assert result.sources is None  # not asked for
    [request] = sim.requests
    assert "name: Solo Corp" in request["messages"][-1]["content"]
    assert any("The company" in str(m.get("content")) for m in request["messages"])


async def test_start_extract_then_status_with_wildcard_merge_and_sources(
    fc: Firecrawl, shop: SiteSim, sim: OpenAICompatService, sdk: Callable[..., Awaitable[Any]],
    client: httpx.AsyncClient,
) -> None:  # fmt: skip
    started = await sdk(
        _quiet(fc.start_extract), [shop.url("/shop/*")], schema=SCHEMA, show_sources=True
    )
    assert started.success and started.id
    await wait_extract(client, started.id)
    status = await sdk(_quiet(fc.get_extract_status), started.id)
    assert status.status == "completed"
    # /shop/ first, then the pages its crawl found; /about is outside /shop/ and never read.
    assert status.data == {"name": "Acme", "products": ["Widget", "Gadget", "Gizmo", "Doohickey"]}
    base, a, b = shop.url("/shop/"), shop.url("/shop/a"), shop.url("/shop/b")
    assert status.sources == {
        "name": [base, a],
        "products[0]": [base],
        "products[1]": [base, a],
        "products[2]": [a],
        "products[3]": [b],
    }
    assert len(sim.requests) == 3
    assert not shop.hits_for("/about")
    raw = (await client.get(f"/v2/extract/{started.id}")).json()
    assert raw["success"] is True and raw["tokensUsed"] == status.tokens_used > 0
    assert set(raw) == {"success", "status", "data", "expiresAt", "sources", "tokensUsed"}


async def test_a_processing_job_answers_empty_data(
    client: httpx.AsyncClient, shop: SiteSim, sim: OpenAICompatService
) -> None:
    sim.slow(1, seconds=1.0)
    started = (
        await client.post("/v2/extract", json={"urls": [shop.url("/solo")], "prompt": "name"})
    ).json()
    assert started == {"success": True, "id": started["id"], "urlTrace": []}
    body = (await client.get(f"/v2/extract/{started['id']}")).json()
    assert body["status"] == "processing" and body["data"] == [] and body["success"] is True
    assert "tokensUsed" not in body
    done = await wait_extract(client, started["id"])
    assert done["status"] == "completed"
    assert isinstance(done["data"], dict)  # no schema: an object of the model's choosing


async def test_webhooks_in_order_with_the_result(
    client: httpx.AsyncClient, shop: SiteSim, rx: WebhookReceiver
) -> None:
    body = {"urls": [shop.url("/solo")], "schema": SCHEMA, "showSources": True,
            "webhook": {"url": rx.url("/hook"), "metadata": {"run": "x"}}}  # fmt: skip
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    await wait_extract(client, job_id)
    with trio.fail_after(10):
        events = await rx.wait_delivered(2, job_id)
    assert [e.type for e in events] == ["extract.started", "extract.completed"]
    assert rx.seqs(job_id) == [1, 2]
    done = events[1].event
    assert done["id"] == job_id and done["success"] is True and done["metadata"] == {"run": "x"}
    [result] = done["data"]
    assert result["data"] == {"name": "Solo Corp", "products": ["Thing"]}
    assert result["sources"] == {"name": [shop.url("/solo")], "products[0]": [shop.url("/solo")]}


async def test_a_model_fault_on_one_page_is_that_pages_error(
    client: httpx.AsyncClient, shop: SiteSim, sim: OpenAICompatService
) -> None:
    sim.fail(1, status=500)  # retries = 0: the first page's call fails for good
    urls = [shop.url("/solo"), shop.url("/shop/a")]
    job_id = (await client.post("/v2/extract", json={"urls": urls, "schema": SCHEMA})).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "completed"
    assert "1 of 2 pages could not be extracted" in done["warning"]
    errors = (await client.get(f"/v2/crawl/{job_id}/errors")).json()["errors"]
    assert len(errors) == 1 and errors[0]["code"] == "LLM_UNAVAILABLE"
    assert errors[0]["url"] in urls
    assert done["data"]["name"] in ("Solo Corp", "Acme")


async def test_every_page_failing_fails_the_job_with_the_reason(
    client: httpx.AsyncClient, shop: SiteSim, rx: WebhookReceiver
) -> None:
    urls = [shop.url("/empty"), shop.url("/status/404")]
    body = {"urls": urls, "prompt": "anything", "webhook": rx.url("/hook")}
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "failed" and done["success"] is False and done["data"] == []
    assert "Every page failed (2)" in done["error"]
    with trio.fail_after(10):
        events = await rx.wait_delivered(2, job_id)
    assert [e.type for e in events] == ["extract.started", "extract.failed"]
    assert "Every page failed" in events[1].event["error"]


@pytest.mark.parametrize(
    ("body", "path", "text"),
    [
        ({"prompt": None}, "$.urls", "Either 'urls' or 'prompt' must be provided."),
        ({"prompt": "x"}, "$.urls", "no search provider is configured"),
        ({"urls": ["http://a.test/"] * 11, "prompt": "x"}, "$.urls", "Maximum of 10 URLs"),
        ({"urls": ["http://a.test/"], "schema": "nope"}, "$.schema", "JSON Schema object"),
        ({"urls": ["http://a.test/"], "schema": {"type": "object", "additionalProperties": True}},
         "$.schema", "schema-less dictionary"),
        ({"urls": ["http://a.test/"], "schema": {"type": "str"}}, "$.schema",
         "Invalid JSON schema"),
        ({"urls": ["http://a.test/"], "prompt": "x", "enableWebSearch": True},
         "$.enableWebSearch", "web search is not configured"),
        ({"urls": ["http://a.test/"], "prompt": "x", "bogus": 1}, "$.bogus", "unrecognized key"),
        ({"urls": ["http://a.test/"], "prompt": "x", "limit": 0}, "$.limit", ">= 1"),
        ({"urls": ["ftp://a.test/"], "prompt": "x", "ignoreInvalidURLs": False}, "$.urls[0]",
         "http"),
        ({"urls": ["http://a.test/"], "prompt": "x" * 10_001}, "$.prompt", "10000"),
        ({"urls": ["http://a.test/"], "prompt": "x", "provider": "nope"}, "$.provider",
         "no [llm.providers] entry named 'nope'"),
    ],
)  # fmt: skip
async def test_validation_400s_name_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], path: str, text: str
) -> None:
    answer = await client.post("/v2/extract", json=body)
    assert answer.status_code == 400, answer.text
    payload = answer.json()
    assert payload["success"] is False and payload["code"] == "BAD_REQUEST"
    problems = [d for d in payload["details"] if d["path"] == path]
    assert problems and text in problems[0]["message"], payload


async def test_the_sdk_raises_on_a_400(fc: Firecrawl, sdk: Callable[..., Awaitable[Any]]) -> None:
    with pytest.raises(FirecrawlError):
        await sdk(_quiet(fc.start_extract), ["http://a.test/"], prompt="x", enable_web_search=True)


async def test_invalid_urls_are_dropped_and_listed(
    client: httpx.AsyncClient, shop: SiteSim
) -> None:
    body = {"urls": ["not a url", shop.url("/solo")], "prompt": "x"}
    answer = (await client.post("/v2/extract", json=body)).json()
    assert answer["invalidURLs"] == ["not a url"]
    assert (await wait_extract(client, answer["id"]))["status"] == "completed"


async def test_unknown_id_is_404(client: httpx.AsyncClient, shop: SiteSim) -> None:
    answer = await client.get("/v2/extract/0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d")
    assert answer.status_code == 404
    assert answer.json() == {"success": False, "error": "Extract job not found"}
    # A crawl's id is no extract job.
    crawl = (await client.post("/v2/batch/scrape", json={"urls": [shop.url("/solo")]})).json()
    assert (await client.get(f"/v2/extract/{crawl['id']}")).status_code == 404


async def test_status_and_cancel(client: httpx.AsyncClient, shop: SiteSim, daemon: Daemon,
                                 sim: OpenAICompatService) -> None:  # fmt: skip
    sim.slow(1, seconds=30)
    job_id = (
        await client.post("/v2/extract", json={"urls": [shop.url("/solo")], "prompt": "x"})
    ).json()["id"]
    service: ExtractService = daemon.parts["extract"]
    with trio.fail_after(10):
        while job_id not in service.runs or not service.runs[job_id].in_flight:
            await trio.sleep(0.02)
    section = (await client.get("/status")).json()["crawl"]
    assert section["extract"]["jobs_running"] == 1
    assert section["extract"]["jobs"][job_id]["in_flight"] == 1
    assert (await client.delete(f"/v2/crawl/{job_id}")).json() == {"status": "cancelled"}
    done = await wait_extract(client, job_id)
    assert done["status"] == "cancelled" and done["data"] == []
    assert done["success"] is True and done["error"].startswith("cancelled by a user")


async def test_the_js_sdk_extracts(base_url: str, shop: SiteSim, rx: WebhookReceiver) -> None:
    from .test_sdk_js import JS, node_or_fail

    node = node_or_fail()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "SITE_URL": shop.url("").rstrip("/"),
        "HOOK_URL": rx.url("/js"),
        "NODE_NO_WARNINGS": "1",
    }
    command = [node, "--test", "--test-reporter=tap", str(JS / "extract.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == "4", out[-3000:]
    with trio.fail_after(10):
        hooks = await rx.wait_delivered(2)
    assert [h.type for h in hooks] == ["extract.started", "extract.completed"]


async def test_a_model_that_is_down_fails_the_job_with_the_reason(
    client: httpx.AsyncClient, shop: SiteSim, sim: OpenAICompatService
) -> None:
    sim.fail(10, status=503)
    body = {"urls": [shop.url("/solo"), shop.url("/shop/a")], "schema": SCHEMA}
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "failed" and done["data"] == []
    assert "Every page failed (2)" in done["error"] and "LLM_UNAVAILABLE" in done["error"]


async def test_timeout_fails_a_job_still_running(
    client: httpx.AsyncClient, shop: SiteSim, sim: OpenAICompatService
) -> None:
    sim.slow(1, seconds=5)
    body = {"urls": [shop.url("/solo")], "prompt": "x", "timeout": 1000}
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "failed" and done["error"] == "Extract timed out after 1000 ms"


async def test_a_job_ended_elsewhere_stops_without_overwriting_its_end(
    client: httpx.AsyncClient, shop: SiteSim, sim: OpenAICompatService, daemon: Daemon
) -> None:
    sim.slow(1, seconds=1)
    body = {"urls": [shop.url("/solo")], "prompt": "x"}
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    service: ExtractService = daemon.parts["extract"]
    with trio.fail_after(10):
        while job_id not in service.runs or not service.runs[job_id].in_flight:
            await trio.sleep(0.02)
    assert daemon.jobs is not None
    await daemon.jobs.finish(job_id, "failed", "ended by another instance")
    with trio.fail_after(10):
        while job_id in service.runs:
            await trio.sleep(0.02)
    done = (await client.get(f"/v2/extract/{job_id}")).json()
    assert done["status"] == "failed" and done["error"] == "ended by another instance"


async def test_v1_extract_with_firecrawl_py_1x(base_url: str, shop: SiteSim) -> None:
    from .test_sdk_v1 import sdk_v1_or_fail

    folder = sdk_v1_or_fail()
    env = {**os.environ, "PYTHONPATH": str(folder), "CRAWLD_URL": base_url,
           "SITE_URL": shop.url("").rstrip("/")}  # fmt: skip
    script = Path(__file__).with_name("sdk_v1_extract_client.py")
    with trio.fail_after(60):
        done = await trio.run_process([sys.executable, str(script)], env=env,
                                      capture_stdout=True, capture_stderr=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    result = json.loads(done.stdout)
    assert result["success"] is True and result["status"] == "completed"
    assert result["data"] == {"name": "Solo Corp", "products": ["Thing"]}


async def test_v1_extract_defaults(client: httpx.AsyncClient, shop: SiteSim) -> None:
    body = {"urls": ["not a url", shop.url("/solo")], "prompt": "x"}
    answer = await client.post("/v1/extract", json=body)
    assert answer.status_code == 400  # v1: ignoreInvalidURLs defaults to false
    assert answer.json()["details"][0]["path"] == "$.urls[0]"
    body = {"urls": [shop.url("/solo")], "schema": SCHEMA,
            "scrapeOptions": {"formats": ["markdown"], "parsePDF": False}}  # fmt: skip
    job_id = (await client.post("/v1/extract", json=body)).json()["id"]
    with trio.fail_after(30):
        while (done := (await client.get(f"/v1/extract/{job_id}")).json())["status"] == (
            "processing"
        ):
            await trio.sleep(0.02)
    assert done["data"] == {"name": "Solo Corp", "products": ["Thing"]}
    bad = await client.post("/v1/extract", json={**body, "scrapeOptions": {"formats": ["nope"]}})
    assert bad.status_code == 400
    assert bad.json()["details"][0]["path"] == "$.scrapeOptions.formats[0]"
    # formats are ignored (pages are read as markdown) but held to their declared rules
    tracked = {"formats": ["markdown", "changeTracking"],
               "changeTrackingOptions": {"schema": True}}  # fmt: skip
    bad = await client.post("/v1/extract", json={**body, "scrapeOptions": tracked})
    assert bad.status_code == 400, bad.text
    assert "$.scrapeOptions.formats" in bad.text
    llm_formats = {"formats": ["json", "links"], "jsonOptions": {"prompt": "p"}}
    fine = await client.post("/v1/extract", json={**body, "scrapeOptions": llm_formats})
    assert fine.status_code == 200, fine.text  # the [llm] extract needs serves them too


async def test_v2_extract_ignores_any_formats(client: httpx.AsyncClient, shop: SiteSim) -> None:
    """v2's document declares no rule for the scrape formats extract ignores: any are taken."""
    body = {"urls": [shop.url("/solo")], "schema": SCHEMA,
            "scrapeOptions": {"formats": ["no such format", {"type": "changeTracking",
                                                             "schema": True}]}}  # fmt: skip
    answer = await client.post("/v2/extract", json=body)
    assert answer.status_code == 200, answer.text
    assert "formats is ignored" in answer.json()["warning"]
