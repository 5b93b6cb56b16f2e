"""Every SQL statement the daemon ships, PREPAREd on PostgreSQL after translation.

The areas write each statement once, in the SQL SQLite and PostgreSQL share; the SQLite tests
run most of them, and a statement only SQLite accepts would fail on PostgreSQL in production
only when its code path runs. So the statements are collected from the source (string constants,
implicitly concatenated ones included, passed to `.execute(`/`.executemany(` or assigned to
module-level SQL constants in daemon/**/*.py), translated by `to_postgres`, and PREPAREd on a
freshly migrated schema: PostgreSQL parses and plans each without running it.

A statement built at run time from more than constants (a join over a tuple of the rules, one per
table of the schema) cannot be collected: its function is run instead, by BUILT, on a connection
that keeps what it is given and answers with no rows, and what it sent is PREPAREd the same way.
A new such function fails `test_every_statement_built_at_run_time_is_run` until BUILT runs it.
An IN list built by `daemon.store.in_list` is read as two placeholders (IN_LIST)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemon.store.dialect import UntranslatableSql, to_postgres

ROOT = Path(__file__).resolve().parents[2]
DAEMON = ROOT / "daemon"

NATIVE = {
    "daemon/store/sqlite.py": "SQLite's own statements (pragmas, its catalogue), never translated",
    "daemon/store/postgres.py": "PostgreSQL's own statements on raw psycopg connections",
    "daemon/store/pglisten.py": "PostgreSQL's own statements (LISTEN, pg_notify)",
    "daemon/store/pgstalled.py": "PostgreSQL's own statement (pg_stat_activity, its blockers)",
}
"""Backend modules: their statements are each backend's own, not the shared SQL."""

IN_LIST = "(?, ?)"
"""What a call of `daemon.store.in_list(n)` is taken to give."""

_SQL_START = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|REPLACE|VALUES)\b", re.I)
_RUNS = {"execute", "executemany"}


@dataclass(frozen=True)
class Found:
    where: str
    """path:line of the call, or path:NAME of the constant."""
    sql: str | None
    """None: built at run time."""
    function: str = ""
    """The function the statement is in ("" at module level)."""


