# Every attempt carries two signatures over the exact body bytes, so receivers written for either
# ecosystem verify us with the code they already have:
#
# - Firecrawl: `X-Firecrawl-Signature: sha256=<hex>`, HMAC-SHA256 of the body only, keyed with
#   the secret's UTF-8 bytes exactly as configured (what Firecrawl's receiver samples do with the
#   dashboard secret). It has no timestamp, so it cannot stop replays.
# - Standard Webhooks: `webhook-id` (the event's webhookId, stable across retries),
#   `webhook-timestamp` (this attempt, Unix seconds) and `webhook-signature: v1,<base64>` over
#   "{id}.{timestamp}.{body}". The key follows the Standard Webhooks secret format: a `whsec_…`
#   secret is the base64 of the key bytes (what the reference libraries decode); any other secret
#   is used as its raw UTF-8 bytes. To interoperate with a Standard Webhooks library, configure a
#   `whsec_` secret (e.g. "whsec_" + base64 of 32 random bytes).
#
# During rotation, older secrets add more `v1,` entries to `webhook-signature` (space-separated,
# as the spec allows); the Firecrawl header is signed with the current secret only.
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence

from daemon.jobs.webhook_rules import is_managed_header
from daemon.redact import redact_headers

FIRECRAWL_SIGNATURE = "X-Firecrawl-Signature"
WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"
USER_AGENT = "crawld-webhooks/1"


def standard_key(secret: str) -> bytes:
    """The HMAC key for `webhook-signature`: base64-decoded for `whsec_…`, else UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a whsec_ secret must be followed by base64") from None
    return secret.encode()


def firecrawl_signature(secret: str, body: bytes) -> str:
    """`sha256=<lowercase hex HMAC-SHA256 of body>` keyed with the secret's UTF-8 bytes."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def standard_signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` entry of `webhook-signature`."""
    if "." in webhook_id:
        raise ValueError("a webhook id cannot contain '.'")
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def attempt_headers(
    body: bytes,
    *,
    webhook_id: str,
    timestamp: int,
    secret: str | None,
    previous_secrets: Sequence[str] = (),
    event_type: str | None = None,
    job_id: str | None = None,
    user_headers: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """All headers for one attempt: the user's (minus any managed name), then the managed ones.

    `timestamp` is the attempt's wall-clock time in Unix seconds. Without a secret no signature
    header is sent; `webhook-id` and `webhook-timestamp` always are.
    """
    headers = {k: v for k, v in (user_headers or {}).items() if not is_managed_header(k)}
    if not any(k.lower() == "user-agent" for k in headers):
        headers["User-Agent"] = USER_AGENT
    headers["Content-Type"] = "application/json"
    headers[WEBHOOK_ID] = webhook_id
    headers[WEBHOOK_TIMESTAMP] = str(int(timestamp))
    if event_type is not None:
        headers["X-Firecrawl-Event"] = event_type
    if job_id is not None:
        headers["X-Firecrawl-Job-Id"] = job_id
    if secret is not None:
        headers[FIRECRAWL_SIGNATURE] = firecrawl_signature(secret, body)
        headers[WEBHOOK_SIGNATURE] = " ".join(
            standard_signature(s, webhook_id, int(timestamp), body)
            for s in (secret, *previous_secrets)
        )
    return headers


_LOGGABLE = frozenset(
    {"content-type", "user-agent", WEBHOOK_ID, WEBHOOK_TIMESTAMP, "x-firecrawl-event",
     "x-firecrawl-job-id"}
)  # fmt: skip


def redact(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy fit for logs: signatures and every user header value (often credentials) hidden."""
    return redact_headers(headers, safe=_LOGGABLE, mask="<redacted>")
