# A generated website for crawl tests and the crawl benchmark: a real HTTP server on 127.0.0.1
# (Starlette under hypercorn, like the other fakes), so the crawler is exercised through real
# sockets, redirects, status codes, content types and timing rather than a mocked transport.
#
# One server answers for several names (site.test, www.site.test, blog.site.test; tests map them
# to 127.0.0.1 through the Fetcher's resolver) and builds absolute URLs from the Host header, so
# every name sees a consistent site. Pages are generated from their number on request, nothing is
# stored per page, and routing is one dictionary lookup or one prefix split: 5,000 pages (the
# benchmark) cost no memory and little CPU. The site records every request (host, path, trio
# time) so tests count fetches per page and measure politeness at the receiving end.
#
# Layout (site.test and www.site.test):
#   /                      home: links to the tree, the chain, every special case below
#   /pages/{i}             i < pages; a binary tree (i links to 2i+1, 2i+2), rich-ish content;
#                          /pages/{i}/ (trailing slash) serves the same page
#   /chain/{d}             a depth chain (d links to d+1) of `chain_depth` pages
#   /orphans/{k}           only listed in the gzipped sitemap, never linked
#   /private/...           Disallowed for FirecrawlAgent; /private/allowed is Allowed
#   /script.cgi            Disallowed by `Disallow: /*.cgi$` (with a query it is allowed)
#   /redirect/chain/{n}    n hops, then /pages/0;  /redirect/loop/a <-> /redirect/loop/b
#   /redirect/metadata     -> http://169.254.169.254/latest/meta-data/ (must be refused)
#   /redirect/out          -> http://other.test/landing (out of scope)
#   /redirect/www          -> http://www.site.test:PORT/pages/1
#   /status/403 (not linked), /status/404, /status/500, /slow (answers after `slow_seconds`),
#   /large (`large_bytes`)
#   /files/doc.pdf, /files/image.png, /files/data.json, /files/notes.txt
#   /rich                  nav, footer, article, code, table, base64 image, og/meta tags
#   /js/...                script-built pages for rendering (daemon/fakes/js_site.py)
#   /robots.txt, /sitemap.xml and /sitemap_index.xml (index), /sitemap-pages.xml,
#   /sitemap-orphans.xml.gz;  /_site/stats: the request log as JSON (not itself logged)
# blog.site.test: / and /posts/{k}, linked from the home page (allowSubdomains).
from __future__ import annotations

import argparse
import functools
import gzip
import random
import signal
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.server import serve_app
from daemon.fakes import js_site
from daemon.logs import get_logger, setup_logging
from daemon.net.ssrf import Resolver

log = get_logger("fakes.site")

HOSTS = ("site.test", "www.site.test", "blog.site.test")
METADATA_URL = "http://169.254.169.254/latest/meta-data/"
OUT_OF_SCOPE_URL = "http://other.test/landing"
TINY_PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"
    b"\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00"
    b"\x00\x00IEND\xaeB`\x82"
)
BASE64_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4DwAAAQEABRjYTgAAAABJRU5ErkJggg=="
)


@dataclass(frozen=True)
class Hit:
    """One request as the site saw it: `at` is trio's clock when it arrived."""

    host: str
    path: str
    at: float


