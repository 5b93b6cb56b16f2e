# Firecrawl's `parsers` scrape option, read once per request into a plan the page pipeline follows.
# Pure rules over plain values (tested with tables): which files are parsed at all, the PDF mode,
# page limit and page outputs. `blocks` (layout blocks with bounding boxes) is refused with a 400
# rather than accepted and left out: a client that asks for it reads `data.blocks`, and crawld has
# no layout model to give them.
from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.crawl.problems import Problem, problem

__all__ = ["MODES", "PARSER_SCHEMA", "ParserPlan", "PdfParser", "parser_plan", "parsers_problems"]

MODES = ("fast", "auto", "ocr")
MAX_PAGES = 10_000
_PDF_KEYS = frozenset({"type", "mode", "maxPages", "pages", "pageMarkdown", "pageMarkers",
                       "blocks"})  # fmt: skip
_FLAGS = ("pages", "pageMarkdown", "pageMarkers", "blocks")
_FLAG = {"type": ["boolean", "null"]}
PARSER_SCHEMA = {"anyOf": [
    {"enum": ["pdf", "image"]},
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"const": "image"}}},
    {"type": "object", "required": ["type"], "additionalProperties": False, "properties": {
        "type": {"const": "pdf"}, "mode": {"enum": [*MODES, None]},
        "maxPages": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_PAGES},
                               {"type": "null"}]},
        **dict.fromkeys(_FLAGS, _FLAG), "blocks": {"enum": [False, None]}}},
]}  # fmt: skip
"""One entry of `parsers` as parsers_problems checks it (for /openapi.json)."""


class PdfParser(msgspec.Struct, frozen=True):
    mode: Literal["fast", "auto", "ocr"] = "auto"
    """fast: the text layer only; auto: the text layer, OCR for pages without one; ocr: every
    page OCR'd."""
    max_pages: int | None = None
    pages: bool = False
    """`data.pages = [{pageNumber, markdown}]` (`pageMarkdown` is the older name)."""
    page_markers: bool = False
    """Pages joined by `---` and `<!-- page N -->`."""


class ParserPlan(msgspec.Struct, frozen=True):
    pdf: PdfParser | None = PdfParser()
    """None: PDFs are answered as the file in base64 (`parsers: []`, or a list without "pdf")."""
    image: bool = True
    """Images are OCR'd as one-page scans; False: an image is an unsupported file."""


def parser_plan(parsers: list[Any] | None) -> ParserPlan:
    """The plan of already checked `parsers`: absent → PDFs and images parsed (Firecrawl's
    server default); a list → only the parsers it names."""
    if parsers is None:
        return ParserPlan()
    pdf: PdfParser | None = None
    image = False
    for parser in parsers:
        kind = parser if isinstance(parser, str) else parser.get("type")
        if kind == "image":
            image = True
        elif kind == "pdf" and pdf is None:
            pdf = _pdf_parser(parser if isinstance(parser, dict) else {})
    return ParserPlan(pdf=pdf, image=image)


def _pdf_parser(options: dict[str, Any]) -> PdfParser:
    pages = options.get("pages")
    if pages is None:
        pages = options.get("pageMarkdown")
    return PdfParser(
        mode=options.get("mode") or "auto",
        max_pages=options.get("maxPages"),
        pages=bool(pages),
        page_markers=bool(options.get("pageMarkers")),
    )


def parsers_problems(parsers: list[Any] | None, path: str) -> list[Problem]:
    """What is wrong with `parsers` (each problem names its path), for the request's 400."""
    problems: list[Problem] = []
    for i, parser in enumerate(parsers or []):
        where = f"{path}[{i}]"
        if parser in ("pdf", "image"):
            continue
        kind = parser.get("type") if isinstance(parser, dict) else None
        if kind == "image":
            extra = set(parser) - {"type"}
            if extra:
                problems.append(problem(f"{where}.{sorted(extra)[0]}", "unrecognized key"))
        elif kind == "pdf":
            problems += _pdf_problems(parser, where)
        else:
            problems.append(
                problem(where, 'a parser is "pdf", "image" or an object with that `type`')
            )
    return problems


def _pdf_problems(parser: dict[str, Any], where: str) -> list[Problem]:
    extra = set(parser) - _PDF_KEYS
    if extra:
        return [problem(f"{where}.{sorted(extra)[0]}", "unrecognized key")]
    problems = []
    mode = parser.get("mode")
    if mode is not None and mode not in MODES:
        problems.append(
            problem(f"{where}.mode", f"unknown mode {str(mode)[:40]!r}: one of fast, auto, ocr")
        )
    pages = parser.get("maxPages")
    if pages is not None and (type(pages) is not int or not 1 <= pages <= MAX_PAGES):
        problems.append(problem(f"{where}.maxPages", f"between 1 and {MAX_PAGES}"))
    for flag in _FLAGS:
        if parser.get(flag) is not None and not isinstance(parser[flag], bool):
            problems.append(problem(f"{where}.{flag}", "true or false"))
    if parser.get("blocks") is True:
        problems.append(
            problem(f"{where}.blocks", "layout blocks are not served by crawld (no layout "
                    "model); leave blocks out, or use pages for per-page markdown")
        )  # fmt: skip
    return problems
