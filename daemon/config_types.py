# Building blocks of the config model shared by every section module (daemon/config.py and the
# areas' own `config.py`): durations written like "10m", the strict frozen section base, and the
# value checks several sections need. Kept apart so a section module needs only these, not the
# core's sections (daemon/config.py) or the whole file (daemon/settings.py).
from __future__ import annotations

import re
from typing import Any

import msgspec


class Duration(float):
    """Seconds; in the file a number or a string like "500ms", "15s", "10m", "24h", "7d"."""


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> Duration:
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '10m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"expected a duration like '10m', '15s' or '24h', got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return Duration(seconds)


def dec_hook(type_: type, obj: Any) -> Any:
    if type_ is Duration:
        return parse_duration(obj)
    raise NotImplementedError


def enc_hook(obj: Any) -> Any:
    if isinstance(obj, Duration):
        return float(obj)
    raise NotImplementedError


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


def check_timezone(name: str) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {name!r}") from None
