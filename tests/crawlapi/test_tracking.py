"""changeTracking: the pure rules (same test, git-style hunks, parse-diff's structure, the 400s),
the snapshots on both backends across a reopened store, and through a whole crawld a page that
changes between scrapes: new → same → changed (diff checked) → removed, tag buckets, a crawl
giving each page its status, and firecrawl-py's ChangeTrackingFormat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio
from firecrawl import Firecrawl

from daemon.crawl.options.models import ScrapeOptions, check_scrape_options
from daemon.crawl.runs.service import CrawlService
from daemon.crawl.tracking import changes as tracking
from daemon.crawl.tracking.changes import TrackingSpec
from daemon.crawl.tracking.store import ChangeTracker
from daemon.fakes.site import SiteSim, host_map_resolver
from daemon.store import Store, open_store
from tests.conftest import serve_daemon
from tests.crawlapi.conftest import CONFIG, wait_finished


class Llm:
    def configured(self, provider: str | None = None) -> bool:
        return True


def test_same_ignores_whitespace_iframes_and_order() -> None:
    assert tracking.change_status(None, "a", 200) == "new"
    assert tracking.change_status("a b\nc", "abc  [iframe](http://x/)", 200) == "same"
    assert tracking.change_status("ab", "ba", 200) == "same"  # sorted characters
    assert tracking.change_status("ab", "abc", 200) == "changed"
    assert tracking.change_status(None, "a", 404) == "removed"


def test_git_diff_hunks_and_parse_diff_structure() -> None:
    old = "".join(f"line {i}\n" for i in range(1, 11))
    new = old.replace("line 5\n", "line five\nline 5b\n")
    text = tracking.git_diff(old, new)
    assert text == (
        "@@ -2,7 +2,8 @@\n line 2\n line 3\n line 4\n-line 5\n+line five\n+line 5b\n"
        " line 6\n line 7\n line 8\n"
    )
    parsed = tracking.parse_diff(text)
    (file,) = parsed["files"]
    assert (file["from"], file["to"], file["additions"], file["deletions"]) == (None, None, 2, 1)
    (chunk,) = file["chunks"]
    assert chunk["content"] == "@@ -2,7 +2,8 @@"
    assert (chunk["oldStart"], chunk["oldLines"], chunk["newStart"], chunk["newLines"]) == (
        2, 7, 2, 8)  # fmt: skip
    changes = chunk["changes"]
    assert changes[0] == {"type": "normal", "normal": True, "ln1": 2, "ln2": 2,
                          "content": " line 2"}  # fmt: skip
    assert changes[3] == {"type": "del", "del": True, "ln": 5, "content": "-line 5"}
    assert changes[4] == {"type": "add", "add": True, "ln": 5, "content": "+line five"}
    assert changes[5] == {"type": "add", "add": True, "ln": 6, "content": "+line 5b"}
    assert changes[6] == {"type": "normal", "normal": True, "ln1": 6, "ln2": 7,
                          "content": " line 6"}  # fmt: skip
    assert tracking.git_diff(old, old) == "" and tracking.parse_diff("") == {"files": []}


def test_no_newline_at_end_and_far_apart_changes() -> None:
    text = tracking.git_diff("a\nb", "a\nc")
    assert text == "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n" + (
        "\\ No newline at end of file\n"
    )
    changes = tracking.parse_diff(text)["files"][0]["chunks"][0]["changes"]
    assert changes[2] == {"type": "del", "del": True, "ln": 2,
                          "content": "\\ No newline at end of file"}  # fmt: skip
    lines = [f"{i}\n" for i in range(30)]
    old = "".join(lines)
    lines[2], lines[25] = "two\n", "twenty-five\n"
    new = "".join(lines)
    assert [c["content"] for c in tracking.parse_diff(tracking.git_diff(old, new))["files"][0][
        "chunks"]] == ["@@ -1,6 +1,6 @@", "@@ -23,7 +23,7 @@"]  # fmt: skip
    assert tracking.json_changes({"a": 1, "b": [1]}, {"a": 1, "b": [2], "c": 0}) == {
        "b": {"previous": [1], "current": [2]}, "c": {"previous": None, "current": 0}}  # fmt: skip


def test_the_format_is_checked() -> None:
    def problems(formats: list[Any], llm: Any = None) -> list[str]:
        found, _ = check_scrape_options(ScrapeOptions(formats=formats), "$", llm=llm)
        return [f"{p['path']}: {p['message']}" for p in found]

    assert problems(["markdown", {"type": "changeTracking", "modes": ["git-diff"]}]) == []
    assert problems(["markdown", "changeTracking"]) == []
    assert problems([{"type": "changeTracking"}]) == [f"$.formats[0]: {tracking.NEEDS_MARKDOWN}"]
    (json_mode,) = problems(["markdown", {"type": "changeTracking", "modes": ["json"]}])
    assert json_mode.startswith("$.formats[1].modes: changeTracking mode 'json' needs an LLM")
    assert problems(["markdown", {"type": "changeTracking", "modes": ["json"]}], Llm()) == []
    assert problems(
        ["markdown", {"type": "changeTracking", "modes": ["x"], "bogus": 1, "tag": 3}]
    ) == [
        "$.formats[1].bogus: unrecognized key",
        "$.formats[1].modes: a list of 'git-diff' and 'json'",
        f"$.formats[1].tag: a string of at most {tracking.MAX_TAG} characters",
    ]


async def test_snapshots_per_tag_survive_a_reopened_store(store_target: Any) -> None:
    spec, tagged = TrackingSpec(modes=("git-diff",)), TrackingSpec(tag="nightly")

    async def scrape(store: Store, spec: TrackingSpec, markdown: str, code: int = 200) -> Any:
        doc = {
            "markdown": markdown,
            "metadata": {"sourceURL": "http://a.test/", "statusCode": code},
        }
        await ChangeTracker(store, lambda: 1_700_000_000_000).apply(None, spec, "u", doc)
        return doc["changeTracking"]

    async with open_store(store_target) as store:
        assert (await scrape(store, spec, "# A\n"))["changeStatus"] == "new"
        assert (await scrape(store, tagged, "# A\n"))["changeStatus"] == "new"  # its own bucket
    async with open_store(store_target) as store:
        again = await scrape(store, spec, "# A\n")
        assert again["changeStatus"] == "same"
        assert again["previousScrapeAt"] == "2023-11-14T22:13:20.000+00:00"
        changed = await scrape(store, spec, "# B\n")
        assert changed["changeStatus"] == "changed" and changed["diff"]["text"] == (
            "@@ -1 +1 @@\n-# A\n+# B\n"
        )
        assert (await scrape(store, tagged, "# A\n"))["changeStatus"] == "same"
        assert (await scrape(store, spec, "gone", 404))["changeStatus"] == "removed"


def page(text: str) -> tuple[bytes, str]:
    html = f"<html><head><title>T</title></head><body><main><h1>Tracked</h1>{text}</main></body>"
    return html.encode() + b"</html>", "text/html"


async def test_a_page_that_changes_between_scrapes(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    site.files["/tracked"] = page("<p>one</p><p>two</p><p>three</p>")
    url = site.url("/tracked")
    fmt = {"type": "changeTracking", "modes": ["git-diff"]}

    async def scrape(**extra: Any) -> dict[str, Any]:
        body = {"url": url, "formats": ["markdown", {**fmt, **extra}]}
        answer = await client.post("/v2/scrape", json=body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["data"])

    first = await scrape()
    assert first["changeTracking"] == {"previousScrapeAt": None, "changeStatus": "new",
                                       "visibility": "visible"}  # fmt: skip
    assert "cacheState" not in first["metadata"] or first["metadata"]["cacheState"] == "miss"
    same = await scrape()
    assert same["changeTracking"]["changeStatus"] == "same"
    assert same["changeTracking"]["previousScrapeAt"].endswith("+00:00")
    assert site.counts["/tracked"] == 2  # never from the cache
    site.files["/tracked"] = page("<p>one</p><p>2</p><p>three</p>")
    changed = (await scrape())["changeTracking"]
    assert changed["changeStatus"] == "changed"
    assert changed["diff"]["text"].startswith("@@ ") and "-two\n+2\n" in changed["diff"]["text"]
    kinds = [c["type"] for c in changed["diff"]["json"]["files"][0]["chunks"][0]["changes"]]
    assert "add" in kinds and "del" in kinds and "normal" in kinds
    assert (await scrape(tag="other"))["changeTracking"]["changeStatus"] == "new"
    assert (await scrape(tag="other"))["changeTracking"]["changeStatus"] == "same"
    del site.files["/tracked"]
    assert (await scrape())["changeTracking"]["changeStatus"] == "removed"
    refused = await client.post("/v2/scrape", json={"url": url, "formats": [fmt]})
    assert refused.status_code == 400 and tracking.NEEDS_MARKDOWN in refused.text
    no_llm = await client.post(
        "/v2/scrape",
        json={"url": url, "formats": ["markdown", {"type": "changeTracking", "modes": ["json"]}]},
    )
    assert no_llm.status_code == 400 and "mode 'json' needs an LLM" in no_llm.text
    zdr = await client.post("/v2/scrape", json={"url": url, "zeroDataRetention": True,
                                                "formats": ["markdown", fmt]})  # fmt: skip
    assert "changeTracking" not in zdr.json()["data"]
    assert zdr.json()["data"]["warning"] == tracking.ZDR_WARNING
    status = (await client.get("/status")).json()["crawl"]["change_tracking"]
    assert status["changed"] == 1 and status["removed"] == 1


async def test_a_nightly_crawl_tells_what_changed(
    client: httpx.AsyncClient, site: SiteSim, fc: Firecrawl, sdk: Any
) -> None:
    from firecrawl.v2.types import ChangeTrackingFormat
    from firecrawl.v2.types import ScrapeOptions as SdkOptions

    body = {
        "url": site.url("/pages/0"),
        "limit": 3,
        "sitemap": "skip",
        "crawlEntireDomain": True,
        "scrapeOptions": {"formats": ["markdown", {"type": "changeTracking", "tag": "n"}]},
    }

    async def crawl() -> list[str]:
        job = (await client.post("/v2/crawl", json=body)).json()["id"]
        assert await wait_finished(client, job) == "completed"
        pages = (await client.get(f"/v2/crawl/{job}")).json()["data"]
        return sorted(p["changeTracking"]["changeStatus"] for p in pages)

    assert await crawl() == ["new", "new", "new"]
    assert await crawl() == ["same", "same", "same"]
    fmt = ChangeTrackingFormat(modes=["git-diff"], tag="sdk")
    doc = await sdk(fc.scrape, site.url("/pages/1"), formats=["markdown", fmt])
    assert doc.change_tracking["changeStatus"] == "new"
    job = await sdk(
        fc.crawl,
        site.url("/pages/0"),
        limit=2,
        crawl_entire_domain=True,
        scrape_options=SdkOptions(formats=["markdown", fmt]),
        poll_interval=1,
    )
    assert {d.change_tracking["changeStatus"] for d in job.data} <= {"new", "same"}


async def test_snapshots_and_cache_survive_a_daemon_restart(
    tmp_path: Path, nursery: trio.Nursery, site: SiteSim
) -> None:
    path = tmp_path / "crawld.toml"
    path.write_text(CONFIG)
    url = site.url("/pages/9")
    tracked = {"url": url, "formats": ["markdown", {"type": "changeTracking", "tag": "r"}]}
    answers = []
    for _ in range(2):
        async with trio.open_nursery() as inner:
            running = await serve_daemon(inner, path)
            service: CrawlService = running.parts["crawl"]
            service.configure(service.config, resolver=host_map_resolver())
            assert running.http_address is not None
            host, port = running.http_address
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", trust_env=False) as c:
                answers.append((await c.post("/v2/scrape", json=tracked)).json()["data"])
                answers.append((await c.post("/v2/scrape", json={"url": url})).json()["data"])
            running.request_stop()
    assert [a["changeTracking"]["changeStatus"] for a in answers[::2]] == ["new", "same"]
    assert [a["metadata"]["cacheState"] for a in answers[1::2]] == ["miss", "hit"]
    assert site.counts["/pages/9"] == 3  # two tracked scrapes, one cache miss
