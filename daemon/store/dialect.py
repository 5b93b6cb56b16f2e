# The SQL the areas write once, turned into what PostgreSQL runs.
#
# Why this shape: every area statement is written in the SQL SQLite and PostgreSQL share (`?`
# placeholders, `ON CONFLICT`, `RETURNING`, CASE). Three spellings have no common form, so they
# are translated here, in one place, from the SQLite side:
# - placeholders: `?` and `?N` become PostgreSQL's native `$N` (psycopg's RawCursor sends them
#   as they are, so no `%` needs escaping and a numbered parameter used twice is sent once);
# - a scalar max/min with two or more arguments becomes GREATEST/LEAST (SQLite has no such
#   names; PostgreSQL's max/min are aggregates only);
# - `INDEXED BY name` (a SQLite planner hint) is dropped.
# String literals and quoted names are copied untouched. The translation is pure, and cached per
# statement text: area statements are constants, so each is translated once per process.
from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

_INDEXED_BY = re.compile(r"\s+INDEXED\s+BY\s+\w+", re.IGNORECASE)
_PLAIN_INSERT = re.compile(
    r"\s*INSERT\s+INTO\s+(\w+)\s*\(([\w\s,]+)\)\s*VALUES\s*\((\s*\?(?:\s*,\s*\?)*\s*)\)\s*",
    re.IGNORECASE,
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_SCALAR = {"max": "GREATEST", "min": "LEAST"}


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    """The statement as PostgreSQL runs it."""
    returns_rows: bool
    """It yields rows (a SELECT, VALUES or RETURNING): executemany must collect them."""
    copy: str | None = None
    """For a plain `INSERT INTO t(cols) VALUES (?, …)`: the COPY that loads the same rows, a
    third of the time of one INSERT per row when executemany sends many (same constraints,
    same triggers, all or nothing)."""


@functools.lru_cache(maxsize=4096)
def to_postgres(sql: str) -> Statement:
    """Translate one shared statement (see the module comment)."""
    out = _rewrite(_INDEXED_BY.sub("", sql), [0])
    head = out.lstrip().split(None, 1)[0].upper() if out.strip() else ""
    returns = head in ("SELECT", "WITH", "VALUES") or " RETURNING " in f" {out.upper()} "
    plain = _PLAIN_INSERT.fullmatch(sql)
    copy = None
    if plain is not None:
        columns = [c.strip() for c in plain.group(2).split(",")]
        if len(columns) == plain.group(3).count("?"):
            copy = f"COPY {plain.group(1)} ({', '.join(columns)}) FROM STDIN"
    return Statement(out, returns, copy)


def _rewrite(sql: str, counter: list[int]) -> str:
    """`counter[0]` numbers the bare `?` (shared with the arguments of a rewritten call)."""
    parts: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            end = _quoted_end(sql, i)
            parts.append(sql[i:end])
            i = end
        elif ch == "?":
            j = i + 1
            while j < n and sql[j].isdigit():
                j += 1
            if j > i + 1:
                parts.append("$" + sql[i + 1 : j])
            else:
                counter[0] += 1
                parts.append(f"${counter[0]}")
            i = j
        elif ch.isalpha() or ch == "_":
            match = _WORD.match(sql, i)
            assert match is not None
            word, end = match.group(), match.end()
            name = _SCALAR.get(word.lower())
            close = _call_end(sql, end) if name is not None and not _after_word(sql, i) else None
            if name is not None and close is not None and _top_level_commas(sql, end, close):
                parts.append(f"{name}({_rewrite(sql[end + 1 : close], counter)})")
                i = close + 1
            else:
                parts.append(word)
                i = end
        else:
            parts.append(ch)
            i += 1
    return "".join(parts)


def _after_word(sql: str, i: int) -> bool:
    return i > 0 and (sql[i - 1].isalnum() or sql[i - 1] in "_.")


def _quoted_end(sql: str, start: int) -> int:
    quote, i, n = sql[start], start + 1, len(sql)
    while i < n:
        if sql[i] == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return n


def _unquoted(sql: str, start: int, stop: int) -> Iterator[tuple[int, str, int]]:
    """(index, character, paren depth before it) of sql[start:stop] outside quotes."""
    depth, i = 0, start
    while i < stop:
        ch = sql[i]
        if ch in "'\"":
            i = _quoted_end(sql, i)
            continue
        yield i, ch, depth
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        i += 1


def _call_end(sql: str, after_name: int) -> int | None:
    """The index of the `)` closing a call whose `(` follows `after_name`."""
    if after_name >= len(sql) or sql[after_name] != "(":
        return None
    for i, ch, depth in _unquoted(sql, after_name, len(sql)):
        if ch == ")" and depth == 1:
            return i
    return None


def _top_level_commas(sql: str, open_at: int, close_at: int) -> bool:
    return any(ch == "," and depth == 0 for _, ch, depth in _unquoted(sql, open_at + 1, close_at))
