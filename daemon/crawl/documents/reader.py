# The one object that turns a file into a document: it sniffs nothing (the caller says the format,
# daemon/crawl/documents/sniff.py), reads PDFs' text layers in the content worker processes when
# there are some (daemon/crawl/content/pool.py; a parser crash costs the file, not the daemon),
# else, like office files, in worker threads under the crawl's CPU limiter, and OCRs what needs
# it through the configured backend, at most [ocr] concurrency pages at once over the whole
# daemon, each page and each document bounded in time (a timeout kills the engine's process) and
# its text cached by the file's SHA-256 unless the request asked for zero data retention. Shared
# by scrapes, crawls, batches and /v2/parse.
from __future__ import annotations

import base64
import hashlib
import html
from dataclasses import dataclass, field
from typing import Any

import trio

from daemon.crawl.config import OcrConfig
from daemon.crawl.content.document import plain_formats
from daemon.crawl.content.pool import PagePool, WorkerLost
from daemon.crawl.documents.assemble import join_pages, page_list, page_ranges
from daemon.crawl.documents.errors import OCR_REQUIRED, UNSUPPORTED, DocumentError
from daemon.crawl.documents.ocr import OcrBackend, OcrCache, OcrFailed, backend_for
from daemon.crawl.documents.office import office_markdown
from daemon.crawl.documents.parsers import ParserPlan, PdfParser
from daemon.crawl.documents.pdf import PdfText, read_pdf, read_pdf_of, render_page
from daemon.crawl.documents.sniff import FORMATS, image_size

__all__ = ["DocumentReader", "Parsed"]

IMAGES = frozenset(f.format for f in FORMATS if f.kind == "image")


@dataclass
class Parsed:
    markdown: str
    engine: str
    """metadata.engine: "pdf", "image" or "document"."""
    metadata: dict[str, Any] = field(default_factory=dict)
    pages: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)
    raw: bool = False
    """The markdown is the file in base64 (`parsers` without "pdf")."""

    def formats(self, formats: Any) -> dict[str, Any]:
        """The document's formats (html and rawHtml hold the text escaped for HTML, or the
        base64 as is), `pages` and `warning`; the caller adds `metadata`."""
        shown = self.markdown if self.raw else html.escape(self.markdown)
        document = plain_formats(formats, self.markdown, shown)
        if self.pages is not None:
            document["pages"] = self.pages
        if self.warnings:
            document["warning"] = " ".join(self.warnings)
        return document


