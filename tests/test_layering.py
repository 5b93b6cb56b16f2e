"""The layering of `daemon/`, read from the imports (every `import` and `from … import` in every
module, at any depth, type-only ones included):

1. the core never imports an area, a surface or the assembly;
2. an area imports the core and itself, never another area, a surface or the assembly;
3. a surface (`api/`, `ui/`) calls area and core services, never a store module (its SQL):
   no `daemon.<x>.store`, no `daemon.<x>.*_store`.

The assembly may import anything: the entry points, the whole config (`settings`: the core's
sections and each area's), the assembled process (`process`), the simulators, and each part's
`component.py` outside the surfaces, which wires its part into the process (its tasks, its
routes, its status).
KNOWN lists the imports that still break a rule while the code is being restructured; each entry
must still occur (a fixed one is removed from the list), so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAEMON = ROOT / "daemon"

CORE = {
    "__init__", "config", "config_types", "jsonvalues", "store", "outbox", "cluster", "net", "jobs", "llm",
    "search", "broker", "logs", "metrics", "clock", "redact", "supervise", "systemd", "runtime",
}  # fmt: skip
"""Shared mechanisms and services: `llm` and `search` are services any area may call."""
AREAS = {"collector", "tracker", "crawl"}
SURFACES = {"api", "ui"}
ASSEMBLY = {"__main__", "app", "areas", "demo", "fakes", "process", "settings"}

KNOWN: set[tuple[str, str]] = set()  # (importing module, imported module)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """The daemon modules `path` imports (`from daemon.x import y` counts as daemon.x.y when y
    is a module)."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("daemon"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if not base.startswith("daemon"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                as_path = ROOT.joinpath(*candidate.split("."))
                is_module = (
                    as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists()
                )
                found.add(candidate if is_module else base)
    return found


def part(module: str) -> str:
    """The top-level part of daemon a module belongs to (`daemon` itself: `__init__`)."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def layer(module: str) -> str:
    if module.endswith(".component") and part(module) not in SURFACES:
        return "assembly"
    top = part(module)
    for name, members in (("core", CORE), ("area", AREAS), ("surface", SURFACES),
                          ("assembly", ASSEMBLY)):  # fmt: skip
        if top in members:
            return name
    raise AssertionError(f"{module}: daemon/{top} is in no layer: add it to one in this test")


def broken(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported` (None: it may)."""
    src, dst = layer(importer), layer(imported)
    if src == "core" and dst != "core":
        return f"the core imports {dst} {part(imported)}"
    if src == "area" and dst != "core" and part(imported) != part(importer):
        return f"area {part(importer)} imports {dst} {part(imported)}"
    last = imported.rsplit(".", 1)[-1]
    if (
        src == "surface"
        and imported != "daemon.store"
        and (last == "store" or last.endswith("_store"))
    ):
        return f"surface {part(importer)} imports a store module (SQL)"
    return None


def violations() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for path in sorted(DAEMON.rglob("*.py")):
        importer = module_name(path)
        for imported in imports(path):
            why = broken(importer, imported)
            if why is not None:
                found[(importer, imported)] = why
    return found


def test_every_part_of_daemon_is_in_a_layer() -> None:
    for path in DAEMON.iterdir():
        if path.suffix == ".py" or (path / "__init__.py").exists():
            layer(f"daemon.{path.stem}")


def test_the_imports_keep_the_layering() -> None:
    found = violations()
    new = {edge: why for edge, why in found.items() if edge not in KNOWN}
    assert not new, "\n".join(f"{a} imports {b}: {why}" for (a, b), why in sorted(new.items()))


def test_known_exceptions_still_occur() -> None:
    """A fixed import leaves KNOWN (so the list of exceptions only shrinks)."""
    stale = KNOWN - set(violations())
    assert not stale, f"remove from KNOWN: {sorted(stale)}"


def test_the_rules_themselves() -> None:
    assert broken("daemon.jobs.manager", "daemon.crawl.runs.store") is not None
    assert broken("daemon.crawl.runs.crawler", "daemon.tracker.rules") is not None
    assert broken("daemon.crawl.runs.crawler", "daemon.api.errors") is not None
    assert broken("daemon.crawl.runs.crawler", "daemon.crawl.runs.store") is None
    assert broken("daemon.crawl.runs.crawler", "daemon.jobs.store") is None
    assert broken("daemon.api.tracker", "daemon.tracker.store") is not None
    assert broken("daemon.api.crawl", "daemon.crawl.extract.store") is not None
    assert broken("daemon.api.crawl", "daemon.crawl.runs.service") is None
    assert broken("daemon.areas", "daemon.api.crawl") is None
    assert broken("daemon.crawl.component", "daemon.api.crawl") is None
