# PDF answers become documents: the text of each page as markdown (a `## Page n` heading per
# page, as Firecrawl's PDF engine separates pages), `title` and `numPages` in the metadata.
# pypdf (BSD-3-Clause, pure Python, maintained) reads the file; pypdfium2 (Apache-2.0/BSD-3,
# PDFium) extracts text faster but ships a 6 MB native library and the text layout of plain
# reports is the same, so the dependency stays small. Pure functions over bytes: the crawl engine
# calls them in a worker thread (a large PDF takes a while) under the fetcher's size cap.
from __future__ import annotations

import base64
import html
import io
import logging
from typing import Any

import msgspec

from daemon.crawl.content.document import plain_formats, with_fetch_metadata

__all__ = ["PdfError", "PdfOptions", "is_pdf", "pdf_document"]

# pypdf warns on the log for every slightly malformed object; they are not ours to fix.
logging.getLogger("pypdf").setLevel(logging.ERROR)


class PdfError(Exception):
    """The file cannot be turned into text: `code` is Firecrawl's, `message` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class PdfOptions(msgspec.Struct, frozen=True):
    parse: bool = True
    """False (`parsers: []`): the document is the file as base64, as Firecrawl returns it."""
    max_pages: int | None = None


def pdf_options(parsers: list[Any] | None) -> PdfOptions:
    """Firecrawl's `parsers`: absent → parse; `[]` → base64; `[{type: "pdf", maxPages}]` or
    `["pdf"]` → parse, at most maxPages pages."""
    if parsers is None:
        return PdfOptions()
    for parser in parsers:
        if parser == "pdf":
            return PdfOptions()
        if isinstance(parser, dict) and parser.get("type") == "pdf":
            pages = parser.get("maxPages")
            return PdfOptions(max_pages=pages if isinstance(pages, int) else None)
    return PdfOptions(parse=False)


def parsers_problems(parsers: list[Any] | None, path: str) -> list[dict[str, Any]]:
    problems = []
    for i, parser in enumerate(parsers or []):
        where = f"{path}[{i}]"
        if parser == "pdf":
            continue
        if not isinstance(parser, dict) or parser.get("type") != "pdf":
            problems.append({"path": where, "message": 'the only parser is "pdf"'})
            continue
        extra = set(parser) - {"type", "maxPages"}
        pages = parser.get("maxPages")
        if extra:
            problems.append({"path": f"{where}.{sorted(extra)[0]}", "message": "unrecognized key"})
        elif pages is not None and (type(pages) is not int or not 1 <= pages <= 10_000):
            problems.append({"path": f"{where}.maxPages", "message": "between 1 and 10000"})
    return problems


def is_pdf(content_type: str, body: bytes) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/pdf" or (kind == "" and
                                         body[:5] == b"%PDF-")  # fmt: skip


def pdf_document(body: bytes, options: PdfOptions) -> tuple[str, dict[str, Any]]:
    """(markdown, metadata additions) of a PDF; PdfError for an encrypted or broken file."""
    if not options.parse:
        return base64.b64encode(body).decode("ascii"), {}
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(body))
        if reader.is_encrypted:
            # An empty user password opens many "protected" files (print/copy restrictions).
            try:
                opened = bool(reader.decrypt(""))
            except Exception:
                opened = False
            if not opened:
                raise PdfError(
                    "SCRAPE_UNSUPPORTED_FILE_ERROR", "the PDF is encrypted with a password"
                )
        pages = reader.pages
        count = len(pages)
        limit = count if options.max_pages is None else min(count, options.max_pages)
        parts = []
        for number in range(limit):
            text = (pages[number].extract_text() or "").strip()
            parts.append(f"## Page {number + 1}\n\n{text}" if count > 1 else text)
        title = None
        info = reader.metadata
        if info is not None and info.title:
            title = str(info.title).strip() or None
    except PdfError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise PdfError(
            "SCRAPE_UNSUPPORTED_FILE_ERROR", f"the PDF cannot be read: {exc}"[:300]
        ) from None
    metadata: dict[str, Any] = {"numPages": count}
    if title:
        metadata["title"] = title
    return "\n\n".join(p for p in parts if p), metadata


def pdf_page(
    body: bytes,
    pdf: PdfOptions,
    formats: frozenset[str],
    *,
    url: str,
    source_url: str,
    status_code: int,
    content_type: str,
    scrape_id: str,
) -> dict[str, Any]:
    """The Firecrawl document of a PDF answer (markdown; html and rawHtml hold the text escaped
    for HTML, or with `parsers: []` all three hold the file as base64, as Firecrawl's)."""
    text, metadata = pdf_document(body, pdf)
    document = plain_formats(formats, text, text if not pdf.parse else html.escape(text))
    document["metadata"] = with_fetch_metadata(
        metadata, source_url, url, status_code, content_type, scrape_id
    )
    return document
