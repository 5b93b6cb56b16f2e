"""/v2/agent through a whole crawld (real HTTP, the generated site, the SearXNG simulator as its
search provider and the OpenAI-compatible simulator as its model) and firecrawl-py 4.55: `agent`
(which polls) and `start_agent` / `get_agent_status` / `cancel_agent`; an agent that must search
to find its answer, one held to its URLs, the budget, cancel, webhooks in order, the step trace,
the 400s (never reaching the model) and the answers' keys (firecrawl-mcp drops unknown ones;
test_mcp_agent_js.py runs the real one)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pydantic
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import AgentWebhookConfig

from daemon.app import Daemon
from daemon.crawl.agent.service import AgentService
from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.searxng import SearxngSim, serve_searxng
from daemon.fakes.site import SiteSim

from .conftest import CONFIG

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
MCP_STATUS_KEYS = {
    "agent_hints", "success", "error", "id", "status", "progress", "data", "creditsUsed",
    "sources", "expiresAt", "model", "mode", "threadId", "threadTurn", "message", "suggestions",
    "exchange", "pendingApproval",
}  # fmt: skip
"""firecrawl-mcp 3.26's output schema of firecrawl_agent_status (additionalProperties false)."""
MCP_START_KEYS = {"agent_hints", "success", "error", "id", "status", "threadId", "threadTurn"}


def _page(title: str, body: str) -> tuple[bytes, str]:
    html = f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>"
    return html.encode(), "text/html"


PAGES = {
    "/co/0": _page("Widgets news", "<p>Widgets are small parts made by many firms.</p>"),
    "/co/1": _page("About Acme", "<p>name: Acme Widgets</p><p>Founded in 1999.</p>"),
    "/co/2": _page("Acme careers", "<p>We hire engineers.</p>"),
    "/docs/": _page("Docs", '<p>Start <a href="/docs/a">here</a>, <a href="/docs/b">there</a>'
                    ' or <a href="/co/2">careers</a>.</p>'),
    "/docs/a": _page("Docs A", "<p>name: Docs Corp</p>"),
    "/docs/b": _page("Docs B", "<p>Nothing named.</p>"),
}  # fmt: skip


@pytest.fixture
def pages(site: SiteSim) -> SiteSim:
    site.files.update(PAGES)
    return site


@pytest.fixture
async def searxng(nursery: trio.Nursery, pages: SiteSim) -> SearxngSim:
    sim = SearxngSim(site_base=f"http://site.test:{pages.port}", total=3)
    sim.result_url = lambda i: pages.url(f"/co/{i}")  # type: ignore[method-assign]
    host, port = await nursery.start(functools.partial(serve_searxng, sim))
    sim.address = f"http://{host}:{port}"  # type: ignore[attr-defined]
    return sim


LLM = 'cache_ttl = "0s"\nretries = 0\nmax_output_tokens = 256\n'
AGENT = "[agent]\nmax_steps = 12\npage_chars = 1000\n"


@pytest.fixture
def crawl_config(searxng: SearxngSim, llm: tuple[OpenAICompatService, str]) -> str:
    address = searxng.address  # type: ignore[attr-defined]
    return (
        CONFIG
        + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\nretries = 0\n'
        + f'[llm]\nbase_url = "{llm[1]}"\nmodel = "sim"\n{LLM}'
        + AGENT
    )


@pytest.fixture
def sim(llm: tuple[OpenAICompatService, str]) -> OpenAICompatService:
    return llm[0]


