"""Files by URL become documents through the page pipeline: scanned PDFs OCR'd (mode fast is
SCRAPE_PDF_OCR_REQUIRED, auto OCRs only the pages without text, ocr every page), maxPages /
pages / pageMarkers, images OCR'd as one-page scans, office files converted, all sniffed from
their bytes when the Content-Type lies. Every file is generated here with known text."""

from __future__ import annotations

import functools
import io
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import trio
from pypdf import PdfReader, PdfWriter

from daemon.crawl.config import CrawlConfig, OcrConfig
from daemon.crawl.documents.reader import DocumentReader
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.options.models import ScrapeOptions
from daemon.crawl.runs.engine import Engine, new_engine
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site
from tests.crawl import documents as docs
from tests.crawl.conftest import need_tesseract
from tests.crawl.pdfs import make_pdf

SCAN = docs.scanned_pdf([["Scanned invoice 4711"], ["Delivery note for Berlin"]])
TEXT4 = make_pdf(["Alpha page text", "Beta page text", "Gamma page text", "Delta page text"])


def mixed_pdf() -> bytes:
    """Page 1 with a text layer, page 2 a scan, page 3 with a text layer."""
    writer = PdfWriter()
    text = PdfReader(io.BytesIO(make_pdf(["Native first page", "Native third page"])))
    scan = PdfReader(io.BytesIO(docs.scanned_pdf([["Scanned middle page"]])))
    for page in (text.pages[0], scan.pages[0], text.pages[1]):
        writer.add_page(page)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


FILES: dict[str, tuple[bytes, str]] = {
    "/f/scan.pdf": (SCAN, "application/pdf"),
    "/f/four.pdf": (TEXT4, "application/pdf"),
    "/f/mixed.pdf": (mixed_pdf(), "application/octet-stream"),
    "/f/sign.png": (docs.image_bytes(["Opening hours nine to five"]), "image/png"),
    "/f/sign.jpg": (docs.image_bytes(["Opening hours nine to five"], "JPEG"), "image/jpeg"),
    "/f/sign.webp": (docs.image_bytes(["Opening hours nine to five"], "WEBP"), "image/webp"),
    "/f/sign.tiff": (docs.image_bytes(["Opening hours nine to five"], "TIFF"), "image/tiff"),
    "/f/memo.docx": (docs.docx(["Quarterly memo text"], [["region", "sales"], ["north", "12"]]),
                     "application/octet-stream"),
    "/f/book.xlsx": (docs.xlsx({"Fruits": [["name", "qty"], ["apple", "3"]],
                                "Totals": [["sum", "3"]]}), "text/html"),
    "/f/deck.pptx": (docs.pptx([("First slide title", "first speaker note"),
                                ("Second slide title", "second speaker note")]),
                     "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
    "/f/sheets.ods": (docs.ods({"North": [["a", "b"], ["1", "2"]], "South": [["c"], ["3"]]}),
                      "application/octet-stream"),
    "/f/talk.odp": (docs.odp(["First odp slide", "Second odp slide"]), "application/octet-stream"),
    "/f/letter.odt": (docs.odt(["Open document letter"]), "application/vnd.oasis.opendocument.text"),
    "/f/note.rtf": (docs.rtf(["Rich text note"]), "application/rtf"),
    "/f/novel.epub": (docs.epub("A Novel", ["Chapter one begins"]), "application/epub+zip"),
    "/f/table.csv": (b"city,people\nOslo,700000\n", "text/csv"),
    "/f/data.csv": (b"city,people\nBergen,290000\n", "application/octet-stream"),
    "/f/broken.docx": (docs.docx(["x"])[:60], "application/octet-stream"),
    "/f/empty.pdf": (b"", "application/pdf"),
    "/f/cut.pdf": (TEXT4[:150], "application/pdf"),
}  # fmt: skip


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=3)
    sim.files.update(FILES)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


def engine(ocr: OcrConfig | None = None) -> Engine:
    config = CrawlConfig(allow_cidrs=["127.0.0.0/8"], max_bytes=4 * 1024 * 1024)
    made = new_engine(config, host_map_resolver())
    made.maker.documents = DocumentReader(ocr or OcrConfig(), made.cpu)
    return made


