# PDF files in the worker threads: the text layer of each page as markdown (pdf-inspector, MIT:
# Firecrawl's own engine, which keeps tables and columns and says which pages have no usable
# text), pypdf as the fallback reader for what pdf-inspector refuses (a file opened by the empty
# password, a damaged cross-reference table), and pages rendered to grayscale bitmaps for OCR
# (pypdfium2: PDFium, whose binary ships in the wheel). Blocking functions over bytes: the reader
# (daemon/crawl/documents/reader.py) runs the text layer's in a content worker process when there
# are some (a parser crash costs that file, not the daemon), else with trio.to_thread under its
# limiter, and the rendering for OCR with trio.to_thread.
from __future__ import annotations

import io
import logging
import math
import threading
from dataclasses import dataclass

import pdf_inspector

from daemon.crawl.documents.errors import DocumentError

__all__ = ["PdfText", "read_pdf", "read_pdf_of", "render_page"]

logging.getLogger("pypdf").setLevel(logging.ERROR)

_PDFIUM = threading.Lock()
"""PDFium is not thread-safe: one call into it at a time in the process."""


@dataclass
class PdfText:
    total: int
    """Pages in the file."""
    title: str | None
    pages: list[str]
    """Markdown of the text layer of pages 1..len(pages) ("" where there is none)."""
    needs_ocr: list[int]
    """0-based indexes (within `pages`) of the pages whose text layer is missing or unusable."""


def read_pdf(body: bytes, limit: int | None, *, text: bool = True) -> PdfText:
    """The first `limit` pages' text layer (none read when `text` is False: every page is to be
    OCR'd); DocumentError for an empty, encrypted or unreadable file."""
    if not body:  # no bytes; white space alone is a damaged file of its type
        raise DocumentError.empty()
    try:
        detected = pdf_inspector.detect_pdf_bytes(body)
    except ValueError as exc:
        return _pypdf_read(body, limit, text, str(exc))
    total = detected.page_count
    count = total if limit is None else min(total, limit)
    if not text or count == 0:
        return PdfText(total, detected.title, [""] * count, list(range(count)))
    try:
        result = pdf_inspector.extract_pages_markdown_bytes(body, list(range(count)))
    except ValueError as exc:
        return _pypdf_read(body, limit, text, str(exc))
    pages = [""] * count
    needs = set()
    for page in result.pages:
        pages[page.page] = page.markdown.strip()
        if page.needs_ocr or not page.markdown.strip():
            needs.add(page.page)
    return PdfText(total, (detected.title or "").strip() or None, pages, sorted(needs))


def read_pdf_of(body: bytes, limit: int | None, text: bool) -> PdfText:
    """`read_pdf` with positional arguments: what a content worker (pool.py) is sent."""
    return read_pdf(body, limit, text=text)


def _pypdf_read(body: bytes, limit: int | None, text: bool, why: str) -> PdfText:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(body))
        if reader.is_encrypted:
            try:
                opened = bool(reader.decrypt(""))
            except Exception:
                opened = False
            if not opened:
                raise DocumentError.encrypted("PDF")
        total = len(reader.pages)
        count = total if limit is None else min(total, limit)
        pages = [
            (reader.pages[i].extract_text() or "").strip() if text else "" for i in range(count)
        ]
        info = reader.metadata
        title = str(info.title).strip() or None if info is not None and info.title else None
    except DocumentError:
        raise
    except Exception as exc:
        raise DocumentError.damaged("PDF", f"{why}; {type(exc).__name__}: {exc}") from None
    return PdfText(total, title, pages, [i for i, p in enumerate(pages) if not p])


def render_page(body: bytes, index: int, dpi: int, max_pixels: int) -> bytes:
    """Page `index` (0-based) as a grayscale PGM image at `dpi` (lower when the page would be
    over `max_pixels`), the input the OCR engine reads."""
    import pypdfium2

    with _PDFIUM:
        document = pypdfium2.PdfDocument(body)
        try:
            page = document[index]
            width, height = page.get_size()
            scale = dpi / 72
            if width * height * scale * scale > max_pixels:
                scale = math.sqrt(max_pixels / (width * height))
            bitmap = page.render(scale=scale, grayscale=True)
            w, h, stride = bitmap.width, bitmap.height, bitmap.stride
            raw = bytes(bitmap.buffer)
            page.close()
        finally:
            document.close()
    rows = raw if stride == w else b"".join(raw[y * stride : y * stride + w] for y in range(h))
    return b"P5\n%d %d\n255\n" % (w, h) + rows