class _Module:
    """One module's string constants, imports and SQL-forwarding functions."""

    def __init__(self, source: str, where: str, name: str) -> None:
        self.tree = ast.parse(source, where)
        self.where = where
        self.name = name
        self.imports: dict[str, tuple[str, str | None]] = {}
        """Local name -> (module, name in it; None: the module itself)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("daemon"):
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module or "", alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("daemon") and alias.asname:
                        self.imports[alias.asname] = (alias.name, None)
        self.assigned: dict[str, ast.expr] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name):
                self.assigned[target.id] = value
        self.forwarders: dict[str, tuple[int, str]] = {}
        """Module-level functions that run an argument (name -> its position, its name)."""
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
                for call in _runs(node):
                    arg = call.args[0]
                    if isinstance(arg, ast.Name) and arg.id in params:
                        self.forwarders[node.name] = (params.index(arg.id), arg.id)


class _Catalogue:
    """Resolves the strings an expression can be, across the daemon's modules."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules

    def texts(
        self, node: ast.AST, module: _Module, scope: ast.AST, depth: int = 0
    ) -> list[str] | None:
        """The strings `node` can be: constants, implicit concatenations (one constant to the
        parser), `+`, `a if c else b`, f-strings of such, names given only such; else None."""
        variants = self._variants(node, module, scope, depth)
        return None if variants is None else list(dict.fromkeys(text for text, _ in variants))

    def _variants(self, node: ast.AST, module: _Module, scope: ast.AST, depth: int) -> _Variants:
        """Like `texts`, each with the conditions it was built under (`a if c else b` twice on
        the same `c` takes the same side both times)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value, frozenset())]
        if isinstance(node, ast.FormattedValue):
            if node.conversion != -1 or node.format_spec is not None:
                return None
            return self._variants(node.value, module, scope, depth)
        if isinstance(node, ast.IfExp):
            test = ast.dump(node.test)
            body = self._variants(node.body, module, scope, depth)
            orelse = self._variants(node.orelse, module, scope, depth)
            if body is None or orelse is None:
                return None
            return _combine([[("", frozenset({(test, True)}))], body]) + _combine(
                [[("", frozenset({(test, False)}))], orelse]
            )
        if isinstance(node, ast.Name):
            return self._name(node.id, module, scope, depth)
        if isinstance(node, ast.Call) and _called(node) == "in_list":
            return [(IN_LIST, frozenset())]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            source = module.imports.get(node.value.id)
            path = ".".join(p for p in source if p) if source else ""
            found = self.modules.get(path)
            return None if found is None else self.constant(found, node.attr, depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            parts: list[ast.AST] = [node.left, node.right]
        elif isinstance(node, ast.JoinedStr):
            parts = list(node.values)
        else:
            return None
        resolved = [self._variants(part, module, scope, depth) for part in parts]
        if any(r is None for r in resolved):
            return None
        return _combine([r for r in resolved if r is not None])

    def constant(self, module: _Module, name: str, depth: int = 0) -> _Variants:
        if depth > 8:
            return None
        if name in module.assigned:
            return self._variants(module.assigned[name], module, module.tree, depth + 1)
        if name in module.imports:
            source, attr = module.imports[name]
            found = self.modules.get(source)
            if found is not None and attr is not None:
                return self.constant(found, attr, depth + 1)
        return None

    def _name(self, name: str, module: _Module, scope: ast.AST, depth: int) -> _Variants:
        if scope is not module.tree:
            local = _local_values(scope, name)
            if local is not None:
                found = [self._variants(v, module, scope, depth + 1) for v in local]
                if not found or any(f is None for f in found):
                    return None
                return [variant for group in found for variant in group or []]
        return self.constant(module, name, depth)


_Variants = list[tuple[str, frozenset[tuple[str, bool]]]] | None


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _combine(parts: list[list[tuple[str, frozenset[tuple[str, bool]]]]]) -> list[Any]:
    """Every concatenation of one variant of each part whose conditions agree."""
    combined: list[tuple[str, frozenset[tuple[str, bool]]]] = [("", frozenset())]
    for variants in parts:
        combined = [
            (a + b, ca | cb)
            for a, ca in combined
            for b, cb in variants
            if not {(test, not side) for test, side in cb} & ca
        ]
    return combined


def _runs(node: ast.AST) -> Iterator[ast.Call]:
    """The `.execute(`/`.executemany(` calls with an argument inside `node`."""
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in _RUNS
            and call.args
        ):
            yield call


def _local_values(scope: ast.AST, name: str) -> list[ast.expr] | None:
    """What `name` is given in a function: None when it is not a local; [] when it is one
    whose value is unknown (a parameter, a loop variable, an augmented or tuple assignment)."""
    values: list[ast.expr] = []
    stores = 0
    for node in ast.walk(scope):
        if isinstance(node, ast.arguments):
            every = [*node.posonlyargs, *node.args, *node.kwonlyargs]
            if any(arg.arg == name for arg in every):
                return []
        elif isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            stores += 1
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    values.append(node.value)
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = zip(target.elts, node.value.elts, strict=False)
                    values.extend(v for t, v in pairs if isinstance(t, ast.Name) and t.id == name)
        elif (
            isinstance(node, ast.AnnAssign)
            and node.value is not None
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            values.append(node.value)
    if not stores:
        return None
    return values if stores == len(values) else []


def _scoped_calls(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.Call]]:
    """(innermost function or the module, call) of every call in the module."""

    def walk(node: ast.AST, scope: ast.AST) -> Iterator[tuple[ast.AST, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
            if isinstance(child, ast.Call):
                yield inner, child
            yield from walk(child, inner)

    yield from walk(tree, tree)


def _statement_arg(
    call: ast.Call, module: _Module, forwarders: dict[str, tuple[int, str]]
) -> ast.expr | None:
    """The argument of `call` that is a statement; None when the call runs none."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _RUNS and call.args:
        return call.args[0]
    name = func.id if isinstance(func, ast.Name) else None
    if name is None or name not in forwarders:
        return None
    if name not in module.forwarders and name not in module.imports:
        return None  # another module's function of the same name
    position, keyword = forwarders[name]
    if position < len(call.args):
        return call.args[position]
    return next((given.value for given in call.keywords if given.arg == keyword), None)


def collect_modules(sources: dict[str, str]) -> list[Found]:
    """The statements of the modules `sources` (path in the repository -> source)."""
    modules: dict[str, _Module] = {}
    for where, source in sources.items():
        name = where.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        modules[name] = _Module(source, where, name)
    catalogue = _Catalogue(modules)
    forwarders = {f: spec for m in modules.values() for f, spec in m.forwarders.items()}
    found: list[Found] = []
    for module in modules.values():
        for name, value in module.assigned.items():
            for text in catalogue.texts(value, module, module.tree) or []:
                if name.isupper() and _SQL_START.match(text):
                    found.append(Found(f"{module.where}:{name}", text))
        for scope, call in _scoped_calls(module.tree):
            arg = _statement_arg(call, module, forwarders)
            if arg is None:
                continue
            if (
                isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
                and isinstance(arg, ast.Name)
                and module.forwarders.get(scope.name, (0, ""))[1] == arg.id
            ):
                continue  # a helper running its caller's statement: collected at the callers
            here = f"{module.where}:{call.lineno}"
            texts: list[str | None] = list(catalogue.texts(arg, module, scope) or [None])
            function = getattr(scope, "name", "")
            found.extend(Found(here, text, function) for text in texts)
    return found


