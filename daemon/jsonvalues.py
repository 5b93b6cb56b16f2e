# Decoded JSON as clients send it, made ready for msgspec's strict conversion. Shared by the HTTP
# surface (daemon/api/errors.py, which reads every request body) and the areas that read request
# bodies themselves (daemon/crawl/problems.py): the core, so neither imports the other.
from __future__ import annotations

from typing import Any


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
