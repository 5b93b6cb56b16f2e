# The JSON-schema side of the request models, shared by every request shape (scrape, crawl,
# batch, map, search, extract, v1). /openapi.json is made from the models, so a rule the parsers
# enforce has to be on the model to be declared: msgspec enforces `Meta` bounds itself, and the
# rules it cannot (a URL that must parse, a value refused unless empty, an `integration` from
# Firecrawl's list) are checked by the parsers with Firecrawl's messages and declared here, from
# the same constants.
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
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

SPACE = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""What str.strip() takes away (every character str.isspace() names), as a regex class spelled out
so that Python's `re` and the JSON-schema engines (ECMA regexes, whose `\\s` differs: it lacks
0x1c-0x1f and 0x85 and has 0xfeff) read the same set."""
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


def borrowed(model: type, names: Iterable[str], **overrides: Any) -> list[tuple[Any, ...]]:
    """Fields of `model` for msgspec.defstruct (body_model): each name with the model's type
    (its rules included) and default, or with the (type, default) given in `overrides`."""
    wanted = set(names)
    fields: list[tuple[Any, ...]] = []
    for info in msgspec.structs.fields(model):
        if info.name not in wanted or info.name in overrides:
            continue
        if info.default_factory is not msgspec.NODEFAULT:
            fields.append(
                (info.name, info.type, msgspec.field(default_factory=info.default_factory))
            )
        elif info.default is not msgspec.NODEFAULT:
            fields.append((info.name, info.type, info.default))
        else:
            fields.append((info.name, info.type))
    return fields + [(name, *spec) for name, spec in overrides.items()]


def body_model(name: str, doc: str, fields: list[tuple[Any, ...]], bases: tuple[type, ...] = (),
               rename: dict[str, str] | None = None, module: str = __name__) -> Any:  # fmt: skip
    """A body model made of `fields` (see `borrowed`; `rename` gives their keys where they
    differ from the names), keyword-only, unknown keys refused: a body that takes another
    model's fields, as v1's take v2's, declares them with that model's rules."""
    return msgspec.defstruct(name, fields, bases=bases, module=module, kw_only=True,
                             forbid_unknown_fields=True, rename=rename,
                             namespace={"__doc__": doc})  # fmt: skip


def with_schema(model: Any, schema: dict[str, Any]) -> Any:
    """`model` (a body_model too) with `schema` declared on it: rules across its fields."""
    return Annotated[model, Meta(extra_json_schema=schema)]