def collect(source: str, where: str) -> list[Found]:
    """The statements of one module's source (`where`: its path, for messages)."""
    return collect_modules({where: source})


def shipped() -> list[Found]:
    """Every statement of daemon/**/*.py outside the backend modules (NATIVE)."""
    sources = {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(DAEMON.rglob("*.py"))
    }
    return [f for f in collect_modules(sources) if f.where.split(":")[0] not in NATIVE]


def prepare_error(conn: Any, sql: str) -> str | None:
    """Why PostgreSQL refuses to PREPARE the shared statement `sql` (None: it takes it).

    Without declared types PostgreSQL infers each parameter's from its context; where it cannot
    (`? IS NULL`, a bare `SELECT ?`), the driver sends the value's type at run time (int as
    bigint, str as text), so each such parameter is tried as those until the statement plans."""
    import psycopg

    try:
        translated = to_postgres(sql).sql
    except UntranslatableSql as exc:
        return str(exc)
    types: dict[int, str] = {}
    candidates = ("bigint", "text", "double precision", "bytea")
    tried: dict[int, int] = {}
    last: int | None = None
    while True:
        count = max(types, default=0)
        declared = ", ".join(types.get(n, "unknown") for n in range(1, count + 1))
        head = f"PREPARE crawld_check ({declared})" if declared else "PREPARE crawld_check"
        try:
            conn.execute(f"{head} AS {translated}")
        except (psycopg.errors.IndeterminateDatatype, psycopg.errors.AmbiguousParameter) as exc:
            match = re.search(r"parameter \$(\d+)", str(exc))
            if match is None or int(match.group(1)) in tried:
                return f"{type(exc).__name__}: {exc}"
            last = int(match.group(1))
            tried[last] = 0
            types[last] = candidates[0]
            continue
        except psycopg.Error as exc:
            if last is None or tried[last] + 1 >= len(candidates):
                return f"{type(exc).__name__}: {exc}"
            tried[last] += 1
            types[last] = candidates[tried[last]]
            continue
        conn.execute("DEALLOCATE crawld_check")
        return None


def test_collects_constants_calls_and_concatenations() -> None:
    source = """
SELECT_ONE = "SELECT a FROM t WHERE b = ?"
NOT_SQL = "hello"

def f(conn, flag):
    conn.execute("UPDATE t SET a = ?"
                 " WHERE b = ?", (1, 2))
    conn.executemany(SELECT_ONE, [])
    sql = "DELETE FROM t WHERE a = ?"
    conn.execute(sql)
    conn.execute("SELECT 1" if flag else "SELECT 2")
    conn.execute(f"SELECT {flag}")
    other = make()
    conn.execute(other)
"""
    found = collect(source, "m.py")
    assert [f.sql for f in found] == [
        "SELECT a FROM t WHERE b = ?",
        "UPDATE t SET a = ? WHERE b = ?",
        "SELECT a FROM t WHERE b = ?",
        "DELETE FROM t WHERE a = ?",
        "SELECT 1",
        "SELECT 2",
        None,
        None,
    ]
    assert [f.where for f in found][:2] == ["m.py:SELECT_ONE", "m.py:6"]


def test_helpers_and_conditions_taken_the_same_way() -> None:
    source = """
def _all(conn, sql, bindings=()):
    return conn.execute(sql, bindings).fetchall()

def f(conn, songs):
    source = "a" if songs else "b"
    _all(conn, f"SELECT x FROM {source} WHERE {'m' if songs else 'n'}.y = ?", (1,))
"""
    assert [f.sql for f in collect(source, "m.py")] == [
        "SELECT x FROM a WHERE m.y = ?",
        "SELECT x FROM b WHERE n.y = ?",
    ]


def test_a_name_given_something_else_is_dynamic() -> None:
    source = 'def f(conn, rows):\n    sql = "SELECT 1"\n    for sql in rows:\n        conn.execute(sql)\n'
    assert [f.sql for f in collect(source, "m.py")] == [None]


class Recorder:
    """A connection that keeps every statement it is given and answers with no rows (a row of
    one 0 to `fetchone`, as a count would)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def execute(self, sql: str, bindings: Any = ()) -> Recorder:
        self.statements.append(sql)
        return self

    def executemany(self, sql: str, rows: Any) -> Recorder:
        self.statements.append(sql)
        return self

    def fetchall(self) -> list[Any]:
        return []

    def fetchone(self) -> tuple[int]:
        return (0,)

    def __iter__(self) -> Iterator[Any]:
        return iter(())


Tables = dict[str, list[tuple[str, str]]]
"""The store copy's plan, {table: [(column, kind)]} (daemon/store/copy.py `plan`)."""


