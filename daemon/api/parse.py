# POST /v2/parse and GET /v2/parse/formats: files uploaded as multipart/form-data (`file` and an
# `options` JSON string, as firecrawl-py's parse() and firecrawl-mcp's firecrawl_parse send them)
# made documents by the crawl service's engine. The edge lets multipart through on this path only,
# with [parse] max_bytes (plus room for the form's framing) instead of [http] max_body; the file's
# own size is checked here so the answer is Firecrawl's. Every error is Firecrawl's
# `{success: false, code, error}`. Starlette parses the form (python-multipart): a file part past
# 1 MiB is spooled to an anonymous temporary file, gone when the form is closed at the answer.
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, json
from daemon.api.crawl import bad_request, firecrawl_error, scrape_deployment, scrape_failure
from daemon.crawl.documents.errors import DocumentError
from daemon.crawl.documents.sniff import FORMATS
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.metrics import scrapes
from daemon.crawl.options import responses
from daemon.crawl.options.parse_options import ParseOptions, parse_options
from daemon.crawl.problems import BadRequest
from daemon.crawl.runs.service import CrawlService

FORM_OVERHEAD = 1024 * 1024
"""Bytes of a multipart body beyond the file: the options part, boundaries, part headers."""
MISSING_FILE = ("Missing file upload. Send multipart/form-data with a 'file' field, or JSON with "
                "an 'uploadRef'.")  # fmt: skip


class ParseForm(msgspec.Struct):
    """The multipart/form-data body of POST /v2/parse."""

    file: Annotated[str, Meta(extra_json_schema={"format": "binary", "minLength": 1})]
    """The file (binary part, with its file name and Content-Type), not empty."""
    options: ParseOptions = msgspec.field(default_factory=ParseOptions)
    """Scrape options as a JSON part, less the browser's (actions, waitFor, location, mobile,
    screenshot, changeTracking, branding, audio, video)."""


class ParseFormatInfo(msgspec.Struct):
    format: str
    kind: str
    extensions: list[str]
    mimeTypes: list[str]
    available: bool


class ParseFormatListData(msgspec.Struct):
    formats: list[ParseFormatInfo]


class ParseFormatList(msgspec.Struct):
    success: bool
    data: ParseFormatListData


def too_large(limit: int) -> Response:
    size = f"{limit // (1024 * 1024)}MB" if limit % (1024 * 1024) == 0 else f"{limit} bytes"
    return firecrawl_error(413, f"Uploaded file exceeds maximum size of {size}.", "BAD_REQUEST")


class ParseHandlers:
    def __init__(self, service: CrawlService) -> None:
        self.service = service

    def body_limit(self) -> int:
        return self.service.parse_config.max_bytes + FORM_OVERHEAD

    async def parse(self, request: Request) -> Response:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "multipart/form-data":
            detail = MISSING_FILE
            if media == "application/json":
                detail += " crawld takes no uploadRef: send the file itself as multipart."
            return firecrawl_error(400, detail, "BAD_REQUEST")
        limit = self.service.parse_config.max_bytes
        try:
            form = await request.form(max_files=1, max_fields=16, max_part_size=FORM_OVERHEAD)
        except HTTPException as exc:
            return firecrawl_error(400, f"the multipart body cannot be read: {exc.detail}",
                                   "BAD_REQUEST")  # fmt: skip
        try:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                return firecrawl_error(400, MISSING_FILE, "BAD_REQUEST")
            if upload.size is not None and upload.size > limit:
                return too_large(limit)
            body = await upload.read(limit + 1)
            if len(body) > limit:
                return too_large(limit)
            options = form.get("options")
            return await self._parsed(body, upload, options if isinstance(options, str) else None)
        finally:
            await form.close()

    async def _parsed(self, body: bytes, upload: UploadFile, options: str | None) -> Response:
        try:
            raw = msgspec.json.decode(options) if options and options.strip() else {}
            if not isinstance(raw, dict):
                raise ValueError
        except (msgspec.DecodeError, ValueError):
            return firecrawl_error(400, "options must be a JSON object (a string of JSON)",
                                   "BAD_REQUEST")  # fmt: skip
        try:
            parsed = parse_options(raw, llm=self.service.llm)
        except BadRequest as exc:
            return bad_request(exc)
        if not body:
            return firecrawl_error(400, "the uploaded file is empty", "BAD_REQUEST")
        name = (upload.filename or "upload").strip() or "upload"
        content_type = upload.content_type or ""
        try:
            document = await self.service.parse_file(body, name, content_type, parsed)
        except DocumentError as exc:
            scrapes.labels(exc.code).inc()
            return firecrawl_error(exc.status, exc.message, exc.code)
        except FetchError as exc:
            scrapes.labels(exc.code).inc()
            return scrape_failure(exc)
        scrapes.labels("ok").inc()
        warning = " ".join(w for w in (parsed.warning, document.pop("warning", "")) if w)
        return json(responses.ScrapeResponse(success=True, data=document, warning=warning or None))

    async def formats(self, request: Request) -> Response:
        documents = self.service.documents
        vision = documents.config.engine == "llm"  # a vision model takes no TIFF
        items = [
            ParseFormatInfo(format=f.format, kind=f.kind, extensions=list(f.extensions),
                            mimeTypes=list(f.mime_types),
                            available=f.kind != "image" or (documents.ocr and not (
                                vision and f.format == "tiff")))
            for f in FORMATS
        ]  # fmt: skip
        return json(ParseFormatList(success=True, data=ParseFormatListData(formats=items)))


def routes(service: CrawlService) -> list[ApiRoute]:
    h = ParseHandlers(service)
    errors: dict[int, Any] = {
        400: "BAD_REQUEST: no `file` part, options not JSON, an unknown option or mode, a "
             "browser-only option, an empty file",
        408: "SCRAPE_TIMEOUT: parsing (OCR) took longer than the options' timeout",
        413: "the file is over [parse] max_bytes",
        415: "SCRAPE_UNSUPPORTED_FILE_ERROR: a file crawld cannot read (or an image without "
             "the image parser); or a body that is neither multipart nor JSON",
        422: "SCRAPE_PDF_OCR_REQUIRED (a scan with mode fast, or OCR off) or "
             "SCRAPE_UNSUPPORTED_FILE_ERROR: encrypted, damaged or truncated file",
    }  # fmt: skip
    return [
        ApiRoute("POST", "/v2/parse", h.parse,
                 "Parse an uploaded file (PDF, image, docx, xlsx, pptx, odt, rtf, epub, csv, "
                 "html) into a document; nothing of it is kept",
                 body=ParseForm, body_required=True, response=responses.ScrapeResponse,
                 errors=errors, upload_limit=h.body_limit,
                 encoding={"options": {"contentType": "application/json"}},
                 deployment=scrape_deployment(service)),
        ApiRoute("GET", "/v2/parse/formats", h.formats,
                 "The file formats /v2/parse reads, `available` on this deployment",
                 response=ParseFormatList),
    ]  # fmt: skip