async def scrape(made: Engine, url: str, **options: Any) -> dict[str, Any]:
    opts = msgspec.convert(options, ScrapeOptions)
    return (await made.maker.produce(url, made.plan(opts))).document


def words(text: str) -> str:
    return " ".join(text.split()).lower()


async def test_fast_mode_on_a_scan_is_ocr_required(site: SiteSim) -> None:
    with pytest.raises(FetchError) as info:
        await scrape(engine(), site.url("/f/scan.pdf"), parsers=[{"type": "pdf", "mode": "fast"}])
    assert info.value.code == "SCRAPE_PDF_OCR_REQUIRED" and "mode auto or ocr" in info.value.message


async def test_scan_is_ocrd_in_auto_mode(site: SiteSim) -> None:
    need_tesseract()
    doc = await scrape(engine(), site.url("/f/scan.pdf"), parsers=[{"type": "pdf", "pages": True}])
    text = words(doc["markdown"])
    assert "scanned invoice 4711" in text and "delivery note for berlin" in text
    assert [p["pageNumber"] for p in doc["pages"]] == [1, 2]
    assert "4711" in doc["pages"][0]["markdown"] and "Berlin" in doc["pages"][1]["markdown"]
    meta = doc["metadata"]
    assert meta["numPages"] == 2 and meta["totalPages"] == 2 and meta["engine"] == "pdf"


async def test_auto_keeps_text_pages_word_for_word_and_ocrs_the_others(site: SiteSim) -> None:
    need_tesseract()
    made = engine()
    doc = await scrape(made, site.url("/f/mixed.pdf"),
                       parsers=[{"type": "pdf", "pages": True, "pageMarkers": True}])  # fmt: skip
    pages = [p["markdown"] for p in doc["pages"]]
    native = made.maker.documents
    assert native.pages_ocrd == 1  # only the scanned page
    assert "Native first page" in pages[0] and "Native third page" in pages[2]
    assert "scanned middle page" in words(pages[1])
    fast = await scrape(made, site.url("/f/mixed.pdf"),
                        parsers=[{"type": "pdf", "mode": "fast", "pages": True}])  # fmt: skip
    text_layer = [p["markdown"] for p in fast["pages"]]
    assert (pages[0], pages[2]) == (text_layer[0], text_layer[2])  # the text layer, word for word
    assert doc["markdown"] == (
        f"{pages[0]}\n\n---\n\n<!-- page 2 -->\n\n{pages[1]}\n\n---\n\n<!-- page 3 -->\n\n{pages[2]}"
    )


async def test_fast_mode_on_a_mixed_pdf_names_the_pages_without_text(site: SiteSim) -> None:
    doc = await scrape(
        engine(), site.url("/f/mixed.pdf"), parsers=[{"type": "pdf", "mode": "fast"}]
    )
    assert "Native first page" in doc["markdown"] and "Native third page" in doc["markdown"]
    assert doc["warning"] == (
        "page 2 has no text layer and was not OCR'd: mode fast reads only the text layer."
    )


async def test_max_pages_and_markers_of_a_text_pdf(site: SiteSim) -> None:
    doc = await scrape(engine(), site.url("/f/four.pdf"),
                       parsers=[{"type": "pdf", "maxPages": 2, "pageMarkers": True}])  # fmt: skip
    meta = doc["metadata"]
    assert meta["numPages"] == 2 and meta["totalPages"] == 4
    assert "Beta page text" in doc["markdown"] and "Gamma" not in doc["markdown"]
    assert (
        doc["markdown"].count("<!-- page") == 1
        and "\n\n---\n\n<!-- page 2 -->\n\n" in doc["markdown"]
    )
    assert not doc["markdown"].startswith("---")


async def test_ocr_mode_reads_every_page_and_caches_by_hash(site: SiteSim) -> None:
    need_tesseract()
    made = engine()
    options = {"parsers": [{"type": "pdf", "mode": "ocr", "maxPages": 1}], "maxAge": 0}
    doc = await scrape(made, site.url("/f/four.pdf"), **options)
    assert "alpha page text" in words(doc["markdown"]) and made.maker.documents.pages_ocrd == 1
    await scrape(made, site.url("/f/four.pdf"), **options)
    assert made.maker.documents.pages_ocrd == 1  # the same file: from the cache


