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
#
# The scanner knows quotes, parentheses and words, not the grammar, so what it could carry over
# wrongly without a sound is refused instead (UntranslatableSql, at the statement's first run,
# naming the problem and showing the statement): a comment (a `?` in it would be counted), bare
# `?` mixed with `?N` (SQLite numbers the bare ones after the highest `?N` seen so far), INDEXED
# other than as `INDEXED BY name`, and a call of a function not known to exist on both backends
# (SHARED_FUNCTIONS; one that exists on one only would fail on the other, or mean another thing).
# Schema changes (CREATE, ALTER, DROP) are each backend's own migrations; only tests send them
# here, and their names before `(` are tables, types and constraints, not calls.
from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_INDEXED_BY = re.compile(r"INDEXED\s+BY\s+[A-Za-z_][A-Za-z_0-9]*\b", re.IGNORECASE)
_PLAIN_INSERT = re.compile(
    r"\s*INSERT\s+INTO\s+(\w+)\s*\(([\w\s,]+)\)\s*VALUES\s*\((\s*\?(?:\s*,\s*\?)*\s*)\)\s*",
    re.IGNORECASE,
)
_DDL = re.compile(r"\s*(CREATE|ALTER|DROP)\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_SCALAR = {"max": "GREATEST", "min": "LEAST"}

SHARED_FUNCTIONS = frozenset(
    {
        # aggregates
        "count", "sum", "avg", "max", "min",
        # scalars both spell and mean alike
        "coalesce", "nullif", "abs", "lower", "upper", "length", "substr", "replace", "trim",
        "ltrim", "rtrim", "round", "cast",
        # window functions
        "row_number", "rank", "dense_rank",
        # the daemon's own, defined on both (SQLite: a Python function; PostgreSQL: migration)
        "crawld_now_ms",
    }
)  # fmt: skip
"""Functions SQLite and PostgreSQL both have, with the same meaning for the daemon's uses."""

_NOT_CALLS = frozenset(
    {
        "all", "and", "any", "as", "between", "by", "case", "conflict", "distinct", "do", "else",
        "except", "exists", "filter", "from", "having", "in", "intersect", "into", "is", "join",
        "like", "limit", "not", "offset", "on", "or", "over", "returning", "select", "set",
        "then", "union", "using", "values", "when", "where", "with",
    }
)  # fmt: skip
"""Words a `(` may follow that are not a function's name."""


class UntranslatableSql(ValueError):
    """A statement the translation cannot carry to PostgreSQL safely (see the module comment):
    the message names the problem and shows the statement."""


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    """The statement as PostgreSQL runs it."""
    returns_rows: bool
    """It yields rows (a SELECT, VALUES or RETURNING): executemany must collect them."""
    bulk: str | None = None
    """For a plain `INSERT INTO t(cols) VALUES (?, …)`: `INSERT INTO t (cols) VALUES `, to which
    executemany appends one `($1, …)` per row and sends many rows in one statement (same
    constraints, same triggers, all or nothing). Not COPY: COPY waits for its data after the
    server has answered, and a client paused in that gap (SIGSTOP, a VM freeze) would hold the
    transaction's row locks with no server timeout to end it (`idle_in_transaction_session_
    timeout` covers only a wait between statements)."""
    width: int = 0
    """Parameters per row of `bulk`."""


@functools.lru_cache(maxsize=4096)
def to_postgres(sql: str) -> Statement:
    """Translate one shared statement (see the module comment)."""
    out = _Scan(sql).rewrite(0, len(sql))
    head = out.lstrip().split(None, 1)[0].upper() if out.strip() else ""
    returns = head in ("SELECT", "WITH", "VALUES") or " RETURNING " in f" {out.upper()} "
    plain = _PLAIN_INSERT.fullmatch(sql)
    if plain is not None:
        columns = [c.strip() for c in plain.group(2).split(",")]
        if len(columns) == plain.group(3).count("?"):
            bulk = f"INSERT INTO {plain.group(1)} ({', '.join(columns)}) VALUES "
            return Statement(out, returns, bulk, len(columns))
    return Statement(out, returns)


BULK_PARAMS = 30_000
"""At most this many parameters in one multi-row INSERT (PostgreSQL's limit is 65,535)."""


def bulk_inserts(statement: Statement, params: list[Any]) -> Iterator[tuple[str, list[Any]]]:
    """The multi-row INSERTs (SQL, flat parameters) that load `params` for a statement with
    `bulk`, at most BULK_PARAMS parameters each."""
    assert statement.bulk is not None
    width = statement.width
    per = max(1, BULK_PARAMS // width)
    for start in range(0, len(params), per):
        chunk = params[start : start + per]
        yield statement.bulk + bulk_rows(width, len(chunk)), [v for row in chunk for v in row]


@functools.lru_cache(maxsize=256)
def bulk_rows(width: int, rows: int) -> str:
    """`($1, …, $width), ($width+1, …), …` for `rows` rows."""
    return ", ".join(
        "(" + ", ".join(f"${r * width + c + 1}" for c in range(width)) + ")" for r in range(rows)
    )


class _Scan:
    """One translation: the statement, and what its placeholders looked like so far."""

    __slots__ = ("bare", "ddl", "numbered", "sql")

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.ddl = _DDL.match(sql) is not None
        """A schema change: a name before `(` is a table's, a type's or a constraint's."""
        self.bare = 0
        """Bare `?` numbered so far (shared with the arguments of a rewritten call)."""
        self.numbered = False

    def refuse(self, problem: str) -> UntranslatableSql:
        return UntranslatableSql(f"{problem}; write it without, in: {self.sql}")

    def rewrite(self, start: int, stop: int) -> str:
        sql = self.sql
        parts: list[str] = []
        i = start
        while i < stop:
            ch = sql[i]
            if ch in "'\"":
                end = _quoted_end(sql, i)
                parts.append(sql[i:end])
                i = end
            elif sql.startswith(("--", "/*"), i):
                raise self.refuse(f"a comment ({sql[i : i + 2]}) cannot be translated safely")
            elif ch == "?":
                i = self._placeholder(i, parts)
            elif ch.isalpha() or ch == "_":
                i = self._word(i, parts)
            else:
                parts.append(ch)
                i += 1
        return "".join(parts)

    def _placeholder(self, i: int, parts: list[str]) -> int:
        sql, j = self.sql, i + 1
        while j < len(sql) and sql[j].isdigit():
            j += 1
        if j > i + 1:
            self.numbered = True
            parts.append("$" + sql[i + 1 : j])
        else:
            self.bare += 1
            parts.append(f"${self.bare}")
        if self.numbered and self.bare:
            raise self.refuse("bare ? and numbered ?N placeholders are mixed")
        return j

    def _word(self, i: int, parts: list[str]) -> int:
        sql = self.sql
        match = _WORD.match(sql, i)
        assert match is not None
        word, end = match.group(), match.end()
        lower = word.lower()
        if _after_word(sql, i):
            parts.append(word)
            return end
        if lower == "indexed":
            hint = _INDEXED_BY.match(sql, i)
            if hint is None:
                raise self.refuse("INDEXED is only translated as the hint INDEXED BY name")
            while parts and parts[-1].isspace():
                parts.pop()
            return hint.end()
        paren = _next_nonspace(sql, end)
        if paren < len(sql) and sql[paren] == "(" and not self._not_call(lower, parts):
            if self.ddl:
                parts.append(word)
                return end
            if lower not in SHARED_FUNCTIONS:
                raise self.refuse(
                    f"function {word}() is not known to exist on both SQLite and PostgreSQL"
                    " (daemon/store/dialect.py SHARED_FUNCTIONS; an alias's column list takes AS:"
                    " `AS v(x)`)"
                )
            name = _SCALAR.get(lower)
            close = _call_end(sql, paren) if name is not None else None
            if name is not None and close is not None and _top_level_commas(sql, paren, close):
                parts.append(f"{name}({self.rewrite(paren + 1, close)})")
                return close + 1
        parts.append(word)
        return end

    @staticmethod
    def _not_call(word: str, parts: list[str]) -> bool:
        """`word (` is a keyword's parenthesis, a table's column list (INSERT INTO t (…)) or an
        alias's (`(…) v(x)`, `AS v(x)`)."""
        if word in _NOT_CALLS:
            return True
        k = len(parts) - 1
        while k >= 0 and parts[k].isspace():
            k -= 1
        before = parts[k] if k >= 0 else ""
        return before == ")" or before.lower() in ("into", "as")


def _next_nonspace(sql: str, i: int) -> int:
    while i < len(sql) and sql[i].isspace():
        i += 1
    return i


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


def in_list(count: int) -> str:
    """`(?, ?, …)`: the placeholders of an IN list of `count` (at least one) values, in the SQL
    both backends share. tests/store/test_shipped_sql.py reads a call of it as two placeholders,
    so a statement built with it is still PREPAREd there."""
    if count < 1:
        raise ValueError("an IN list needs at least one value")
    return "(" + ", ".join("?" * count) + ")"
