# A SearXNG instance for tests and the demo: its `/search?format=json` answer (query, results with
# url/title/content/engine/category/score, publishedDate for news, img_src/resolution for images,
# answers, suggestions, unresponsive_engines) and its errors (403 when json is not an allowed
# format, 400 `{"error": "No query"}`), in pages of `page_size`. Results are derived from the query
# alone, so a test knows what to expect, and point at `site_base` (the site simulator, by default)
# so `scrapeOptions` can scrape them; their hosts rotate over a few names so domain filters have
# something to filter. Faults on demand: down (500), slow, bad JSON, 429 with Retry-After.
# Every request's parameters are recorded for tests to read.
from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass, field
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemon.fakes.serving import run_standalone, serve_fake

HOSTS = ("site.test", "www.site.test", "github.com", "arxiv.org", "example.org")
"""Hosts of the generated results, in rotation; site.test names are served by the site
simulator (daemon/fakes/site.py), so their results can be scraped."""


@dataclass
class SearxngSim:
    site_base: str = "http://site.test"
    """Scheme and host (and port) of results on site.test names; their paths are /pages/{i}."""
    total: int = 45
    """Results a query has in each category."""
    page_size: int = 10
    json_enabled: bool = True
    mode: str = "ok"
    """ok | down (500) | bad_json | slow (answers after `slow_s`) | rate_limit (429 for the next
    `rate_limited` requests, then ok)."""
    slow_s: float = 5.0
    rate_limited: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/search", self._search, methods=["GET", "POST"]),
            Route("/_searxng/mode", self._set_mode, methods=["POST"]),
            Route("/_searxng/requests", self._requests, methods=["GET"]),
        ])  # fmt: skip

    def result_url(self, i: int) -> str:
        host = HOSTS[i % len(HOSTS)]
        if host.endswith("site.test"):
            base = self.site_base.replace("://site.test", f"://{host}", 1)
            return f"{base}/pages/{i}"
        return f"https://{host}/results/{i}"

    def results(self, query: str, category: str, pageno: int) -> list[dict[str, Any]]:
        start = (pageno - 1) * self.page_size
        stop = min(self.total, start + self.page_size)
        return [self._result(query, category, i) for i in range(start, stop)]

    def _result(self, query: str, category: str, i: int) -> dict[str, Any]:
        url = self.result_url(i)
        digest = hashlib.sha256(f"{query}|{category}|{i}".encode()).hexdigest()[:8]
        result: dict[str, Any] = {
            "url": url,
            "title": f"{query} — {category} result {i}",
            "content": f"About {query}: snippet {digest} of result {i}.",
            "engine": "fake",
            "engines": ["fake"],
            "template": "default.html",
            "parsed_url": ["https", url.split("/")[2], f"/results/{i}", "", "", ""],
            "positions": [i + 1],
            "score": round(1.0 / (i + 1), 4),
            "category": category,
            "publishedDate": None,
            "thumbnail": None,
        }
        if category == "news":
            result["publishedDate"] = f"2026-11-{1 + i % 28:02d}T08:00:00"
            result["thumbnail"] = f"https://example.org/thumbs/{i}.jpg"
        if category == "images":
            result.update(template="images.html", img_src=f"https://example.org/img/{i}.png",
                          thumbnail_src=f"https://example.org/thumbs/{i}.png",
                          resolution=f"{640 + i}x{480 + i}", img_format="png")  # fmt: skip
        return result

    async def _search(self, request: Request) -> Response:
        params = dict(request.query_params)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.form()).items()})
        self.requests.append(params)
        if params.get("format") != "json" or not self.json_enabled:
            return Response("Forbidden", status_code=403)
        query = params.get("q", "").strip()
        if not query:
            return JSONResponse({"error": "No query"}, status_code=400)
        if self.mode == "down":
            return JSONResponse({"error": "search error"}, status_code=500)
        if self.mode == "rate_limit" and self.rate_limited > 0:
            self.rate_limited -= 1
            return Response("Too Many Requests", status_code=429, headers={"Retry-After": "0"})
        if self.mode == "slow":
            await trio.sleep(self.slow_s)
        if self.mode == "bad_json":
            return Response("<html>not json", media_type="application/json")
        try:
            pageno = max(1, int(params.get("pageno", "1")))
        except ValueError:
            return JSONResponse({"error": "Invalid pageno"}, status_code=400)
        categories = [c for c in params.get("categories", "general").split(",") if c]
        results = [r for c in categories or ["general"] for r in self.results(query, c, pageno)]
        return JSONResponse({
            "query": query,
            "number_of_results": self.total * len(categories or ["general"]),
            "results": results,
            "answers": [],
            "corrections": [],
            "infoboxes": [],
            "suggestions": [f"{query} tutorial"],
            "unresponsive_engines": [],
        })  # fmt: skip

    async def _set_mode(self, request: Request) -> Response:
        body = await request.json()
        self.mode = str(body.get("mode", "ok"))
        self.rate_limited = int(body.get("rate_limited", self.rate_limited))
        self.slow_s = float(body.get("slow_s", self.slow_s))
        return JSONResponse({"mode": self.mode})

    async def _requests(self, request: Request) -> Response:
        return JSONResponse(self.requests)


async def serve_searxng(
    sim: SearxngSim,
    bind: str = "127.0.0.1:0",
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `sim` until `shutdown` is set; started() gets (host, port)."""
    await serve_fake(sim.app(), bind, "searxng", shutdown=shutdown, task_status=task_status)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A SearXNG simulator (JSON API)")
    parser.add_argument("--bind", default="127.0.0.1:8705")
    parser.add_argument("--site-base", default="http://site.test")
    args = parser.parse_args(argv)
    sim = SearxngSim(site_base=args.site_base)
    run_standalone(sim.app(), args.bind, "searxng",
                   lambda host, port: f"SearXNG simulator on http://{host}:{port}")  # fmt: skip


if __name__ == "__main__":
    main()
