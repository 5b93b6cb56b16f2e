# What a webhook setting may contain, as pure checks over plain values. Settings come from users
# (config.toml, `POST /crawl/start`) and end up in HTTP requests the drainer builds much later, so
# anything h11 or the receiver would refuse must be refused here, at the edge, with a message
# naming the field: a header name that is not an RFC 9110 token, a value with CR/LF/NUL (header
# injection) or a character outside ASCII (httpx encodes header values as ASCII, so `café` would
# pass a latin-1 check and then fail every delivery; RFC 9110 calls non-ASCII obs-text, which a
# sender should not generate), and sizes that would copy
# unbounded user input into every stored event. The same checks run again in the drainer on
# settings stored by an older crawld, where a problem becomes the event's final failure instead
# of an exception.
#
# Error texts never repeat a header value (it may be a credential) and cut names and keys short.
# Secrets follow the Standard Webhooks format: `whsec_` + base64 of 24-64 random bytes.
from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from daemon.redact import cap

MAX_URL_LENGTH = 2048
MAX_HEADERS = 32
MAX_HEADER_NAME = 256
MAX_HEADERS_BYTES = 8192
"""Names plus values of all user headers, ASCII bytes."""
MAX_METADATA_KEYS = 64
MAX_METADATA_KEY = 256
MAX_METADATA_VALUE = 2048
MAX_METADATA_BYTES = 16384
"""Keys plus values of all metadata entries, UTF-8 bytes (copied into every event body)."""
WHSEC_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9110 field-value without obs-text: visible ASCII, space and tab; so no control characters
# (CR, LF and NUL included) and nothing above 0x7F.
_BAD_VALUE_CHAR = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|[^\x00-\x7f]")

_MANAGED_PREFIXES = ("x-firecrawl-", "webhook-")
_MANAGED_NAMES = frozenset({"content-type", "content-length", "host"})


def _any_case(text: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in text)


# The same rules as JSON-schema patterns, for /openapi.json (and msgspec checks them on decode).
# The sizes of all headers and metadata together are checked by the functions below only.
HOST_CHAR = r"[^/\s\x1c-\x1f]"
"""Not a slash or white space (Python's `\\s` takes in 0x1c-0x1f, the JSON-schema engines' does
not: both are named)."""
URL_PATTERN = rf"^https?://{HOST_CHAR}+[^\r\n\x00]*$"
HEADER_NAME_PATTERN = (
    "^"
    + "".join(f"(?!{_any_case(p)})" for p in _MANAGED_PREFIXES)
    + "".join(f"(?!{_any_case(n)}$)" for n in sorted(_MANAGED_NAMES))
    + r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+$"
)
HEADER_VALUE_PATTERN = r"^[\t\x20-\x7e]*$"
URL_SCHEMA = {"maxLength": MAX_URL_LENGTH, "pattern": URL_PATTERN}
HEADERS_SCHEMA = {
    "maxProperties": MAX_HEADERS,
    "propertyNames": {"maxLength": MAX_HEADER_NAME, "pattern": HEADER_NAME_PATTERN},
}
HEADER_VALUE_SCHEMA = {"pattern": HEADER_VALUE_PATTERN}
METADATA_SCHEMA = {
    "maxProperties": MAX_METADATA_KEYS,
    "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_KEY},
}
METADATA_VALUE_SCHEMA = {"maxLength": MAX_METADATA_VALUE}


def _name(text: str) -> str:
    return repr(cap(text, 64))