@dataclass
class SiteSim:
    """The generated site's shape and its request log. Tunables are read per request, so a
    test may change them while the site runs (e.g. `crawl_delay`)."""

    pages: int = 150
    chain_depth: int = 6
    orphans: int = 5
    blog_posts: int = 3
    slow_seconds: float = 5.0
    large_bytes: int = 2 * 1024 * 1024
    crawl_delay: float | None = None
    robots: str | None = None
    """Serve this robots.txt instead of the generated one."""
    paragraphs: int = 4
    """Paragraphs of filler text per tree page (page weight for benchmarks)."""
    latency: tuple[float, float] = (0.0, 0.0)
    """(least, most) seconds before each tree page answers, uniformly drawn (a latency-bound
    site for benchmarks)."""
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    """Extra answers by path, (body, media type): what a test serves (PDFs it made)."""
    headers_by_path: dict[str, dict[str, str]] = field(default_factory=dict)
    """The last request headers seen per "host path" (tests check what a browser sent)."""
    hits: list[Hit] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    """Requests per path (query included, any host)."""
    port: int = 0
    closing: trio.Event = field(default_factory=trio.Event)

    def url(self, path: str = "/", host: str = "site.test") -> str:
        return f"http://{host}:{self.port}{path}"

    def hits_for(self, path: str) -> list[Hit]:
        return [h for h in self.hits if h.path == path]

    def tree_urls(self, host: str = "site.test") -> list[str]:
        return [self.url(f"/pages/{i}", host) for i in range(self.pages)]

    def orphan_urls(self, host: str = "site.test") -> list[str]:
        return [self.url(f"/orphans/{k}", host) for k in range(self.orphans)]

    def robots_txt(self, origin: str) -> str:
        if self.robots is not None:
            return self.robots
        delay = f"Crawl-delay: {self.crawl_delay:g}\n" if self.crawl_delay is not None else ""
        return (
            "User-agent: *\n"
            "Disallow: /agent-test/\n"
            "\n"
            "User-agent: FirecrawlAgent\n"
            "Disallow: /private/\n"
            "Allow: /private/allowed\n"
            "Disallow: /*.cgi$\n"
            f"{delay}"
            "\n"
            f"Sitemap: {origin}/sitemap_index.xml\n"
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/_site/stats", self._stats),
                Route("/{path:path}", self._handle),
            ]
        )

    async def _stats(self, request: Request) -> Response:
        """The request log for a site run as its own process (benchmarks): total requests
        and requests per path. Not itself recorded."""
        body = {"requests": len(self.hits), "counts": dict(self.counts)}
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def _handle(self, request: Request) -> Response:
        host_header = request.headers.get("host", "site.test")
        host = host_header.split(":", 1)[0].lower()
        path = request.url.path
        full = path + (f"?{request.url.query}" if request.url.query else "")
        self.hits.append(Hit(host=host, path=full, at=trio.current_time()))
        self.counts[full] += 1
        self.headers_by_path[f"{host} {full}"] = dict(request.headers)
        origin = f"http://{host_header}"
        if path.startswith("/pages/") and self.latency[1] > 0:
            await trio.sleep(random.uniform(*self.latency))
        if host == "blog.site.test":
            return self._blog(path)
        return await self._site(path, origin, host_header)

    def _blog(self, path: str) -> Response:
        if path == "/":
            links = "".join(
                f'<li><a href="/posts/{k}">Post {k}</a></li>' for k in range(self.blog_posts)
            )
            return _html(_page("Blog", f"<h1>Blog</h1><ul>{links}</ul>"))
        if path.startswith("/posts/"):
            k = path.removeprefix("/posts/")
            if k.isdigit() and int(k) < self.blog_posts:
                return _html(_page(f"Post {k}", f"<h1>Post {k}</h1><p>Blog post {k}.</p>"))
        return _not_found()

    async def _site(self, path: str, origin: str, host_header: str) -> Response:
        static = {
            "/": lambda: _html(self._home(host_header)),
            "/index.html": lambda: _html(self._home(host_header)),
            "/robots.txt": lambda: Response(self.robots_txt(origin), media_type="text/plain"),
            "/sitemap.xml": lambda: _xml(self._sitemap_index(origin)),
            "/sitemap_index.xml": lambda: _xml(self._sitemap_index(origin)),
            "/sitemap-pages.xml": lambda: _xml(self._sitemap_pages(origin)),
            "/sitemap-orphans.xml.gz": lambda: Response(
                gzip.compress(self._sitemap_orphans(origin).encode(), mtime=0),
                media_type="application/x-gzip",
            ),
            "/rich": lambda: _html(RICH_PAGE),
            "/about": lambda: _html(_page("About", "<h1>About</h1><p>About this site.</p>")),
            "/private/secret": lambda: _html(_page("Secret", "<p>robots-blocked</p>")),
            "/private/allowed": lambda: _html(_page("Allowed", "<p>explicitly allowed</p>")),
            "/script.cgi": lambda: _html(_page("CGI", "<p>cgi output</p>")),
            "/agent-test/page": lambda: _html(_page("Agent", "<p>blocked for * only</p>")),
            "/status/403": lambda: _html(_page("Forbidden", "<p>blocked</p>"), 403),
            "/status/404": lambda: _html(_page("Not found", "<p>no such page</p>"), 404),
            "/status/500": lambda: _html(_page("Error", "<p>server error</p>"), 500),
            "/large": lambda: _html("<p>" + "x" * self.large_bytes + "</p>"),
            "/files/doc.pdf": lambda: Response(b"%PDF-1.4\n%fake\n", media_type="application/pdf"),
            "/files/image.png": lambda: Response(TINY_PNG, media_type="image/png"),
            "/files/data.json": lambda: Response(
                b'{"items": [1, 2, 3]}', media_type="application/json"
            ),
            "/files/notes.txt": lambda: Response(
                b"plain notes\nline two\n", media_type="text/plain"
            ),
            "/redirect/loop/a": lambda: _redirect("/redirect/loop/b"),
            "/redirect/loop/b": lambda: _redirect("/redirect/loop/a"),
            "/redirect/metadata": lambda: _redirect(METADATA_URL),
            "/redirect/out": lambda: _redirect(OUT_OF_SCOPE_URL),
            "/redirect/www": lambda: _redirect(f"http://www.{_with_port(host_header)}/pages/1"),
        }
        if path in self.files:
            body, media_type = self.files[path]
            return Response(body, media_type=media_type or None)
        handler = static.get(path)
        if handler is not None:
            return handler()
        if path.startswith("/js/") and (scripted := js_site.page(path)) is not None:
            return Response(scripted[0], media_type=scripted[1])
        if path == "/slow":
            with trio.move_on_after(self.slow_seconds):
                await self.closing.wait()
            return _html(_page("Slow", "<p>finally</p>"))
        head, _, rest = path.lstrip("/").partition("/")
        rest = rest.rstrip("/")
        if head == "pages" and rest.isdigit() and int(rest) < self.pages:
            return _html(self._tree_page(int(rest)))
        if head == "chain" and rest.isdigit() and int(rest) < self.chain_depth:
            return _html(self._chain_page(int(rest)))
        if head == "orphans" and rest.isdigit() and int(rest) < self.orphans:
            return _html(_page(f"Orphan {rest}", f"<p>Only in the sitemap ({rest}).</p>"))
        if head == "redirect" and rest.startswith("chain/"):
            n = rest.removeprefix("chain/")
            if n.isdigit():
                hops = int(n)
                return _redirect("/pages/0" if hops <= 1 else f"/redirect/chain/{hops - 1}")
        return _not_found()

    def _home(self, host_header: str) -> str:
        port_suffix = host_header[host_header.index(":") :] if ":" in host_header else ""
        links = [
            ("/pages/0", "Tree root"),
            ("/chain/0", "Chain"),
            ("/about", "About"),
            ("/rich", "Rich"),
            ("/private/secret", "Private"),
            ("/private/allowed", "Private allowed"),
            ("/script.cgi", "CGI"),
            ("/agent-test/page", "Agent test"),
            ("/redirect/chain/3", "Redirect chain"),
            ("/redirect/loop/a", "Redirect loop"),
            ("/redirect/metadata", "Redirect to metadata"),
            ("/redirect/out", "Redirect out of scope"),
            ("/redirect/www", "Redirect to www"),
            ("/status/404", "Missing"),
            ("/status/500", "Broken"),
            ("/slow", "Slow"),
            ("/files/doc.pdf", "PDF"),
            ("/files/image.png", "PNG"),
            ("/files/data.json", "JSON"),
            ("/files/notes.txt", "Text"),
            (f"http://www.site.test{port_suffix}/pages/1", "www duplicate"),
            ("/pages/2/", "trailing slash duplicate"),
            ("/index.html", "index duplicate"),
            ("/about#team", "fragment"),
            (f"http://blog.site.test{port_suffix}/", "Blog"),
            ("http://other.test/page", "External"),
            ("https://twitter.com/site", "Social"),
            ("mailto:hello@site.test", "Mail"),
        ]
        items = "".join(f'<li><a href="{href}">{text}</a></li>' for href, text in links)
        return _page("Home", f"<h1>Site home</h1><ul>{items}</ul>")

    def _tree_page(self, i: int) -> str:
        children = [c for c in (2 * i + 1, 2 * i + 2) if c < self.pages]
        links = "".join(f'<li><a href="/pages/{c}">Page {c}</a></li>' for c in children)
        filler = "".join(
            f"<p>Paragraph {p} of page {i}. {LOREM}</p>" for p in range(self.paragraphs)
        )
        body = (
            f"<h1>Page {i}</h1>{filler}"
            f"<table><tr><th>page</th><th>children</th></tr>"
            f"<tr><td>{i}</td><td>{len(children)}</td></tr></table>"
            f'<pre><code class="language-python">print({i})</code></pre>'
            f"<ul>{links}</ul>"
        )
        return _page(f"Page {i}", body, description=f"Generated page {i}")

    def _chain_page(self, d: int) -> str:
        nxt = f'<a href="/chain/{d + 1}">next</a>' if d + 1 < self.chain_depth else "end"
        return _page(f"Chain {d}", f"<h1>Chain {d}</h1><p>{nxt}</p>")

    def _sitemap_index(self, origin: str) -> str:
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<sitemap><loc>{origin}/sitemap-pages.xml</loc></sitemap>"
            f"<sitemap><loc>{origin}/sitemap-orphans.xml.gz</loc></sitemap>"
            "</sitemapindex>"
        )

    def _sitemap_pages(self, origin: str) -> str:
        locs = [f"{origin}/", f"{origin}/about", f"{origin}/rich"]
        locs += [f"{origin}/pages/{i}" for i in range(0, self.pages, 10)]
        return _urlset(locs)

    def _sitemap_orphans(self, origin: str) -> str:
        return _urlset([f"{origin}/orphans/{k}" for k in range(self.orphans)])


LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation "
    "ullamco laboris nisi ut aliquip ex ea commodo consequat."
)

RICH_PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Rich page</title>
<meta name="description" content="A page with every kind of content">
<meta name="keywords" content="crawl, test">
<meta property="og:title" content="Rich OG title">
<meta property="og:description" content="Rich OG description">
<meta property="og:image" content="/og.png">
<meta property="article:published_time" content="2025-01-02T03:04:05Z">
<link rel="icon" href="/favicon.ico">
<script>window.tracking = true;</script>
<style>body {{ font-family: serif; }}</style>
</head>
<body>
<header class="header"><a href="/">Site</a></header>
<nav><a href="/about">About</a> <a href="/pages/0">Pages</a></nav>
<main>
<article>
<h1>Rich content</h1>
<p>Text with <strong>bold</strong>, <em>emphasis</em> and a <a href="/pages/3">link</a>.</p>
<pre><code class="language-python">def hello():
    return "world"
</code></pre>
<table>
<thead><tr><th>Name</th><th>Value</th></tr></thead>
<tbody><tr><td>alpha</td><td>1</td></tr><tr><td>beta</td><td>2</td></tr></tbody>
</table>
<img src="data:image/png;base64,{BASE64_PNG}" alt="inline pixel">
<img src="/img/small.png" srcset="/img/small.png 320w, /img/large.png 1280w" alt="photo">
</article>
</main>
<aside class="sidebar"><a href="/chain/0">Sidebar link</a></aside>
<footer class="footer"><p>Footer text</p><a href="/about">About us</a></footer>
</body>
</html>"""


def _with_port(host_header: str) -> str:
    host, _, port = host_header.partition(":")
    bare = host.removeprefix("www.")
    return f"{bare}:{port}" if port else bare


def _page(title: str, body: str, *, description: str = "") -> str:
    meta = f'<meta name="description" content="{description}">' if description else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title>{meta}</head><body>"
        '<nav class="menu"><a href="/">Home</a> <a href="/about">About</a></nav>'
        f"<main>{body}</main>"
        '<footer class="footer">Generated site</footer></body></html>'
    )


def _urlset(locs: list[str]) -> str:
    entries = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
    )


def _html(text: str, status: int = 200) -> Response:
    return Response(text, status_code=status, media_type="text/html; charset=utf-8")


def _xml(text: str) -> Response:
    return Response(text, media_type="application/xml")


def _redirect(location: str) -> Response:
    return Response(status_code=302, headers={"location": location})


def _not_found() -> Response:
    return _html(_page("Not found", "<p>no such page</p>"), 404)


async def serve_site(
    sim: SiteSim,
    bind: str = "127.0.0.1:0",
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `sim` on `bind` until `shutdown` is set (or the task is cancelled); started() gets
    (host, port) and `sim.port` is set. A pending /slow answers at once when shutting down."""
    stop = shutdown if shutdown is not None else trio.Event()

    async def release_slow_pages() -> None:
        await stop.wait()
        sim.closing.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_slow_pages)
        host, port = await nursery.start(
            functools.partial(
                serve_app, sim.app(), bind, shutdown=stop, graceful_timeout=0.5, name="site"
            )
        )
        sim.port = port
        task_status.started((host, port))
    sim.closing.set()