class DocumentReader:
    def __init__(
        self,
        config: OcrConfig | None = None,
        cpu: trio.CapacityLimiter | None = None,
        llm: Any = None,
    ) -> None:
        self.cpu = cpu or trio.CapacityLimiter(2)
        self.pool: PagePool | None = None
        """The content workers, for PDF text layers (None: worker threads)."""
        self.llm = llm
        """The daemon's LlmService, for [ocr] engine = "llm"."""
        self.cache = OcrCache(0)
        self.configure(config or OcrConfig())
        self.pages_ocrd = 0

    def configure(self, config: OcrConfig) -> None:
        """New [ocr] settings for documents read from now on."""
        self.config = config
        self.backend: OcrBackend | None = backend_for(config, self.llm)
        self.slots = trio.CapacityLimiter(config.concurrency)
        self.ahead = trio.CapacityLimiter(2 * config.concurrency)
        """Pages rendered or being OCR'd: the next pages render while the engine reads, and at
        most twice `concurrency` page images are in memory."""
        self.cache.max_bytes = config.cache_bytes

    @property
    def ocr(self) -> bool:
        """OCR is served (enabled and its engine installed)."""
        return self.backend is not None

    def status(self) -> dict[str, Any]:
        """The `ocr` part of the crawl's /status section."""
        return {
            "available": self.ocr, "engine": self.config.engine if self.ocr else None,
            "pages_ocrd": self.pages_ocrd, "pages_running": int(self.slots.borrowed_tokens),
            "cached_pages": len(self.cache),
        }  # fmt: skip

    def ocr_off_reason(self) -> str:
        if self.config.enabled is False:
            return "OCR is off ([ocr] enabled = false)"
        if self.config.engine == "llm":
            return 'OCR is not available: [ocr] engine = "llm" and no [llm] provider to ask'
        return "OCR is not available: tesseract is not installed (apt-get install tesseract-ocr)"

    async def parse(self, body: bytes, fmt: str, plan: ParserPlan, *, retain: bool) -> Parsed:
        """The document of `body`, a file of format `fmt`; DocumentError when it has none."""
        if fmt == "pdf":
            if plan.pdf is None:
                return Parsed(base64.b64encode(body).decode("ascii"), "pdf", raw=True)
            return await self._pdf(body, plan.pdf, retain)
        if fmt in IMAGES:
            if not plan.image:
                raise DocumentError.unsupported(
                    'the file is an image and `parsers` does not name "image"'
                )
            return await self._image(body, retain)
        if fmt == "unknown":
            raise DocumentError.unsupported("the file is of a type crawld cannot read")
        markdown = await trio.to_thread.run_sync(office_markdown, body, fmt, limiter=self.cpu)
        return Parsed(markdown, "document")

    async def _read_pdf(self, body: bytes, parser: PdfParser) -> PdfText:
        """The text layer, in a content worker when there are some."""
        if self.pool is None:
            return await trio.to_thread.run_sync(
                lambda: read_pdf(body, parser.max_pages, text=parser.mode != "ocr"),
                limiter=self.cpu,
            )
        try:
            return await self.pool.run(read_pdf_of, body, parser.max_pages, parser.mode != "ocr")
        except WorkerLost:
            raise DocumentError(
                "SCRAPE_ALL_ENGINES_FAILED", "the worker reading the PDF ended before answering"
            ) from None

    async def _pdf(self, body: bytes, parser: PdfParser, retain: bool) -> Parsed:
        text = await self._read_pdf(body, parser)
        pages = text.pages
        missing = text.needs_ocr if parser.mode != "fast" else []
        warnings: list[str] = []
        if parser.mode == "fast" or (missing and self.backend is None):
            blank = [i for i, p in enumerate(pages) if not p]
            why = "mode fast reads only the text layer" if parser.mode == "fast" else (
                self.ocr_off_reason())  # fmt: skip
            if parser.mode == "ocr":
                raise DocumentError(OCR_REQUIRED, f"mode ocr needs OCR: {why}")
            if pages and len(blank) == len(pages):
                raise DocumentError(
                    OCR_REQUIRED, f"the PDF has no text layer (a scan): {why}; "
                    + ("use mode auto or ocr" if parser.mode == "fast" else "enable [ocr]"),
                )  # fmt: skip
            if blank:
                which = (f"pages {page_ranges(blank)} have no text layer and were" if len(blank) > 1
                         else f"page {blank[0] + 1} has no text layer and was")  # fmt: skip
                warnings.append(f"{which} not OCR'd: {why}.")
            missing = []
        if missing:
            found, failures = await self._ocr_pages(body, missing, retain)
            pages = [found.get(i, page) for i, page in enumerate(pages)]
            if failures:
                if not any(p.strip() for p in pages):
                    raise DocumentError(UNSUPPORTED, f"OCR failed: {failures[0]}")
                warnings.append("OCR failed on " + "; ".join(failures[:5]) + ".")
        metadata: dict[str, Any] = {"numPages": len(pages), "totalPages": text.total}
        if text.title:
            metadata["title"] = text.title
        return Parsed(
            join_pages(pages, markers=parser.page_markers), "pdf", metadata,
            page_list(pages) if parser.pages else None, warnings,
        )  # fmt: skip

    async def _image(self, body: bytes, retain: bool) -> Parsed:
        if self.backend is None:
            raise DocumentError(OCR_REQUIRED, f"the file is an image: {self.ocr_off_reason()}")
        size = image_size(body)
        if size is not None and size[0] * size[1] > self.config.max_pixels:
            raise DocumentError(
                UNSUPPORTED, f"the image is {size[0]}x{size[1]} pixels, over [ocr] max_pixels "
                f"({self.config.max_pixels})", 413,
            )  # fmt: skip
        found, failures = await self._ocr_pages(body, [-1], retain)
        if failures:
            raise DocumentError(UNSUPPORTED, f"OCR failed: {failures[0]}")
        markdown = found.get(-1, "")
        warnings = [] if markdown else ["no text was found in the image."]
        return Parsed(markdown, "image", {"numPages": 1, "totalPages": 1}, warnings=warnings)

    async def _ocr_pages(
        self, body: bytes, indexes: list[int], retain: bool
    ) -> tuple[dict[int, str], list[str]]:
        """Text of the pages at `indexes` (-1: `body` is itself an image) and what failed;
        DocumentError SCRAPE_TIMEOUT past [ocr] document_timeout."""
        digest = hashlib.sha256(body).hexdigest()
        found: dict[int, str] = {}
        failures: list[str] = []
        limit = float(self.config.document_timeout)
        try:
            with trio.fail_after(limit):
                async with trio.open_nursery() as nursery:
                    for index in indexes:
                        nursery.start_soon(
                            self._ocr_page, body, index, digest, retain, found, failures
                        )
        except trio.TooSlowError:
            raise DocumentError(
                "SCRAPE_TIMEOUT", f"OCR of the document took longer than {limit:g}s "
                "([ocr] document_timeout)", 408,
            ) from None  # fmt: skip
        return found, sorted(failures)

    async def _ocr_page(
        self, body: bytes, index: int, digest: str, retain: bool,
        found: dict[int, str], failures: list[str],
    ) -> None:  # fmt: skip
        backend = self.backend
        assert backend is not None
        key = (digest, index, backend.identity)
        if retain and (hit := self.cache.get(key)) is not None:
            found[index] = hit
            return
        where = "the image" if index < 0 else f"page {index + 1}"
        config = self.config
        async with self.ahead:
            image = body
            try:
                if index >= 0:
                    image = await trio.to_thread.run_sync(
                        render_page, body, index, config.dpi, config.max_pixels, limiter=self.cpu
                    )
            except Exception as exc:  # PDFium's own error type, or out of memory
                failures.append(f"{where}: cannot be rendered ({type(exc).__name__})")
                return
            async with self.slots:
                try:
                    with trio.fail_after(float(config.page_timeout)):
                        text = await backend.recognize(image)
                except trio.TooSlowError:
                    failures.append(f"{where}: longer than {float(config.page_timeout):g}s")
                    return
                except OcrFailed as exc:
                    failures.append(f"{where}: {exc}")
                    return
        self.pages_ocrd += 1
        found[index] = text
        if retain:
            self.cache.put(key, text)