async def wait_agent(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    with trio.fail_after(30):
        while True:
            body: dict[str, Any] = (await client.get(f"/v2/agent/{job_id}")).json()
            if body["status"] != "processing":
                return body
            await trio.sleep(0.02)


async def steps_of(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = (await client.get(f"/v2/agent/{job_id}/steps")).json()["steps"]
    return steps


async def test_sdk_agent_searches_reads_and_answers_with_sources(
    fc: Firecrawl, pages: SiteSim, searxng: SearxngSim, sim: OpenAICompatService,
    sdk: Callable[..., Awaitable[Any]], client: httpx.AsyncClient,
) -> None:  # fmt: skip
    result = await sdk(fc.agent, prompt="The name of the widget company", schema=SCHEMA,
                       poll_interval=1, timeout=30)  # fmt: skip
    assert result.status == "completed" and result.success
    # The model chose the three results in the order shown; the answer is the first `name:`.
    assert result.data == {"name": "Acme Widgets"}
    assert isinstance(result.credits_used, int) and result.credits_used >= 4
    assert result.expires_at is not None and result.model == "spark-2"
    assert {r["q"] for r in searxng.requests} == {"The name of the widget company"}
    assert len(sim.requests) == 2  # one choice, one answer
    raw = (await client.get(f"/v2/agent/{result.id}")).json()
    assert set(raw) <= MCP_STATUS_KEYS, set(raw) - MCP_STATUS_KEYS
    assert raw["sources"] == [pages.url("/co/1")]  # the page holding the answer
    assert raw["creditsUsed"] == result.credits_used and "message" not in raw
    steps = await steps_of(client, result.id)
    assert [s["action"] for s in steps] == [
        "search", "choose", "scrape", "scrape", "scrape", "answer"
    ]  # fmt: skip
    assert steps[1]["output"]["chosen"] == [pages.url(f"/co/{i}") for i in range(3)]
    assert sorted(s["input"]["url"] for s in steps[2:5]) == steps[1]["output"]["chosen"]
    assert [s["step"] for s in steps] == list(range(1, 7))
    assert steps[-1]["creditsUsed"] == raw["creditsUsed"]
    credits = [s["creditsUsed"] for s in steps]
    assert credits == sorted(credits) and credits[0] == 1


async def test_start_status_and_webhooks_in_order(
    fc: Firecrawl, pages: SiteSim, sdk: Callable[..., Awaitable[Any]],
    client: httpx.AsyncClient, rx: WebhookReceiver,
) -> None:  # fmt: skip
    started = await sdk(fc.start_agent, [pages.url("/co/1")], prompt="Company name",
                        webhook=AgentWebhookConfig(url=rx.url("/hook"), metadata={"run": "x"}))  # fmt: skip
    assert started.success and started.id
    raw_start = await client.post("/v2/agent", json={"prompt": "x", "urls": [pages.url("/co/1")]})
    assert set(raw_start.json()) <= MCP_START_KEYS
    await wait_agent(client, started.id)
    status = await sdk(fc.get_agent_status, started.id)
    # No schema: a free answer; urls given, not strict: the search ran too, its results read.
    assert status.status == "completed" and isinstance(status.data["answer"], str)
    with trio.fail_after(10):
        await rx.wait_until(lambda: any(e.type == "agent.completed" for e in rx.events(started.id)))
    events = rx.events(started.id)
    types = [e.type for e in events]
    assert types[0] == "agent.started" and types[-1] == "agent.completed"
    assert set(types[1:-1]) == {"agent.action"}
    assert rx.seqs(started.id) == list(range(1, len(events) + 1))
    actions = [e.event["data"][0] for e in events[1:-1]]
    steps = await steps_of(client, started.id)
    assert [a["step"] for a in actions] == [s["step"] for s in steps]
    assert [a["action"] for a in actions] == [s["action"] for s in steps]
    assert actions[0] == {"creditsUsed": 1, "action": "search", "input": {"query": "Company name"},
                          "output": {"results": 3}, "step": 1}  # fmt: skip
    done = events[-1].event
    assert done["success"] is True and done["metadata"] == {"run": "x"}
    [final] = done["data"]
    assert final["data"] == status.data and final["creditsUsed"] == status.credits_used
    assert final["sources"]
    rx.check()


async def test_held_to_its_urls_the_sites_see_only_them(
    client: httpx.AsyncClient, pages: SiteSim, searxng: SearxngSim, sim: OpenAICompatService
) -> None:
    body = {"prompt": "Company name", "schema": SCHEMA, "strictConstrainToURLs": True,
            "urls": [pages.url("/co/0"), pages.url("/docs/*")]}  # fmt: skip
    job_id = (await client.post("/v2/agent", json=body)).json()["id"]
    done = await wait_agent(client, job_id)
    assert done["status"] == "completed", done
    assert not searxng.requests  # no web search
    seen = {h.path for h in pages.hits}
    assert seen == {"/co/0", "/docs/", "/docs/a", "/docs/b", "/robots.txt"}, seen
    # /co/2 is linked from /docs/ but outside its /* scope: never a candidate.
    steps = await steps_of(client, job_id)
    choices = [s for s in steps if s["action"] == "choose"]
    assert choices and all(
        set(c["output"]["chosen"]) <= {pages.url("/docs/a"), pages.url("/docs/b")} for c in choices
    )
    assert done["data"] == {"name": "Docs Corp"}
    assert done["sources"] == [pages.url("/docs/a")]


async def test_the_budget_ends_reading_with_a_clear_message_or_fails(
    client: httpx.AsyncClient, pages: SiteSim, sim: OpenAICompatService, rx: WebhookReceiver
) -> None:
    urls = [pages.url("/co/1"), pages.url("/co/2")]
    body = {"prompt": "Company name", "schema": SCHEMA, "urls": urls,
            "strictConstrainToURLs": True, "maxCredits": 3}  # fmt: skip
    job_id = (await client.post("/v2/agent", json=body)).json()["id"]
    done = await wait_agent(client, job_id)
    assert done["status"] == "completed", done
    assert done["message"].startswith("Stopped reading after 1 page: maxCredits (3)")
    assert done["creditsUsed"] <= 3 and done["data"] == {"name": "Acme Widgets"}
    assert [s["action"] for s in await steps_of(client, job_id)] == ["scrape", "answer"]
    body = {**body, "maxCredits": 1, "webhook": rx.url("/hook")}
    job_id = (await client.post("/v2/agent", json=body)).json()["id"]
    done = await wait_agent(client, job_id)
    assert done["status"] == "failed" and done["success"] is True and "data" not in done
    assert done["error"].startswith("Max credits exceeded: maxCredits (1)")
    assert done["creditsUsed"] == 0 and not pages.hits_for("/co/2")
    with trio.fail_after(10):
        events = await rx.wait_delivered(2, job_id)
    assert [e.type for e in events] == ["agent.started", "agent.failed"]
    assert events[1].event["error"] == done["error"]
    assert events[1].event["data"] == [{"creditsUsed": 0}]


async def test_the_step_cap_ends_a_run_that_could_read_on(
    client: httpx.AsyncClient, pages: SiteSim, daemon: Daemon
) -> None:
    service: AgentService = daemon.parts["agent"]
    service.configure(msgspec_replace(service.config, max_steps=4))
    body = {"prompt": "Docs", "schema": SCHEMA, "urls": [pages.url("/docs/*")],
            "strictConstrainToURLs": True}  # fmt: skip
    job_id = (await client.post("/v2/agent", json=body)).json()["id"]
    done = await wait_agent(client, job_id)
    assert done["status"] == "completed"
    assert "step cap (4)" in done["message"]
    actions = [s["action"] for s in await steps_of(client, job_id)]
    assert actions == ["scrape", "choose", "scrape", "answer"]


def msgspec_replace(value: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(value, **changes)


async def test_cancel_abandons_the_model_call_and_ends_cancelled(
    fc: Firecrawl, pages: SiteSim, sim: OpenAICompatService, daemon: Daemon,
    client: httpx.AsyncClient, rx: WebhookReceiver, sdk: Callable[..., Awaitable[Any]],
) -> None:  # fmt: skip
    sim.slow(5, seconds=60)
    body = {"prompt": "Company name", "urls": [pages.url("/co/1")],
            "strictConstrainToURLs": True, "webhook": rx.url("/hook")}  # fmt: skip
    job_id = (await client.post("/v2/agent", json=body)).json()["id"]
    service: AgentService = daemon.parts["agent"]
    with trio.fail_after(10):
        while sim.in_flight == 0:
            await trio.sleep(0.02)
    section = (await client.get("/status")).json()["crawl"]["agent"]
    assert section["jobs_running"] == 1 and section["jobs"][job_id]["doing"] == "answer"
    with trio.fail_after(5):  # within seconds, not after the model call's timeout
        assert await sdk(fc.cancel_agent, job_id) is True
        done = await wait_agent(client, job_id)
    assert done["status"] == "cancelled" and done["error"].startswith("cancelled by a user")
    with trio.fail_after(5):  # the run leaves the service just after the job's end is stored
        while job_id in service.runs:
            await trio.sleep(0.02)
    assert done["creditsUsed"] == 1 and job_id not in service.runs
    with pytest.raises(pydantic.ValidationError):  # firecrawl-py's literal lacks "cancelled"
        await sdk(fc.get_agent_status, job_id)
    again = await client.delete(f"/v2/agent/{job_id}")
    assert again.status_code == 409 and again.json()["success"] is False
    with trio.fail_after(10):
        events = await rx.wait_delivered(3, job_id)
    assert [e.type for e in events] == ["agent.started", "agent.action", "agent.cancelled"]
    last = events[-1].event
    assert last["success"] is False and "error" not in last
    assert last["data"] == [{"creditsUsed": 1}]


@pytest.mark.parametrize(
    ("body", "path", "text"),
    [
        ({"prompt": "x" * 10_001}, "$.prompt", "at most 10000"),
        ({"prompt": "x", "schema": "nope"}, "$.schema", "JSON Schema object"),
        ({"prompt": "x", "schema": [1]}, "$.schema", "JSON Schema object"),
        ({"prompt": "x", "urls": "http://a.test/"}, "$.urls", "Expected `array"),
        ({"prompt": "x", "model": "nope"}, "$.model", "unknown model"),
        ({"urls": ["http://a.test/"]}, "$.prompt", "required"),
    ],
)  # fmt: skip
async def test_bad_input_is_a_400_naming_the_field_and_never_reaches_the_model(
    client: httpx.AsyncClient, sim: OpenAICompatService, body: dict[str, Any], path: str,
    text: str,
) -> None:  # fmt: skip
    answer = await client.post("/v2/agent", json=body)
    assert answer.status_code == 400, answer.text
    payload = answer.json()
    assert payload["success"] is False and payload["code"] == "BAD_REQUEST"
    problems = [d for d in payload["details"] if d["path"] == path]
    assert problems and text in problems[0]["message"], payload
    assert not sim.requests


async def test_unknown_ids_are_404(client: httpx.AsyncClient, pages: SiteSim) -> None:
    missing = "0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d"
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/steps")):
        answer = await client.request(method, f"/v2/agent/{missing}{path}")
        assert answer.status_code == 404
        assert answer.json() == {"success": False, "error": "Agent job not found"}
    batch = (await client.post("/v2/batch/scrape", json={"urls": [pages.url("/co/1")]})).json()
    assert (await client.get(f"/v2/agent/{batch['id']}")).status_code == 404
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"post"} <= set(paths["/v2/agent"]) and {"get", "delete"} <= set(paths["/v2/agent/{id}"])
    assert "409" in paths["/v2/agent/{id}"]["delete"]["responses"]


@pytest.fixture
def quick_rescan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run a store failure interrupted is found again by the service's scan at once."""
    from daemon.crawl.agent import service as agent_service

    monkeypatch.setattr(agent_service, "SCAN_S", 0.05)


@pytest.mark.parametrize(
    ("name", "call", "error"),
    [
        ("add_step", 3, "lost_commit"),  # a step's commit: its outcome unknown
        ("set_kicked_off", 1, "lost_commit"),  # the kickoff
        ("pages", 4, "pool_timeout"),  # a read of the run's state
    ],
)
async def test_a_store_failure_interrupts_a_run_and_the_same_id_goes_on(
    quick_rescan: None, monkeypatch: pytest.MonkeyPatch, client: httpx.AsyncClient,
    pages: SiteSim, rx: WebhookReceiver, name: str, call: int, error: str,
) -> None:  # fmt: skip
    import psycopg
    import psycopg_pool

    from daemon.crawl.agent import store as astore

    calls = {"n": 0}
    real = getattr(astore, name)
    raised = (psycopg.OperationalError("consuming input failed: server closed the connection")
              if error == "lost_commit" else psycopg_pool.PoolTimeout("no connection"))  # fmt: skip

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == call:
            raise raised
        return real(*args, **kwargs)

    monkeypatch.setattr(astore, name, wrapped)
    body = {"prompt": "Company name", "schema": SCHEMA, "webhook": rx.url("/hook")}
    job_id = (await client.post("/v2/agent", json=body)).json()["id"]
    done = await wait_agent(client, job_id)
    assert calls["n"] > call, "the failure was never injected"
    assert done["status"] == "completed" and done["data"] == {"name": "Acme Widgets"}, done
    steps = await steps_of(client, job_id)
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert [s["action"] for s in steps] == [
        "search", "choose", "scrape", "scrape", "scrape", "answer"
    ]  # fmt: skip
    with trio.fail_after(10):
        await rx.wait_until(lambda: any(e.type == "agent.completed" for e in rx.events(job_id)))
    rx.check()
    events = list({e.event_id: e for e in rx.events(job_id)}.values())
    assert [e.type for e in events] == ["agent.started", *["agent.action"] * 6, "agent.completed"]
    assert [e.event["data"][0]["step"] for e in events[1:-1]] == list(range(1, 7))
