# The JSON-schema side of the request models, shared by every request shape (scrape, crawl,
# batch, map, search, extract, v1). /openapi.json is made from the models, so a rule the parsers
# enforce has to be on the model to be declared: msgspec enforces `Meta` bounds itself, and the
# rules it cannot (a URL that must parse, a value refused unless empty, an `integration` from
# Firecrawl's list) are checked by the parsers with Firecrawl's messages and declared here, from
# the same constants.
from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

MAX_URL_LENGTH = 8192
MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer every client sends exactly (JavaScript's numbers): a request's counts and
durations stop there, so none overflows a database integer or a clock."""
INTEGRATIONS = (
    "dify", "zapier", "pipedream", "raycast", "langchain", "crewai", "llamaindex", "n8n",
    "camelai", "make", "flowise", "metagpt", "relevanceai", "viasocket", "cli", "hermes",
    "gstack", "prometheus",
)  # fmt: skip
"""Firecrawl's IntegrationEnum (apps/api/src/controllers/v2/types.ts); any other `integration`
must start with `_`, as Firecrawl's schema says."""

HTTP_URL: dict[str, Any] = {
    "format": "uri",
    "pattern": r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#@]",
    "maxLength": MAX_URL_LENGTH,
}
"""An absolute http(s) URL with a host, as models.url_problems checks it."""
HttpUrl = Annotated[str, Meta(extra_json_schema=HTTP_URL)]

SPACE = r"\s\x1c-\x1f"
"""What str.strip() takes away, as a regex class: Unicode white space and 0x1c-0x1f (Python's
`\\s` has them, the JSON-schema engines' does not: both are named)."""
NOT_BLANK: dict[str, Any] = {"pattern": f"[^{SPACE}]"}
"""A string that is not only white space (as `text.strip()` checks it)."""

INTEGRATION: dict[str, Any] = {"anyOf": [{"enum": list(INTEGRATIONS)}, {"pattern": "^_"}]}

_TRUTHY = {"anyOf": [
    {"const": True}, {"type": "object", "minProperties": 1}, {"type": "array", "minItems": 1},
    {"type": "string", "minLength": 1}, {"type": "number", "not": {"const": 0}},
]}  # fmt: skip
UNSUPPORTED = Meta(
    extra_json_schema={"not": _TRUTHY},
    description="not offered by crawld: only an empty value (false, null, {}) is accepted",
)
"""The Meta of an option crawld refuses (400) whenever it is set to something."""

JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "a JSON Schema (draft 2020-12) that compiles; an object type with neither"
    " properties nor patternProperties may not allow any additional property (true)",
}
"""A `schema` a model is asked to follow (json format, extract, changeTracking json mode)."""


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}
