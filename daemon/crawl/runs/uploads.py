# A file uploaded to POST /v2/parse made a document with the same engine as a page fetched by URL:
# the documents room reads PDFs, images and office files; anything else (HTML, text) goes through
# the page pipeline as if it had been fetched. Nothing of the upload is kept: the document cache is
# neither read nor written (Firecrawl's "parse is always uncached") and with zeroDataRetention the
# OCR cache is not used either; the bytes live only as long as the request.
from __future__ import annotations

import math
import uuid
from typing import Any

import trio

from daemon.crawl.content.document import with_fetch_metadata
from daemon.crawl.documents.errors import DocumentError
from daemon.crawl.documents.sniff import document_kind
from daemon.crawl.fetching.fetch import FetchError, FetchResult
from daemon.crawl.options import llm_formats
from daemon.crawl.options.parse_options import ParseRequest
from daemon.crawl.runs.engine import Engine

__all__ = ["parse_upload"]


async def parse_upload(
    engine: Engine, body: bytes, filename: str, content_type: str, request: ParseRequest
) -> dict[str, Any]:
    """The document of an uploaded file; DocumentError for a file that has none, FetchError
    SCRAPE_TIMEOUT past the options' `timeout` (without one, OCR is bounded by [ocr]
    document_timeout alone: there is no fetch for [crawl] page_timeout to bound)."""
    plan = engine.plan(request.options, zero_data_retention=True)
    given = request.options.timeout
    timeout = given / 1000 if given is not None else math.inf
    maker = engine.maker
    try:
        with trio.fail_after(timeout):
            kind = document_kind(content_type, body, filename)
            result = FetchResult(requested_url=filename, url=filename, status_code=200,
                                 content_type=content_type, headers={}, body=body)  # fmt: skip
            if kind is None:
                if not body:  # white space alone is a (blank) text document
                    raise DocumentError.empty()
                document, _ = await engine.document(result, plan.doc, filename)
                document["metadata"]["engine"] = "http"
            else:
                parsed = await maker.documents.parse(
                    body, kind, plan.parsers, retain=not request.zeroDataRetention
                )
                document = parsed.formats(plan.doc.formats)
                document["metadata"] = with_fetch_metadata(
                    parsed.metadata, filename, filename, 200, content_type, str(uuid.uuid4())
                )
                document["metadata"]["engine"] = parsed.engine
            if plan.llm is not None and maker.llm is not None:
                await llm_formats.apply(maker.llm, plan.llm, document)
    except trio.TooSlowError:
        raise FetchError(
            "SCRAPE_TIMEOUT", f"parsing the file took longer than {timeout:g}s", filename
        ) from None
    return document
