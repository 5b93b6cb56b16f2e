# A file that cannot become a document, as Firecrawl's error code and a message naming the problem
# (empty, encrypted, damaged, needs OCR, OCR failed or too slow). The page pipeline turns it into
# a FetchError, /v2/parse into a 4xx; `status` is the HTTP status /v2/parse answers.
from __future__ import annotations

__all__ = ["OCR_REQUIRED", "DocumentError"]

OCR_REQUIRED = "SCRAPE_PDF_OCR_REQUIRED"
UNSUPPORTED = "SCRAPE_UNSUPPORTED_FILE_ERROR"


class DocumentError(Exception):
    """`code` is Firecrawl's, `message` says what is wrong with the file (never its content)."""

    def __init__(self, code: str, message: str, status: int = 422) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status

    def __reduce__(self) -> tuple[type[DocumentError], tuple[str, str, int]]:
        """Pickled with its own arguments: it comes back from a content worker (pool.py)."""
        return type(self), (self.code, self.message, self.status)

    @classmethod
    def empty(cls) -> DocumentError:
        return cls(UNSUPPORTED, "the file is empty", 400)

    @classmethod
    def encrypted(cls, what: str) -> DocumentError:
        return cls(UNSUPPORTED, f"the {what} is encrypted with a password; crawld cannot open it")

    @classmethod
    def damaged(cls, what: str, detail: str) -> DocumentError:
        return cls(
            UNSUPPORTED, f"the {what} is damaged or truncated and cannot be read ({detail})"[:400]
        )

    @classmethod
    def unsupported(cls, what: str) -> DocumentError:
        return cls(UNSUPPORTED, what, 415)
