"""Run inside a loopback-only network namespace (tests/crawl/test_browser_ssrf.py starts it with
`unshare --net`): listeners on the forbidden addresses (cloud metadata, a loopback port outside
allow_cidrs, a private address a name resolves to; TCP and UDP), one allowed listener as the
positive control, the site on a public-looking address, and a page that tries every way a page
can open a connection. Prints what each listener received as JSON."""

from __future__ import annotations

import functools
import socket
import sys
from collections import Counter
from typing import Any

import msgspec
import trio

SITE_IP = "93.184.216.34"
METADATA_IP = "169.254.169.254"
PRIVATE_IP = "10.0.0.5"
ALLOWED_IP = "127.0.0.9"
LOOPBACK_PORT = 8799
HOSTS = {"public.test": SITE_IP, "private.test": PRIVATE_IP, "allowed.test": ALLOWED_IP,
         "rebind.test": METADATA_IP}  # fmt: skip


def attack_page() -> str:
    loop = f"http://127.0.0.1:{LOOPBACK_PORT}"
    return f"""<!doctype html><html><head><title>attack</title>
<link rel="prefetch" href="http://{PRIVATE_IP}/prefetch">
<link rel="dns-prefetch" href="//private.test">
<link rel="preconnect" href="http://private.test">
</head><body><div id="root">attack page</div>
<img src="http://{METADATA_IP}/latest/meta-data/">
<img src="http://2852039166/decimal">
<img src="http://rebind.test/latest/meta-data/">
<img src="/redirect/metadata">
<img src="http://localhost:{LOOPBACK_PORT}/img">
<img src="http://[::1]:{LOOPBACK_PORT}/v6">
<iframe src="http://private.test/frame"></iframe>
<iframe src="{loop}/frame"></iframe>
<script>
fetch("{loop}/fetch").catch(() => {{}});
fetch("http://private.test/fetch", {{mode: "no-cors"}}).catch(() => {{}});
const x = new XMLHttpRequest(); x.open("GET", "http://{METADATA_IP}/xhr"); x.send();
try {{ new WebSocket("ws://{METADATA_IP}/ws"); }} catch (e) {{}}
try {{ new WebSocket("ws://127.0.0.1:{LOOPBACK_PORT}/ws"); }} catch (e) {{}}
navigator.sendBeacon("http://private.test/beacon", "x");
try {{
  const pc = new RTCPeerConnection({{iceServers: [{{urls: "stun:{PRIVATE_IP}:3478"}},
                                                {{urls: "turn:{PRIVATE_IP}:3478", username: "u",
                                                  credential: "p"}}]}});
  pc.createDataChannel("x");
  pc.createOffer().then(o => pc.setLocalDescription(o));
}} catch (e) {{}}
fetch("http://allowed.test/ok").then(r => r.text()).then(t => {{
  document.getElementById("root").textContent = "allowed said " + t; }});
</script></body></html>"""


async def tcp_listener(
    ip: str, port: int, hits: Counter[str], name: str, answer: bytes | None, *, task_status: Any
) -> None:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await sock.bind((ip, port))
    sock.listen(64)
    listener = trio.SocketListener(sock)
    task_status.started()

    async def handle(stream: trio.SocketStream) -> None:
        hits[name] += 1
        async with stream:
            with trio.move_on_after(2):
                await stream.receive_some(4096)
                if answer is not None:
                    await stream.send_all(answer)

    await trio.serve_listeners(handle, [listener])


async def udp_listener(
    ip: str, port: int, hits: Counter[str], name: str, *, task_status: Any
) -> None:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sock.bind((ip, port))
    task_status.started()
    while True:
        await sock.recvfrom(2048)
        hits[name] += 1


async def main() -> None:
    from daemon.crawl.config import BrowserConfig, CrawlConfig
    from daemon.crawl.fetching.proxy import VettingProxy
    from daemon.crawl.options.models import ScrapeOptions
    from daemon.crawl.rendering.browser import BrowserPool
    from daemon.crawl.runs.engine import new_engine
    from daemon.fakes.site import SiteSim, host_map_resolver, serve_site

    hits: Counter[str] = Counter()
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nAccess-Control-Allow-Origin: *\r\nConnection: close\r\n\r\nOK"
    resolver = host_map_resolver(HOSTS)
    async with trio.open_nursery() as nursery:
        for ip, port, name in [
            (METADATA_IP, 80, "metadata"),
            ("127.0.0.1", LOOPBACK_PORT, "loopback"),
            ("::1", LOOPBACK_PORT, "loopback6"),
            (PRIVATE_IP, 80, "private"),
            (PRIVATE_IP, 3478, "private-tcp-3478"),
        ]:
            await nursery.start(functools.partial(tcp_listener, ip, port, hits, name, None))
        await nursery.start(functools.partial(udp_listener, PRIVATE_IP, 3478, hits, "private-udp"))
        await nursery.start(functools.partial(tcp_listener, ALLOWED_IP, 80, hits, "allowed", ok))
        sim = SiteSim(pages=1)
        sim.files["/attack"] = (attack_page().encode(), "text/html")
        await nursery.start(functools.partial(serve_site, sim, f"{SITE_IP}:80"))
        sim.port = 80
        config = CrawlConfig(
            allow_cidrs=[f"{ALLOWED_IP}/32"],
            render="always",
            browser=BrowserConfig(enabled=True, sandbox=False, tabs=1),
        )
        proxy = VettingProxy(allow_cidrs=(f"{ALLOWED_IP}/32",), resolver=resolver)
        await nursery.start(proxy.run)
        pool = BrowserPool(config.browser, lambda: proxy.port, lambda: proxy.closed_port)
        await nursery.start(pool.run)
        engine = new_engine(config, resolver, pool)
        options = msgspec.convert({"waitFor": 2500, "timeout": 20000}, ScrapeOptions)
        produced = await engine.maker.produce("http://public.test/attack", engine.plan(options))
        await trio.sleep(0.5)
        report = {
            "hits": dict(hits),
            "markdown": produced.document.get("markdown", ""),
            "engine": produced.engine,
            "refused": proxy.refused,
            "counts": dict(proxy.counts),
            "site_paths": sorted(sim.counts),
        }
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
        sys.stdout.flush()
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