def is_managed_header(name: str) -> bool:
    """Headers crawld sets itself (signatures, ids, framing); a user may not set them."""
    lowered = name.lower()
    return lowered in _MANAGED_NAMES or lowered.startswith(_MANAGED_PREFIXES)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a webhook URL (scheme, host, length), or None."""
    if len(url) > MAX_URL_LENGTH:
        return f"url is {len(url)} characters long; at most {MAX_URL_LENGTH} are allowed"
    if not re.match(rf"^https?://{HOST_CHAR}+", url):
        return f"url must be an http:// or https:// URL, got {_name(url)}"
    if any(c in url for c in "\r\n\x00"):
        return "url may not contain CR, LF or NUL"
    return None


def header_problem(name: str, value: str) -> str | None:
    """Why one user header cannot be sent, or None."""
    if not _TOKEN.fullmatch(name):
        return f"headers: name {_name(name)} is not a valid HTTP header name (RFC 9110 token)"
    if len(name) > MAX_HEADER_NAME:
        return f"headers: name {_name(name)} is longer than {MAX_HEADER_NAME} characters"
    if is_managed_header(name):
        return f"headers: {_name(name)} is managed by crawld and cannot be set"
    bad = _BAD_VALUE_CHAR.search(value)
    if bad is not None:
        char = bad.group()
        what = (
            "a character outside ASCII (header values are sent as ASCII)"
            if ord(char) > 0x7F
            else "CR, LF, NUL or another control character"
        )
        return f"headers: the value of {_name(name)} contains {what} (position {bad.start()})"
    return None


def headers_problem(headers: Mapping[str, str]) -> str | None:
    """Why a webhook's `headers` cannot be used, or None."""
    if len(headers) > MAX_HEADERS:
        return f"headers: {len(headers)} headers; at most {MAX_HEADERS} are allowed"
    size = 0
    seen: set[str] = set()
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem is not None:
            return problem
        if name.lower() in seen:
            return f"headers: {_name(name)} is given twice (header names ignore case)"
        seen.add(name.lower())
        size += len(name) + len(value)
    if size > MAX_HEADERS_BYTES:
        return f"headers: {size} bytes of names and values; at most {MAX_HEADERS_BYTES} are allowed"
    return None


def metadata_problem(metadata: Mapping[str, str]) -> str | None:
    """Why a webhook's `metadata` cannot be used, or None."""
    if len(metadata) > MAX_METADATA_KEYS:
        return f"metadata: {len(metadata)} keys; at most {MAX_METADATA_KEYS} are allowed"
    size = 0
    for key, value in metadata.items():
        if not key:
            return "metadata: keys cannot be empty"
        if len(key) > MAX_METADATA_KEY:
            return f"metadata: key {_name(key)} is longer than {MAX_METADATA_KEY} characters"
        if len(value) > MAX_METADATA_VALUE:
            return (
                f"metadata: the value of {_name(key)} is {len(value)} characters long; at most"
                f" {MAX_METADATA_VALUE} are allowed"
            )
        size += len(key.encode("utf-8", "surrogatepass")) + len(
            value.encode("utf-8", "surrogatepass")
        )
    if size > MAX_METADATA_BYTES:
        return f"metadata: {size} bytes of keys and values; at most {MAX_METADATA_BYTES} allowed"
    return None


def webhook_problem(
    url: str, headers: Mapping[str, str], metadata: Mapping[str, str]
) -> str | None:
    """The first reason a webhook setting cannot be used, or None."""
    return url_problem(url) or headers_problem(headers) or metadata_problem(metadata)


def secret_problem(secret: str) -> str | None:
    """Why a signing secret is unusable, or None. `whsec_` secrets must be base64 of 24-64 bytes
    (the Standard Webhooks format); any other non-empty secret is used as its UTF-8 bytes."""
    if not secret:
        return "the secret is empty"
    if secret != secret.strip():
        return "the secret starts or ends with whitespace"
    if not secret.startswith(WHSEC_PREFIX):
        return None
    encoded = secret[len(WHSEC_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return "a whsec_ secret must be followed by base64 (A-Z, a-z, 0-9, +, /, = padding)"
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        return (
            f"a whsec_ secret must decode to {MIN_SECRET_BYTES}-{MAX_SECRET_BYTES} bytes,"
            f" this one decodes to {len(key)}"
        )
    return None
