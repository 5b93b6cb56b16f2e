# Signature verification for webhook receivers. Standard library only and free of crawld
# imports, so this one file can be copied into any Python receiver. It checks what crawld sends
# (see daemon/jobs/signing.py): the Standard Webhooks headers (webhook-id, webhook-timestamp,
# webhook-signature; replay-safe thanks to the timestamp) and Firecrawl's X-Firecrawl-Signature
# (body only, no replay protection). Comparisons are constant-time, and signatures are computed
# over the raw request bytes: re-serialised JSON never verifies.
#
# Secret handling matches the sender: `whsec_<base64>` secrets are base64-decoded for the
# Standard Webhooks signature, other secrets are used as UTF-8 bytes; the Firecrawl signature
# always uses the secret string's UTF-8 bytes as configured.
#
# Usage (any framework; Starlette shown):
#
#     from verify import WebhookVerificationError, verify
#
#     async def hook(request):
#         body = await request.body()              # raw bytes, before any JSON parsing
#         try:   # raises on a bad or stale signature; refuses replayable Firecrawl-only ones
#             verify(SECRET, body, request.headers, require_timestamped=True)
#         except WebhookVerificationError:
#             return Response(status_code=401)
#         event = json.loads(body)
#         if seen_before(request.headers["webhook-id"]):  # retries resend the same id
#             return Response(status_code=200)
#         ...
#         return Response(status_code=200)
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

DEFAULT_TOLERANCE = 300


class WebhookVerificationError(Exception):
    """The request is not a valid signed delivery; the message says why (no secrets in it)."""


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def _standard_key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise WebhookVerificationError("the whsec_ secret is not valid base64") from None
    return secret.encode()


def verify_firecrawl(secret: str, body: bytes, header: str | None) -> None:
    """Check `X-Firecrawl-Signature: sha256=<hex>` against the raw body."""
    if not header:
        raise WebhookVerificationError("missing X-Firecrawl-Signature")
    algo, _, given = header.strip().partition("=")
    if algo != "sha256" or not given:
        raise WebhookVerificationError("X-Firecrawl-Signature is not sha256=<hex>")
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given.lower()):
        raise WebhookVerificationError("X-Firecrawl-Signature does not match the body")


def verify_standard(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check webhook-id/-timestamp/-signature; the timestamp must be within `tolerance` seconds
    of `now` (default: the current time) in either direction."""
    msg_id = _get(headers, "webhook-id")
    stamp = _get(headers, "webhook-timestamp")
    signatures = _get(headers, "webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        ts = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if ts < current - tolerance:
        raise WebhookVerificationError("webhook-timestamp is too old")
    if ts > current + tolerance:
        raise WebhookVerificationError("webhook-timestamp is too new")
    signed = f"{msg_id}.{ts}.".encode() + body
    expected = base64.b64encode(hmac.new(_standard_key(secret), signed, hashlib.sha256).digest())
    for entry in signatures.split():
        version, _, given = entry.partition(",")
        if version == "v1" and hmac.compare_digest(expected, given.encode()):
            return
    raise WebhookVerificationError("no webhook-signature entry matches")


def verify(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
    require_timestamped: bool = False,
) -> None:
    """Check every signature style present (at least one must be); raise on any failure.

    With `require_timestamped=True` the Standard Webhooks signature (webhook-id, -timestamp,
    -signature) must be present: a request carrying only X-Firecrawl-Signature is refused,
    because that signature has no timestamp and a captured request could be replayed forever.
    crawld always sends both, so receivers of crawld should pass True.
    """
    firecrawl = _get(headers, "x-firecrawl-signature")
    standard = _get(headers, "webhook-signature")
    if firecrawl is None and standard is None:
        raise WebhookVerificationError("the request is not signed")
    if require_timestamped and standard is None:
        raise WebhookVerificationError(
            "the request has no webhook-signature (timestamped); X-Firecrawl-Signature alone"
            " can be replayed"
        )
    if standard is not None:
        verify_standard(secret, body, headers, tolerance=tolerance, now=now)
    if firecrawl is not None:
        verify_firecrawl(secret, body, firecrawl)
