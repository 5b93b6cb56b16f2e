# Decoded JSON as clients send it, made ready for msgspec's strict conversion, and the one mark a
# request model puts in its JSON schema for a rule that depends on the running config. Shared by
# the HTTP surface (daemon/api/errors.py reads every request body, daemon/api/app.py builds
# /openapi.json) and the areas that read and declare request bodies themselves
# (daemon/crawl/problems.py, the crawl request models): the core, so neither imports the other.
from __future__ import annotations

from typing import Any

DEPLOYMENT = "x-crawld-deployment"
"""Key of a JSON-schema node that names a schema of the running deployment: /openapi.json puts
`{"$ref": "#/components/schemas/<name>"}` in its place, and that component is what the routes
say `<name>` is under the config they run with (the formats an [llm] or a browser adds)."""


def deployment_schema(name: str) -> dict[str, str]:
    """The JSON-schema node standing for deployment schema `name` (use it as a field's
    `msgspec.Meta(extra_json_schema=...)`)."""
    return {DEPLOYMENT: name}


def integral_floats(value: Any) -> Any:
    """`value` (decoded JSON) with numbers like 5.0 as ints: JSON Schema counts them as integers,
    so a client (or a schema-driven tester) may send one where an integer is asked for."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: integral_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_floats(v) for v in value]
    return value
