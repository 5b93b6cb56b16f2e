"""The rooms of the crawl area, read from the imports (tests/test_layering.py's reader): each
sub-package of `daemon/crawl/` is one job a newcomer can find by name, no folder holds more than
MAX_MODULES modules, and the imports between the rooms go one way, down ROOMS.

The area's own top level holds its foundation (config, proxies, problems, metrics: any room may
import them; they import no room) and its
assembly (`component`, which may import any room). A new feature gets a room of its own, placed
in ROOMS after everything it imports."""

from __future__ import annotations

from pathlib import Path

from tests.test_layering import DAEMON, imports, module_name

CRAWL = DAEMON / "crawl"
MAX_MODULES = 25
FOUNDATION = {"config", "proxies", "problems", "metrics"}
ASSEMBLY = {"component"}
ROOMS = [
    "fetching",  # one GET through the SSRF guard, proxies, the host gate, URLs
    "content",  # a body made a document: decoding, markdown, main content
    "documents",  # files made documents: PDF text layers, OCR, images, office files, `parsers`
    "rendering",  # the browser: CDP, render, actions, screenshots
    "discovery",  # robots.txt and sitemaps
    "tracking",  # changeTracking and its previous copies
    "cache",  # the document cache
    "llmwork",  # question, highlights and query: what the model is asked of a page, checked
    "options",  # what clients send and get back, parsed and checked
    "v1",  # v1 requests as v2's
    "runs",  # the crawl service, a page's pipeline, crawls, batches, maps, their store
    "prompts",  # crawl options from a prompt (params-preview, crawl `prompt`)
    "search",  # /v2/search
    "extract",  # /v2/extract jobs
    "agent",  # /v2/agent jobs: search, read, choose, answer
    "monitors",  # /v2/monitor: schedules, checks, page diffs
    "feedback",  # /v2/feedback, /v2/search/{id}/feedback: validated, stored, listed
]


def room(module: str) -> str:
    """The room of a `daemon.crawl.…` module: a ROOMS name, "foundation" or "assembly"."""
    parts = module.split(".")
    assert parts[:2] == ["daemon", "crawl"], module
    if len(parts) == 2:
        return "foundation"
    name = parts[2]
    if name in FOUNDATION:
        return "foundation"
    if name in ASSEMBLY:
        return "assembly"
    assert name in ROOMS, f"{module}: daemon/crawl/{name} is in no room: add it to ROOMS"
    return name


def rank(name: str) -> int:
    if name == "foundation":
        return -1
    if name == "assembly":
        return len(ROOMS)
    return ROOMS.index(name)


def upward(importer: str, imported: str) -> bool:
    """Whether `importer` reaches up (or across) to a room above its own."""
    src, dst = room(importer), room(imported)
    if src == dst:
        return False
    return rank(dst) >= rank(src)


def crawl_modules() -> list[Path]:
    return sorted(CRAWL.rglob("*.py"))


def test_every_module_is_in_a_room() -> None:
    for path in crawl_modules():
        room(module_name(path))


def test_no_folder_is_crowded() -> None:
    crowded = {
        folder.relative_to(DAEMON.parent).as_posix(): n
        for folder in [CRAWL, *(p for p in CRAWL.iterdir() if p.is_dir())]
        if (n := sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")) > MAX_MODULES
    }
    assert not crowded, crowded


def test_imports_between_rooms_go_one_way() -> None:
    found = sorted(
        f"{module_name(path)} imports {imported} ({room(module_name(path))} → {room(imported)})"
        for path in crawl_modules()
        for imported in imports(path)
        if imported.startswith("daemon.crawl") and upward(module_name(path), imported)
    )
    assert not found, "\n".join(found)


def test_the_rule_itself() -> None:
    assert not upward("daemon.crawl.runs.pages", "daemon.crawl.fetching.fetch")
    assert upward("daemon.crawl.fetching.fetch", "daemon.crawl.runs.pages")
    assert upward("daemon.crawl.config", "daemon.crawl.fetching.fetch")
    assert not upward("daemon.crawl.component", "daemon.crawl.extract.service")
    assert not upward("daemon.crawl.options.models", "daemon.crawl.options.rules")
    assert upward("daemon.crawl.search.service", "daemon.crawl.extract.store")
