# The rules of fetching that need no connection: which content types are scraped, what an
# answer's head says (a redirect, a refusal, or a body to read), and how a failed exchange reads
# as one of Firecrawl's error codes with a message safe to show (URLs redacted, a proxy's
# credentials masked). Pure functions, tested with plain values; the Fetcher
# (daemon/crawl/fetching/fetch.py) applies them.
from __future__ import annotations

import ssl
from collections.abc import Mapping
from urllib.parse import urljoin

import httpx

from daemon.crawl.proxies import Upstream
from daemon.redact import MASK, cap, redact_url

_TEXT_TYPES = frozenset(
    {"application/json", "application/xml", "application/xhtml+xml", "application/rss+xml",
     "application/pdf"}
)  # fmt: skip
DOCUMENT_TYPES = frozenset(
    {"application/octet-stream", "binary/octet-stream", "application/x-download",
     "application/download", "application/force-download", "application/msword",
     "application/rtf", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
     "application/epub+zip", "image/png", "image/jpeg", "image/webp", "image/tiff"}
)  # fmt: skip
"""Files read as documents (daemon/crawl/documents/): their bytes say what they are."""
_DOCUMENT_PREFIXES = ("application/vnd.openxmlformats-officedocument.",
                      "application/vnd.oasis.opendocument.", "application/vnd.ms-")  # fmt: skip


class FetchError(Exception):
    """A page that could not be fetched. `code` is Firecrawl's error code (SCRAPE_TIMEOUT,
    SCRAPE_DNS_RESOLUTION_ERROR, SCRAPE_SSL_ERROR, SCRAPE_SITE_ERROR,
    SCRAPE_UNSUPPORTED_FILE_ERROR, CRAWL_DENIAL); `message` is safe to show the user (URLs in it
    are redacted); `url` is the URL that was requested."""

    def __init__(self, code: str, message: str, url: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.url = url


def shown_url(url: str) -> str:
    """A URL as it may appear in an error: credentials and query values masked, cut short."""
    return cap(redact_url(url))


def accepted_content_type(content_type: str) -> bool:
    """HTML, text/*, JSON, XML, PDF, office documents, PNG/JPEG/WebP/TIFF images and untyped
    binaries are scraped; other types (archives, audio, video, fonts) are not. A missing
    Content-Type is accepted (the body is sniffed later)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return (
        not kind
        or kind.startswith("text/")
        or kind in _TEXT_TYPES
        or kind in DOCUMENT_TYPES
        or kind.startswith(_DOCUMENT_PREFIXES)
        or kind.endswith(("+json", "+xml"))
    )


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def redirect_or_refusal(
    status: int,
    headers: Mapping[str, str],
    url: str,
    current: str,
    any_content_type: bool,
    max_bytes: int,
) -> str | None:
    """What an answer's head to `current` (a hop of the fetch of `url`) says: the absolute URL a
    redirect points to, or None when its body is to be read. Raises FetchError for a content
    type not scraped (unless `any_content_type`) or a declared length over `max_bytes` (a
    compressed body is judged by its decoded bytes, as it is read). `headers` have lower-case
    names."""
    location = headers.get("location")
    if status in REDIRECT_STATUSES and location:
        try:
            return urljoin(current, location.strip())
        except ValueError:
            raise FetchError("SCRAPE_SITE_ERROR", "redirect to an invalid URL", url) from None
    content_type = headers.get("content-type", "")
    if not any_content_type and not accepted_content_type(content_type):
        kind = content_type.split(";", 1)[0].strip()
        raise FetchError("SCRAPE_UNSUPPORTED_FILE_ERROR", f"unsupported content type {kind!r}", url)
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes and "content-encoding" not in headers:
        raise too_big(url, max_bytes)
    return None


def too_big(url: str, max_bytes: int) -> FetchError:
    """The error for a body over the size cap (decoded bytes count)."""
    return FetchError(
        "SCRAPE_SITE_ERROR", f"page larger than the size cap ({max_bytes} bytes)", url
    )


def is_tls_error(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError | ssl.CertificateError):
            return True
        text = str(seen)
        if "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text or "TLS" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def http_failure(exc: httpx.HTTPError, url: str) -> FetchError:
    shown = shown_url(url)
    if isinstance(exc, httpx.TimeoutException):
        return FetchError("SCRAPE_TIMEOUT", f"timed out fetching {shown}", url)
    if is_tls_error(exc):
        return FetchError("SCRAPE_SSL_ERROR", f"TLS handshake with {shown} failed: {exc}", url)
    if isinstance(exc, httpx.ConnectError):
        return FetchError("SCRAPE_SITE_ERROR", f"cannot connect to {shown}: {exc}", url)
    return FetchError("SCRAPE_SITE_ERROR", f"error fetching {shown}: {type(exc).__name__}", url)


def proxy_failure(exc: httpx.HTTPError, url: str, upstream: Upstream) -> FetchError:
    """A failure through a proxy: connection errors are the proxy's (crawld only ever connects
    to the proxy), named by its label; any credential in the text is masked."""
    shown = shown_url(url)
    text = str(exc) or type(exc).__name__
    for secret in upstream.secrets():
        text = text.replace(secret, MASK)
    if isinstance(exc, httpx.TimeoutException):
        return FetchError(
            "SCRAPE_TIMEOUT", f"timed out fetching {shown} via proxy {upstream.name}", url
        )
    if isinstance(exc, httpx.ProxyError):
        return FetchError(
            "SCRAPE_SITE_ERROR", f"proxy {upstream.name} refused {shown}: {cap(text)}", url
        )
    if is_tls_error(exc):
        return FetchError(
            "SCRAPE_SSL_ERROR",
            f"TLS with {shown} via proxy {upstream.name} failed: {cap(text)}",
            url,
        )
    if isinstance(exc, httpx.ConnectError):
        return FetchError(
            "SCRAPE_SITE_ERROR", f"cannot connect to proxy {upstream.name}: {cap(text)}", url
        )
    return FetchError(
        "SCRAPE_SITE_ERROR",
        f"error fetching {shown} via proxy {upstream.name}: {type(exc).__name__}",
        url,
    )
