# The merge of an extract job's per-page answers into one object, and the sources of each field.
# Pure: the job calls it over the stored page results, so a restarted job merges again without a
# model call, and the same pages always give the same result.
#
# The rule (Firecrawl splits a schema the same way: array properties are its "multi-entity" keys,
# gathered from every page; the others are its "single answer" keys):
# - an array (the root, or a property the schema types as an array, or, without a schema, a list
#   value) gathers the items of every page in page order, without duplicates: an item equal to an
#   earlier one is dropped, and two objects that agree on every field both set (at least one)
#   become one object with the fields of both (Firecrawl's "null-value objects" merge);
# - an object merges field by field with these same rules;
# - any other value: the first page (request URLs in order, then the pages a `/*` URL's crawl
#   found, in discovery order) that gives a non-null value wins.
# Why no final model call: it would cost a call per job, could not be resumed without paying
# again, and may drop or invent values; these rules keep every item found and say where it came
# from. With a schema, every property appears in the result: null when no page had it ([] for
# an array).
from __future__ import annotations

from typing import Any

import msgspec

_encode = msgspec.json.Encoder(order="sorted").encode

Sources = dict[str, list[str]]


def _key(value: Any) -> bytes:
    return _encode(value)


def _kind(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and "properties" in schema:
        return "object"
    if kind is None and "items" in schema:
        return "array"
    return kind if isinstance(kind, str) else None


def mergeable(a: Any, b: Any) -> bool:
    """Two objects that agree on every field both set (non-null), with one such field at least."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    shared = [k for k in a if k in b and a[k] is not None and b[k] is not None]
    return bool(shared) and all(_key(a[k]) == _key(b[k]) for k in shared)


def _fill(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        if out.get(k) is None and v is not None:
            out[k] = v
    return out


def _matches(item: Any, other: Any) -> bool:
    return _key(item) == _key(other) or mergeable(item, other)


def gather(lists: list[list[Any]]) -> list[Any]:
    """Items of every list in order, duplicates dropped and agreeing objects merged."""
    out: list[Any] = []
    seen: set[bytes] = set()
    for items in lists:
        for item in items:
            key = _key(item)
            if key in seen:
                continue
            for i, kept in enumerate(out):
                if mergeable(kept, item):
                    out[i] = _fill(kept, item)
                    seen.add(key)
                    break
            else:
                out.append(item)
                seen.add(key)
    return out


def merge_values(schema: Any, values: list[Any]) -> Any:
    """One value from the pages' values (in page order) following the rule above."""
    present = [v for v in values if v is not None]
    kind = _kind(schema)
    if kind == "array" or (kind is None and present and all(isinstance(v, list) for v in present)):
        return gather([v if isinstance(v, list) else [v] for v in present])
    if kind == "object" or (kind is None and present and all(isinstance(v, dict) for v in present)):
        # An object no page gave is null, like a missing scalar, not an object of nulls.
        dicts = [v for v in present if isinstance(v, dict)]
        if not dicts:
            return None
        properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
        names = list(properties) if isinstance(properties, dict) else []
        for d in dicts:
            names += [k for k in d if k not in names]
        return {
            name: merge_values(
                properties.get(name) if isinstance(properties, dict) else None,
                [d.get(name) for d in dicts],
            )
            for name in names
        }
    return present[0] if present else None


def merge(schema: dict[str, Any] | None, pages: list[tuple[str, Any]]) -> tuple[Any, Sources]:
    """(result, sources) of the pages' (url, value) in page order. Sources as Firecrawl gives
    them: a top-level field → the URLs whose value agrees with the result's; an item of an array
    field → `"field[i]"` (of a root array `"[i]"`) → the URLs that gave that item."""
    result = merge_values(schema, [v for _, v in pages])
    return result, sources_of(schema, result, pages)


def sources_of(schema: Any, result: Any, pages: list[tuple[str, Any]]) -> Sources:
    sources: Sources = {}
    if isinstance(result, list):
        _item_sources(sources, "", result, [(u, v) for u, v in pages])
        return sources
    if not isinstance(result, dict):
        return sources
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    for name, final in result.items():
        if final is None:
            continue
        given = [(u, v.get(name)) for u, v in pages if isinstance(v, dict)]
        sub = properties.get(name) if isinstance(properties, dict) else None
        if isinstance(final, list) and (_kind(sub) in ("array", None)):
            _item_sources(sources, name, final, given)
        else:
            sources[name] = _unique(
                u for u, v in given if v is not None and (_matches(final, v) or _within(final, v))
            )
    return sources


def _item_sources(
    sources: Sources, name: str, items: list[Any], given: list[tuple[str, Any]]
) -> None:
    for i, item in enumerate(items):
        sources[f"{name}[{i}]"] = _unique(
            u for u, v in given if isinstance(v, list) and any(_matches(item, o) for o in v)
        )


def _within(final: Any, value: Any) -> bool:
    """A page's object value that contributed to a merged object (each of its set fields is
    in the result)."""
    if not (isinstance(final, dict) and isinstance(value, dict)):
        return False
    set_fields = {k: v for k, v in value.items() if v is not None}
    return bool(set_fields) and all(
        k in final and (_key(final[k]) == _key(v) or _within(final[k], v) or _contains(final[k], v))
        for k, v in set_fields.items()
    )


def _contains(final: Any, value: Any) -> bool:
    return (
        isinstance(final, list)
        and isinstance(value, list)
        and all(any(_matches(f, x) for f in final) for x in value)
    )


def _unique(urls: Any) -> list[str]:
    out: list[str] = []
    for url in urls:
        if url not in out:
            out.append(url)
    return out