@pytest.mark.parametrize("path", ["/f/sign.png", "/f/sign.jpg", "/f/sign.webp", "/f/sign.tiff"])
async def test_images_are_ocrd_as_one_page_scans(site: SiteSim, path: str) -> None:
    need_tesseract()
    doc = await scrape(engine(), site.url(path), formats=["markdown", "html"])
    assert "opening hours nine to five" in words(doc["markdown"])
    assert doc["metadata"]["engine"] == "image" and doc["metadata"]["numPages"] == 1


@pytest.mark.parametrize("parsers", [["image"], [{"type": "image"}], ["pdf", "image"]])
async def test_the_image_parser_named_either_way_ocrs_images(site: SiteSim, parsers: list) -> None:
    need_tesseract()
    doc = await scrape(engine(), site.url("/f/sign.png"), parsers=parsers)
    assert "opening hours nine to five" in words(doc["markdown"])
    assert doc["metadata"]["engine"] == "image" and doc["metadata"]["numPages"] == 1


async def test_image_without_the_image_parser_is_unsupported(site: SiteSim) -> None:
    with pytest.raises(FetchError) as info:
        await scrape(engine(), site.url("/f/sign.png"), parsers=["pdf"])
    assert info.value.code == "SCRAPE_UNSUPPORTED_FILE_ERROR" and "image" in info.value.message


async def test_ocr_off_is_said_not_an_empty_success(site: SiteSim) -> None:
    made = engine(OcrConfig(enabled=False))
    for path in ("/f/scan.pdf", "/f/sign.png"):
        with pytest.raises(FetchError) as info:
            await scrape(made, site.url(path))
        assert info.value.code == "SCRAPE_PDF_OCR_REQUIRED" and "[ocr]" in info.value.message
    with pytest.raises(FetchError) as info:
        await scrape(made, site.url("/f/four.pdf"), parsers=[{"type": "pdf", "mode": "ocr"}])
    assert info.value.message == "mode ocr needs OCR: OCR is off ([ocr] enabled = false)"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/f/memo.docx", ["Quarterly memo text", "| region | sales |", "| north | 12 |"]),
        ("/f/book.xlsx", ["## Fruits", "| apple | 3 |", "## Totals"]),
        ("/f/deck.pptx", ["First slide title", "first speaker note", "Second slide title"]),
        ("/f/letter.odt", ["Open document letter"]),
        ("/f/sheets.ods", ["## North", "| 1 | 2 |", "## South", "| 3 |"]),
        ("/f/talk.odp", ["First odp slide\n\nSecond odp slide"]),
        ("/f/note.rtf", ["Rich text note"]),
        ("/f/novel.epub", ["A Novel", "Chapter one begins"]),
        ("/f/table.csv", ["| city | people |", "| Oslo | 700000 |"]),
        ("/f/data.csv", ["| Bergen | 290000 |"]),
    ],
)
async def test_office_documents_become_markdown(
    site: SiteSim, path: str, expected: list[str]
) -> None:
    doc = await scrape(engine(OcrConfig(enabled=False)), site.url(path))
    for text in expected:
        assert text in doc["markdown"], (text, doc["markdown"])
    assert doc["metadata"]["engine"] == "document"
    if path == "/f/deck.pptx":
        md = doc["markdown"]
        assert md.index("First slide") < md.index("first speaker") < md.index("Second slide")


@pytest.mark.parametrize(
    ("path", "text"),
    [("/f/broken.docx", "damaged or truncated"), ("/f/cut.pdf", "damaged or truncated"),
     ("/f/empty.pdf", "the file is empty")],
)  # fmt: skip
async def test_a_truncated_or_empty_file_names_the_problem(
    site: SiteSim, path: str, text: str
) -> None:
    with pytest.raises(FetchError) as info:
        await scrape(engine(), site.url(path))
    assert info.value.code == "SCRAPE_UNSUPPORTED_FILE_ERROR"
    assert text in info.value.message