def _milestone_candidates(tables: Tables) -> list[str]:
    from daemon.tracker import snapshot_store

    conn = Recorder()
    snapshot_store.milestone_candidates(conn)
    return conn.statements


def _copy_has_rows(tables: Tables) -> list[str]:
    from daemon.store import copy

    conn = Recorder()
    for table in copy.COPY_ORDER:
        copy._has_rows(conn, table)
    return conn.statements


def _copy_table(tables: Tables) -> list[str]:
    from daemon.store import copy

    conn = Recorder()
    for table, columns in tables.items():
        copy._copy_table(conn, conn, table, columns)
    return conn.statements


def _copy_verify(tables: Tables) -> list[str]:
    from daemon.store import copy

    conn = Recorder()
    copy._verify(conn, conn)
    return conn.statements


BUILT: dict[tuple[str, str], Callable[[Tables], list[str]]] = {
    ("daemon/tracker/snapshot_store.py", "milestone_candidates"): _milestone_candidates,
    ("daemon/store/copy.py", "_has_rows"): _copy_has_rows,
    ("daemon/store/copy.py", "_copy_table"): _copy_table,
    ("daemon/store/copy.py", "_verify"): _copy_verify,
}
"""(module, function) of each statement built at run time -> what runs it on a Recorder, given
the copy's plan of a migrated schema, and returns the statements it sent."""


def test_every_statement_built_at_run_time_is_run() -> None:
    built = {(f.where.split(":")[0], f.function): f.where for f in shipped() if f.sql is None}
    missing = sorted(where for key, where in built.items() if key not in BUILT)
    assert not missing, (
        "statements built at run time are PREPAREd only when BUILT runs their function:"
        " add it there (or build the statement from constants):\n" + "\n".join(missing)
    )
    assert not BUILT.keys() - built.keys(), "BUILT names a function that builds nothing now"


def test_in_list_is_read_as_two_placeholders() -> None:
    source = (
        "from daemon.store import in_list\n"
        "def f(conn, ids):\n"
        '    conn.execute(f"SELECT a FROM t WHERE b IN {in_list(len(ids))}", ids)\n'
    )
    assert [f.sql for f in collect(source, "m.py")] == ["SELECT a FROM t WHERE b IN (?, ?)"]


@pytest.fixture
def migrated(pg_schema: tuple[str, str]) -> Iterator[Any]:
    """An autocommit connection on a freshly migrated schema."""
    from daemon.store.postgres import connect, migrate

    dsn, schema = pg_schema
    conn = connect(dsn, schema)
    try:
        migrate(conn, schema)
        yield conn
    finally:
        conn.close()


@pytest.mark.postgres
def test_a_statement_only_sqlite_takes_is_refused(migrated: Any) -> None:
    source = 'def f(conn):\n    conn.execute("INSERT OR IGNORE INTO jobs(id) VALUES (?)", (1,))\n'
    (statement,) = collect(source, "m.py")
    assert statement.sql is not None
    error = prepare_error(migrated, statement.sql)
    assert error is not None and "syntax error" in error
    assert prepare_error(migrated, "SELECT rowid FROM jobs WHERE id = ?") is not None
    assert prepare_error(migrated, "SELECT ifnull(max(id), 0) FROM jobs") is not None
    assert prepare_error(migrated, "SELECT id FROM jobs WHERE ? IS NULL OR id = ?") is None


@pytest.mark.postgres
def test_every_statement_built_at_run_time_prepares_on_postgres(
    migrated: Any, pg_schema: tuple[str, str]
) -> None:
    from daemon.store.copy import plan
    from daemon.store.postgres import PgConn, PostgresBackend

    columns = PostgresBackend(pg_schema[0], schema=pg_schema[1]).columns(PgConn(migrated))
    tables = plan(columns, columns)
    failures = []
    for (module, function), run in BUILT.items():
        statements = list(dict.fromkeys(run(tables)))
        assert statements, f"{module} {function} sent no statement"
        for sql in statements:
            error = prepare_error(migrated, sql)
            if error is not None:
                failures.append(f"{module} {function}: {error}\n    {sql}")
    assert not failures, "\n".join(failures)


@pytest.mark.postgres
def test_every_shipped_statement_prepares_on_postgres(migrated: Any) -> None:
    failures = []
    statements = [f for f in shipped() if f.sql is not None]
    assert len(statements) > 100
    for found in statements:
        assert found.sql is not None
        error = prepare_error(migrated, found.sql)
        if error is not None:
            failures.append(f"{found.where}: {error}\n    {found.sql}")
    assert not failures, "\n".join(failures)
