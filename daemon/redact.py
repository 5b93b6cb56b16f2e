# One place decides what of a URL or a header set may leave the process (API answers, stored job
# errors, logs, /status): URLs keep scheme, host, port and path, while user:password and every
# query value become `***`; header values are hidden except for a short list that never carries
# credentials. User input echoed back in an error is cut short so a huge value cannot come back
# at length.
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
ECHO_LIMIT = 200
"""Most characters of user input repeated in an error answer or a log line."""

SAFE_HEADERS = frozenset({"content-type", "accept", "user-agent", "content-length"})
"""Header names whose values are shown; every other value is masked."""


def redact_url(url: str) -> str:
    """`url` with credentials and query values replaced by `***` (keys stay, for debugging)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return cap(url)
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        # "user:password@" keeps the user; a lone "token@" is a credential itself.
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if user and colon else f"{MASK}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK) for k, _ in pairs], safe="*") if pairs else MASK
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_headers(
    headers: Mapping[str, str], *, safe: frozenset[str] = SAFE_HEADERS, mask: str = MASK
) -> dict[str, str]:
    """A copy with every value masked except those of the (lower-case) `safe` names."""
    return {k: v if k.lower() in safe else mask for k, v in headers.items()}


def cap(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def cap_message(text: str, limit: int = ECHO_LIMIT) -> str:
    """Like `cap`, but a trailing key path (msgspec's " - at `$.a.b`") survives the cut."""
    head, sep, path = text.rpartition(" - at `")
    if not sep or len(text) <= limit:
        return cap(text, limit)
    return f"{cap(head, limit)}{sep}{cap(path, limit)}"


_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s'\"<>`]+")


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted (error messages and log values quote URLs)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group()), text)


def redact_tree(value: Any) -> Any:
    """A copy of a JSON-like value for an answer: URLs in strings redacted, the values of every
    `headers` mapping masked (webhook specs, task settings, /status sections)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: redact_headers(v) if k == "headers" and isinstance(v, Mapping) else redact_tree(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value