def host_map_resolver(hosts: dict[str, str] | None = None) -> Resolver:
    """A Fetcher resolver answering `hosts` (default: the site's names -> 127.0.0.1) and
    failing like an unknown name for anything else."""
    table = dict.fromkeys(HOSTS, "127.0.0.1") if hosts is None else dict(hosts)

    async def resolve(host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        if host in table:
            return [table[host]]
        raise OSError(f"unknown test host {host}")

    return resolve


def _serve_in_processes(args: argparse.Namespace, extra: list[str]) -> int:
    """Serve one listening socket from `args.processes` child processes (a benchmark's
    crawler may outrun one hypercorn process). Request counts are per child."""
    host, _, port = args.bind.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), int(port)))
    sock.listen(1024)
    sock.set_inheritable(True)
    command = [sys.executable, "-m", "daemon.fakes.site", "--bind", f"fd://{sock.fileno()}"]
    children = [
        subprocess.Popen([*command, *extra], pass_fds=(sock.fileno(),))
        for _ in range(args.processes)
    ]
    bound = sock.getsockname()
    log.info("listening", url=f"http://{bound[0]}:{bound[1]}/", processes=args.processes)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait()
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.site",
        description="A generated test website (answers for site.test, www. and blog.).",
    )
    parser.add_argument(
        "--bind", default="127.0.0.1:8703", help="host:port or fd://N (default %(default)s)"
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="serving processes (default %(default)s)"
    )
    parser.add_argument("--pages", type=int, default=150, help="tree pages (default %(default)s)")
    parser.add_argument("--crawl-delay", type=float, default=None, help="robots.txt Crawl-delay")
    parser.add_argument(
        "--paragraphs", type=int, default=4, help="filler paragraphs per page (default %(default)s)"
    )
    parser.add_argument(
        "--latency",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=(0.0, 0.0),
        help="LEAST,MOST seconds before each tree page answers (default none)",
    )
    args = parser.parse_args(argv)
    setup_logging("info")
    if args.processes > 1:
        extra = ["--pages", str(args.pages), "--paragraphs", str(args.paragraphs),
                 "--latency", ",".join(map(str, args.latency))]  # fmt: skip
        if args.crawl_delay is not None:
            extra += ["--crawl-delay", str(args.crawl_delay)]
        return _serve_in_processes(args, extra)
    sim = SiteSim(
        pages=args.pages,
        crawl_delay=args.crawl_delay,
        paragraphs=args.paragraphs,
        latency=args.latency,
    )

    async def serve() -> None:
        stop = trio.Event()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                host, port = await nursery.start(
                    functools.partial(serve_site, sim, args.bind, shutdown=stop)
                )
                if not args.bind.startswith("fd://"):
                    log.info("listening", url=f"http://{host}:{port}/", pages=args.pages)
                async for _ in signals:
                    stop.set()
                    break

    trio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
