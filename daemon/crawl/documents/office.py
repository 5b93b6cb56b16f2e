# Office and other documents (docx/doc, xlsx/xls/ods, pptx/ppt/odp, odt, rtf, epub, csv) made
# GitHub-flavoured markdown by firecrawl-anydoc (MIT; Firecrawl's own converter, a Rust library
# with no models): headings, lists, tables, one `## Sheet` table per sheet, slides in order with
# their notes. Only the native converter is called, never the package's `ocr="hosted"` wrapper,
# which uploads files to Firecrawl. Blocking: run in a worker thread.
from __future__ import annotations

from anydoc._anydoc import (
    EncryptedError,
    MalformedError,
    MissingPartError,
    NeedsOcrError,
    ResourceLimitError,
    UnsupportedError,
    to_markdown_bytes,
)

from daemon.crawl.documents.errors import UNSUPPORTED, DocumentError

__all__ = ["office_markdown"]

_NAMES = {"xlsx": "spreadsheet", "ods": "spreadsheet", "pptx": "presentation",
          "ppt": "presentation", "odp": "presentation", "csv": "CSV file",
          "epub": "e-book"}  # fmt: skip


def office_markdown(body: bytes, fmt: str) -> str:
    """The markdown of `body`, a file of format `fmt` (a FORMATS name); DocumentError naming
    the problem for an empty, encrypted, damaged or oversized file."""
    what = _NAMES.get(fmt, "document")
    if not body:  # no bytes; white space alone is a damaged file of its type
        raise DocumentError.empty()
    try:
        return to_markdown_bytes(body, fmt).strip()  # type: ignore[arg-type]
    except EncryptedError:
        raise DocumentError.encrypted(what) from None
    except (MalformedError, MissingPartError) as exc:
        raise DocumentError.damaged(what, str(exc)) from None
    except ResourceLimitError as exc:
        message = f"the {what} is too large to convert: {exc}"[:400]
        raise DocumentError(UNSUPPORTED, message, 413) from None
    except NeedsOcrError as exc:
        raise DocumentError(UNSUPPORTED, f"the {what} needs OCR: {exc}"[:400]) from None
    except UnsupportedError as exc:
        raise DocumentError.damaged(what, str(exc)) from None
