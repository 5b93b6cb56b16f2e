"""PDF answers become documents: text per page, title, numPages and totalPages, Firecrawl's
`parsers` (its rules as tables), the size cap, and clear errors for encrypted and broken files.
The PDFs are made by the tests; scanned ones and OCR are tests/crawl/test_documents.py's."""

from __future__ import annotations

import base64
import functools
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import trio

from daemon.crawl.config import CrawlConfig
from daemon.crawl.documents.parsers import ParserPlan, PdfParser, parser_plan, parsers_problems
from daemon.crawl.documents.pdf import read_pdf
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.options.models import BadRequest, ScrapeOptions, parse_scrape
from daemon.crawl.runs.engine import Engine, new_engine
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site
from tests.crawl.pdfs import encrypt_pdf, make_pdf

REPORT = make_pdf(["First page text", "Second page text", "Third page text"], title="Q3 Report")


def test_pdf_text_per_page_title_and_count() -> None:
    text = read_pdf(REPORT, None)
    assert text.total == 3 and text.title == "Q3 Report" and text.needs_ocr == []
    assert ["First page text" in text.pages[0], "Third page text" in text.pages[2]] == [True] * 2
    text = read_pdf(REPORT, 2)
    assert text.total == 3 and len(text.pages) == 2


@pytest.mark.parametrize(
    ("parsers", "plan"),
    [
        (None, ParserPlan()),
        ([], ParserPlan(pdf=None, image=False)),
        (["pdf"], ParserPlan(image=False)),
        (["image"], ParserPlan(pdf=None)),
        (["pdf", {"type": "image"}], ParserPlan()),
        ([{"type": "pdf", "maxPages": 2}], ParserPlan(PdfParser(max_pages=2), image=False)),
        ([{"type": "pdf", "mode": "ocr", "pages": True, "pageMarkers": True}],
         ParserPlan(PdfParser("ocr", pages=True, page_markers=True), image=False)),
        ([{"type": "pdf", "pageMarkdown": True}], ParserPlan(PdfParser(pages=True), image=False)),
        ([{"type": "pdf", "mode": "fast", "blocks": False}],
         ParserPlan(PdfParser("fast"), image=False)),
    ],
)  # fmt: skip
def test_parsers_option(parsers: list[Any] | None, plan: ParserPlan) -> None:
    assert parsers_problems(parsers, "$.parsers") == []
    assert parser_plan(parsers) == plan


@pytest.mark.parametrize(
    ("parsers", "path", "text"),
    [
        (["docx"], "$.parsers[0]", '"pdf", "image"'),
        ([{"type": "pdf", "mode": "turbo"}], "$.parsers[0].mode", "unknown mode 'turbo'"),
        ([{"type": "pdf", "maxPages": 0}], "$.parsers[0].maxPages", "between 1 and 10000"),
        ([{"type": "pdf", "maxPages": True}], "$.parsers[0].maxPages", "between 1 and 10000"),
        ([{"type": "pdf", "pages": "yes"}], "$.parsers[0].pages", "true or false"),
        ([{"type": "pdf", "blocks": True}], "$.parsers[0].blocks", "not served"),
        ([{"type": "pdf", "dpi": 300}], "$.parsers[0].dpi", "unrecognized key"),
        (["pdf", {"type": "image", "mode": "ocr"}], "$.parsers[1].mode", "unrecognized key"),
    ],
)
def test_parsers_problems(parsers: list[Any], path: str, text: str) -> None:
    problems = parsers_problems(parsers, "$.parsers")
    assert problems and problems[0]["path"] == path and text in problems[0]["message"]


def test_bad_parsers_are_a_400() -> None:
    body = {"url": "https://example.com/a.pdf", "parsers": [{"type": "pdf", "maxPages": 0}]}
    with pytest.raises(BadRequest) as info:
        parse_scrape(msgspec.json.encode(body))
    assert info.value.details[0]["path"] == "$.parsers[0].maxPages"


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=5)
    sim.files["/files/report.pdf"] = (REPORT, "application/pdf")
    sim.files["/files/locked.pdf"] = (encrypt_pdf(REPORT), "application/pdf")
    sim.files["/files/broken.pdf"] = (REPORT[: len(REPORT) // 3], "application/pdf")
    sim.files["/files/untyped"] = (REPORT, "")  # no Content-Type at all
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


def engine(max_bytes: int = 1024 * 1024) -> Engine:
    config = CrawlConfig(allow_cidrs=["127.0.0.0/8"], max_bytes=max_bytes)
    return new_engine(config, host_map_resolver())


async def scrape(engine: Engine, url: str, **options: Any) -> dict[str, Any]:
    opts = msgspec.convert(options, ScrapeOptions)
    return (await engine.maker.produce(url, engine.plan(opts))).document


async def test_pdf_url_becomes_a_document(site: SiteSim) -> None:
    doc = await scrape(engine(), site.url("/files/report.pdf"), formats=["markdown", "html"])
    assert doc["markdown"].index("First page text") < doc["markdown"].index("Second page text")
    meta = doc["metadata"]
    assert meta["title"] == "Q3 Report" and meta["numPages"] == 3 and meta["engine"] == "pdf"
    assert meta["totalPages"] == 3 and "pages" not in doc
    assert meta["contentType"] == "application/pdf" and meta["statusCode"] == 200
    doc = await scrape(engine(), site.url("/files/untyped"))  # sniffed by its magic bytes
    assert doc["metadata"]["numPages"] == 3


async def test_max_pages_and_base64(site: SiteSim) -> None:
    doc = await scrape(
        engine(), site.url("/files/report.pdf"), parsers=[{"type": "pdf", "maxPages": 1}]
    )
    assert "First page text" in doc["markdown"] and "Second" not in doc["markdown"]
    doc = await scrape(
        engine(), site.url("/files/report.pdf"), parsers=[], formats=["markdown", "html"]
    )
    assert base64.b64decode(doc["markdown"]) == REPORT == base64.b64decode(doc["html"])


@pytest.mark.parametrize(
    ("path", "code", "text"),
    [
        ("/files/locked.pdf", "SCRAPE_UNSUPPORTED_FILE_ERROR", "encrypted"),
        ("/files/broken.pdf", "SCRAPE_UNSUPPORTED_FILE_ERROR", "cannot be read"),
    ],
)
async def test_encrypted_and_broken_pdfs_fail_clearly(
    site: SiteSim, path: str, code: str, text: str
) -> None:
    with pytest.raises(FetchError) as info:
        await scrape(engine(), site.url(path))
    assert info.value.code == code and text in info.value.message


async def test_pdf_size_cap(site: SiteSim) -> None:
    with pytest.raises(FetchError) as info:
        await scrape(engine(max_bytes=1024), site.url("/files/report.pdf"))
    assert "size cap" in info.value.message
