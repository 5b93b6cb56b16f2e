"""POST /v2/parse and GET /v2/parse/formats through firecrawl-py 4.55 (`parse`,
`get_parse_formats`) and raw multipart: documents of generated files, OCR of scans, the upload
limit apart from [http] max_body, Firecrawl's error bodies for every bad upload, nothing kept with
zeroDataRetention; crawls and scrapes take the same files by URL."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl
from firecrawl.v2.types import PDFParser, ScrapeOptions
from firecrawl.v2.utils.error_handler import FirecrawlError
from PIL import Image

from daemon.app import Daemon
from daemon.crawl.runs.service import CrawlService
from daemon.fakes.site import SiteSim
from tests.crawl import documents as docs
from tests.crawl.conftest import need_tesseract
from tests.crawl.pdfs import encrypt_pdf, make_pdf
from tests.crawlapi.conftest import CONFIG, wait_finished

SCAN = docs.scanned_pdf([["Scanned contract 2211"], ["Signed in Lisbon"]])


@pytest.fixture
def crawl_config() -> str:
    return CONFIG + "[parse]\nmax_bytes = 2500000\n[ocr]\ndpi = 150\n"  # the scans' own dpi


def words(text: str) -> str:
    return " ".join(text.split()).lower()


def big_scan() -> bytes:
    """A scanned PDF over 1.5 MB (noise on pages 2-3 keeps it from compressing)."""
    pages = [docs.text_image(["Big scan first page"])]
    for _ in range(2):
        page = docs.text_image(["noise"])
        page.paste(Image.frombytes("L", (1275, 1200), os.urandom(1275 * 1200)), (0, 400))
        pages.append(page)
    out = io.BytesIO()
    pages[0].save(out, "PDF", resolution=150, save_all=True, append_images=pages[1:])
    return out.getvalue()


async def test_parse_a_scan_with_pages_and_markers(fc: Firecrawl, sdk: Any) -> None:
    need_tesseract()
    parser = PDFParser(mode="auto", pages=True, page_markers=True)
    doc = await sdk(fc.parse, SCAN, options=ScrapeOptions(parsers=[parser]), filename="c.pdf")
    assert "scanned contract 2211" in words(doc.markdown)
    assert "\n\n---\n\n<!-- page 2 -->\n\n" in doc.markdown
    assert [p.page_number for p in doc.pages] == [1, 2] and "Lisbon" in doc.pages[1].markdown
    assert (doc.metadata.num_pages, doc.metadata.total_pages) == (2, 2)


async def test_parse_office_files(fc: Firecrawl, sdk: Any) -> None:
    cases = [
        (docs.docx(["Memo for the board"], [["k", "v"], ["x", "1"]]), "memo.docx", "| x | 1 |"),
        (docs.xlsx({"Q1": [["item", "n"], ["pens", "4"]], "Q2": [["x"]]}), "b.xlsx", "## Q1"),
        (docs.pptx([("Only slide", "presenter note")]), "deck.pptx", "presenter note"),
        (b"a,b\n1,2\n", "t.csv", "| 1 | 2 |"),
        (b"<html><body><h1>Upload page</h1></body></html>", "p.html", "# Upload page"),
    ]
    for data, name, expected in cases:
        doc = await sdk(fc.parse, data, filename=name)
        assert expected in doc.markdown, (name, doc.markdown)


async def test_parse_formats(fc: Firecrawl, sdk: Any, daemon: Daemon) -> None:
    formats = {f.format: f for f in await sdk(fc.get_parse_formats)}
    assert {"pdf", "docx", "xlsx", "pptx", "odt", "rtf", "epub", "csv", "png"} <= set(formats)
    assert formats["docx"].available and ".docx" in formats["docx"].extensions
    service: CrawlService = daemon.parts["crawl"]
    assert formats["png"].available is service.documents.ocr
    assert formats["png"].kind == "image" and "image/png" in formats["png"].mime_types


async def test_an_upload_over_max_body_within_the_parse_limit(fc: Firecrawl, sdk: Any) -> None:
    scan = big_scan()
    assert 1_500_000 < len(scan) < 2_500_000  # [http] max_body is 1 MiB
    need_tesseract()
    opts = ScrapeOptions(parsers=[PDFParser(max_pages=1)])
    doc = await sdk(fc.parse, scan, options=opts, filename="big.pdf")
    assert "big scan first page" in words(doc.markdown)
    assert (doc.metadata.num_pages, doc.metadata.total_pages) == (1, 3)


def upload(data: bytes, name: str = "f.pdf", options: Any = None) -> dict[str, Any]:
    form: dict[str, Any] = {"files": {"file": (name, data, "application/octet-stream")}}
    if options is not None:
        form["data"] = {"options": options if isinstance(options, str) else json.dumps(options)}
    return form


@pytest.mark.parametrize(
    ("form", "status", "text"),
    [
        ({"files": {"attachment": ("a.pdf", b"%PDF-")}}, 400, "Missing file upload"),
        (upload(b"%PDF-1.4", options="{not json"), 400, "JSON object"),
        (upload(make_pdf(["x"]), options={"parsers": [{"type": "pdf", "mode": "turbo"}]}),
         400, "unknown mode 'turbo'"),
        (upload(make_pdf(["x"]), options={"actions": [{"type": "wait", "milliseconds": 1}]}),
         400, "do not support actions"),
        (upload(make_pdf(["x"]), options={"formats": ["screenshot"]}), 400, "screenshot"),
        (upload(make_pdf(["x"]), options={"mobile": True}), 400, "mobile"),
        (upload(b""), 400, "empty"),
        (upload(encrypt_pdf(make_pdf(["x"]))), 422, "encrypted"),
        (upload(make_pdf(["one", "two"])[:150]), 422, "damaged or truncated"),
        (upload(docs.docx(["x"])[:80], "a.docx"), 422, "damaged or truncated"),
        (upload(SCAN, options={"parsers": [{"type": "pdf", "mode": "fast"}]}), 422,
         "no text layer"),
        (upload(b"\x00\x01binary", "blob.bin"), 415, "cannot read"),
        (upload(b"x" * 2_500_001), 413, "exceeds maximum size"),
    ],
)  # fmt: skip
async def test_bad_uploads_get_firecrawls_errors(
    client: httpx.AsyncClient, form: dict[str, Any], status: int, text: str
) -> None:
    answer = await client.post("/v2/parse", **form)
    body = answer.json()
    assert answer.status_code == status, body
    assert body["success"] is False and text in json.dumps(body)
    assert "[crawl.browser] is off" not in json.dumps(body)  # uploads refuse; the browser is on


async def test_json_and_other_bodies(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v2/parse", json={"uploadRef": "abc"})
    assert answer.status_code == 400 and "uploadRef" in answer.json()["error"]
    answer = await client.post("/v2/parse", content=b"x", headers={"content-type": "text/plain"})
    assert answer.status_code == 415
    answer = await client.post("/v2/scrape", files={"file": ("a.pdf", b"x")})
    assert answer.status_code == 415  # multipart only where an upload is expected


async def test_openapi_documents_the_upload(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    upload_op = spec["paths"]["/v2/parse"]["post"]
    form = upload_op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["$ref"].endswith("/ParseForm")
    assert {"200", "400", "408", "413", "415", "422"} <= set(upload_op["responses"])
    assert "available" in json.dumps(spec["components"]["schemas"]["ParseFormatInfo"])
    assert "422" in spec["paths"]["/v2/scrape"]["post"]["responses"]


async def test_the_sdk_refuses_browser_options_itself(fc: Firecrawl, sdk: Any) -> None:
    with pytest.raises(ValueError, match="waitFor"):
        await sdk(fc.parse, make_pdf(["x"]), options=ScrapeOptions(wait_for=100), filename="a.pdf")


async def test_zero_data_retention_keeps_no_ocr(
    fc: Firecrawl, sdk: Any, daemon: Daemon, client: httpx.AsyncClient
) -> None:
    need_tesseract()
    reader = daemon.parts["crawl"].documents
    scan = docs.scanned_pdf([["Retention check"]])
    for _ in range(2):  # firecrawl-py's parse() has no zeroDataRetention: raw multipart
        answer = await client.post("/v2/parse", **upload(scan, options={"zeroDataRetention": True}))
        assert "retention check" in words(answer.json()["data"]["markdown"])
    assert reader.pages_ocrd == 2 and len(reader.cache) == 0
    for _ in range(2):
        await sdk(fc.parse, scan, filename="z.pdf")
    assert reader.pages_ocrd == 3 and len(reader.cache) == 1


async def test_ocr_required_through_scrape(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    site.files["/docs/scan.pdf"] = (SCAN, "application/octet-stream")
    with pytest.raises(FirecrawlError) as info:
        await sdk(fc.scrape, site.url("/docs/scan.pdf"),
                  parsers=[PDFParser(mode="fast")])  # fmt: skip
    assert info.value.status_code == 422 and info.value.code == "SCRAPE_PDF_OCR_REQUIRED"


async def test_a_crawl_reads_office_links_and_records_a_broken_one(
    fc: Firecrawl, sdk: Any, site: SiteSim, client: httpx.AsyncClient
) -> None:
    site.files["/docs/index.html"] = (
        b'<html><body><h1>Docs</h1><a href="/docs/book.xlsx">sheet</a> '
        b'<a href="/docs/deck.pptx">deck</a> <a href="/docs/memo.docx">memo</a> '
        b'<a href="/docs/cut.docx">truncated</a></body></html>',
        "text/html",
    )
    site.files["/docs/book.xlsx"] = (docs.xlsx({"Stock": [["sku", "n"], ["a1", "9"]]}),
                                     "application/octet-stream")  # fmt: skip
    site.files["/docs/deck.pptx"] = (docs.pptx([("Roadmap slide", "say hello")]),
                                     "application/vnd.ms-powerpoint")  # fmt: skip
    site.files["/docs/memo.docx"] = (docs.docx(["Internal memo body"]), "application/msword")
    site.files["/docs/cut.docx"] = (docs.docx(["lost"])[:200], "application/octet-stream")
    answer = await client.post("/v2/crawl", json={
        "url": site.url("/docs/index.html"), "limit": 10, "crawlEntireDomain": True,
        "includePaths": ["^/docs/"]})  # fmt: skip
    job = answer.json()["id"]
    assert await wait_finished(client, job) == "completed"
    data = (await client.get(f"/v2/crawl/{job}")).json()["data"]
    by_path = {d["metadata"]["sourceURL"].split("/", 3)[-1]: d for d in data}
    assert "| a1 | 9 |" in by_path["docs/book.xlsx"]["markdown"]
    assert "say hello" in by_path["docs/deck.pptx"]["markdown"]
    assert "Internal memo body" in by_path["docs/memo.docx"]["markdown"]
    assert by_path["docs/memo.docx"]["metadata"]["engine"] == "document"
    assert len(data) == 4  # the truncated file is an error of its own, the others arrived
    errors = (await client.get(f"/v2/crawl/{job}/errors")).json()["errors"]
    assert [(e["url"].rsplit("/", 1)[-1], e["code"]) for e in errors] == [
        ("cut.docx", "SCRAPE_UNSUPPORTED_FILE_ERROR")
    ]
    assert "damaged or truncated" in errors[0]["error"]


async def test_a_reload_applies_ocr_and_the_upload_limit(
    daemon: Daemon, client: httpx.AsyncClient
) -> None:
    import trio

    service: CrawlService = daemon.parts["crawl"]
    ocr = (await client.get("/status")).json()["crawl"]["ocr"]
    assert ocr["available"] is service.documents.ocr and ocr["engine"] == "tesseract"
    path = trio.Path(daemon.config.source)
    text = await path.read_text()
    text = text.replace("max_bytes = 2500000", "max_bytes = 100000").replace(
        "dpi = 150", "enabled = false"
    )
    await path.write_text(text)
    assert await daemon.reload()
    answer = await client.post("/v2/parse", **upload(b"x" * 100_001, "a.csv"))
    assert answer.status_code == 413 and "100000 bytes" in answer.json()["error"]
    assert len(SCAN) < 100_000
    answer = await client.post("/v2/parse", **upload(SCAN))
    assert answer.status_code == 422 and answer.json()["code"] == "SCRAPE_PDF_OCR_REQUIRED"
    assert "[ocr] enabled = false" in answer.json()["error"]
    formats = (await client.get("/v2/parse/formats")).json()["data"]["formats"]
    assert [f["available"] for f in formats if f["format"] == "png"] == [False]
    assert (await client.get("/status")).json()["crawl"]["ocr"]["available"] is False


async def test_a_blank_text_file_is_a_blank_document(client: httpx.AsyncClient) -> None:
    """One byte of white space is a file (the document's `minLength: 1` holds): a blank text
    document, or a damaged file of the type its name says, never an "empty file" refusal (that
    is a file of no bytes)."""
    answer = await client.post("/v2/parse", files={"file": ("blank.txt", b"\r", "text/plain")})
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["markdown"].strip() == ""
    named = await client.post("/v2/parse", **upload(b"\r"))  # f.pdf: a damaged PDF
    assert named.status_code == 422 and "damaged" in named.text, named.text
