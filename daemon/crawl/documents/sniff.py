# What kind of file a body is, from its bytes first: servers often send office files and PDFs as
# application/octet-stream (or as text/html), so the magic bytes decide, then the Content-Type,
# then the URL's extension (CSV has no signature). Pure functions over bytes and strings; the
# table of formats is also what GET /v2/parse/formats lists.
from __future__ import annotations

from typing import Literal

import msgspec
from anydoc._anydoc import format_from_bytes

__all__ = ["FORMATS", "DocFormat", "document_kind", "extension", "image_size", "media_type"]

Kind = Literal["document", "image"]


class DocFormat(msgspec.Struct, frozen=True):
    format: str
    """Firecrawl's name; for office files also the converter's."""
    kind: Kind
    extensions: tuple[str, ...]
    mime_types: tuple[str, ...]


_OOXML = "application/vnd.openxmlformats-officedocument."
_ODF = "application/vnd.oasis.opendocument."
FORMATS = (
    DocFormat("pdf", "document", (".pdf",), ("application/pdf",)),
    DocFormat("docx", "document", (".docx", ".docm"),
              (_OOXML + "wordprocessingml.document",
               "application/vnd.ms-word.document.macroEnabled.12")),
    DocFormat("doc", "document", (".doc",), ("application/msword",)),
    DocFormat("odt", "document", (".odt",), (_ODF + "text",)),
    DocFormat("rtf", "document", (".rtf",), ("application/rtf", "text/rtf")),
    DocFormat("xlsx", "document", (".xlsx", ".xlsm", ".xls", ".xlsb"),
              (_OOXML + "spreadsheetml.sheet", "application/vnd.ms-excel",
               "application/vnd.ms-excel.sheet.macroEnabled.12")),
    DocFormat("ods", "document", (".ods",), (_ODF + "spreadsheet",)),
    DocFormat("pptx", "document", (".pptx", ".pptm", ".ppsx"),
              (_OOXML + "presentationml.presentation",)),
    DocFormat("ppt", "document", (".ppt",), ("application/vnd.ms-powerpoint",)),
    DocFormat("odp", "document", (".odp",), (_ODF + "presentation",)),
    DocFormat("epub", "document", (".epub",), ("application/epub+zip",)),
    DocFormat("csv", "document", (".csv",), ("text/csv",)),
    DocFormat("html", "document", (".html", ".htm"), ("text/html",)),
    DocFormat("png", "image", (".png",), ("image/png",)),
    DocFormat("jpeg", "image", (".jpg", ".jpeg"), ("image/jpeg",)),
    DocFormat("webp", "image", (".webp",), ("image/webp",)),
    DocFormat("tiff", "image", (".tif", ".tiff"), ("image/tiff",)),
)  # fmt: skip
"""Every format crawld reads (`html` is the ordinary page pipeline)."""

_BY_MIME = {mime: f.format for f in FORMATS for mime in f.mime_types}
_BY_EXTENSION = {ext: f.format for f in FORMATS for ext in f.extensions}
_IMAGES = frozenset(f.format for f in FORMATS if f.kind == "image")
_CONTAINERS = (b"PK\x03\x04", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")
_UNTYPED = frozenset({"", "application/octet-stream", "binary/octet-stream",
                      "application/x-download", "application/download", "application/zip",
                      "application/x-zip-compressed", "application/force-download"})  # fmt: skip


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def extension(url_or_name: str) -> str:
    """The lower-case extension (with its dot) of a URL's path or a file name, or ""."""
    path = url_or_name.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[-1]
    return "." + path.rsplit(".", 1)[1].lower() if "." in path else ""


def image_format(body: bytes) -> str | None:
    if body.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if body.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if body[:4] == b"RIFF" and body[8:12] == b"WEBP":
        return "webp"
    if body[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


def image_size(body: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, JPEG or WebP header, before anything decodes the pixels;
    None when the header does not say (TIFF, a damaged file)."""
    if body.startswith(b"\x89PNG\r\n\x1a\n") and body[12:16] == b"IHDR":
        return int.from_bytes(body[16:20], "big"), int.from_bytes(body[20:24], "big")
    if body.startswith(b"\xff\xd8"):
        return _jpeg_size(body)
    if body[:4] == b"RIFF" and body[8:12] == b"WEBP":
        chunk = body[12:16]
        if chunk == b"VP8X" and len(body) >= 30:
            return 1 + int.from_bytes(body[24:27], "little"), 1 + int.from_bytes(
                body[27:30], "little"
            )
        if chunk == b"VP8 " and len(body) >= 30:
            return (int.from_bytes(body[26:28], "little") & 0x3FFF,
                    int.from_bytes(body[28:30], "little") & 0x3FFF)  # fmt: skip
        if chunk == b"VP8L" and len(body) >= 25:
            bits = int.from_bytes(body[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    return None


def _jpeg_size(body: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 < len(body):
        if body[i] != 0xFF:
            return None
        marker = body[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        length = int.from_bytes(body[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height = int.from_bytes(body[i + 5 : i + 7], "big")
            return int.from_bytes(body[i + 7 : i + 9], "big"), height
        i += 2 + length
    return None


def document_kind(content_type: str, body: bytes, name: str) -> str | None:
    """The format of `body` (a FORMATS name other than html, or "unknown" for a binary file
    crawld cannot read), or None for a page the HTML/text pipeline takes. `name` is the URL or
    the uploaded file's name."""
    media = media_type(content_type)
    if body[:1024].lstrip().startswith(b"%PDF-") or media == "application/pdf":
        return "pdf"
    if (image := image_format(body)) is not None:
        return image
    if body.startswith(_CONTAINERS) or body.startswith(b"{\\rtf"):
        found = format_from_bytes(body)
        if found is not None:
            return str(found)
    by_type = _BY_MIME.get(media)
    if by_type is not None and by_type != "html":
        return by_type if by_type not in _IMAGES else "unknown"
    by_name = _BY_EXTENSION.get(extension(name))
    if media in _UNTYPED or media == "text/plain":
        if by_name == "csv":
            return "csv"
        if media in _UNTYPED and media and by_name != "html":
            return by_name if by_name is not None and by_name not in _IMAGES else "unknown"
    return None
