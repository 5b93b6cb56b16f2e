# Script-built pages for the rendering tests and benchmark, served by the generated site
# (daemon/fakes/site.py) under /js/. Each is the kind of page plain HTTP gets wrong: the content
# exists only after scripts ran, after a delay, a fetch(), a click, a scroll or a form. Texts the
# tests look for are constants here so tests and pages cannot drift apart.
#
#   /js/delayed          an app root filled 300 ms after load        -> DELAYED_TEXT
#   /js/fetch            items fetched from /js/data.json            -> FETCHED_ITEMS
#   /js/app/{route}      a client-routed app shell (History API)     -> "Route: {route}"
#   /js/button           text revealed by clicking #reveal           -> REVEALED_TEXT
#   /js/infinite         10 items, 10 more per scroll to the bottom (up to 50)
#   /js/form             #q + Enter shows "Results for {q}"
#   /js/lazy             images whose src comes from data-src once visible
#   /js/colors           a 3000 px tall page, a red 100x100 square at (0, 0), blue elsewhere
#   /js/noscript         a <noscript> asking for JavaScript, content built by a script
#   /js/hang             a script that never yields (a hung page)
#   /js/bench/{i}        the benchmark's script-built page i
#   /js/glyph/{hex}      one character (code point {hex}) drawn 240 px high, lang zh-CN: a
#                        screenshot tells a real glyph from a font's missing-glyph box (tofu)
from __future__ import annotations

import msgspec

DELAYED_TEXT = "Inserted by a script after a delay"
FETCHED_ITEMS = ["alpha from JSON", "beta from JSON", "gamma from JSON"]
REVEALED_TEXT = "Revealed by the button"
SERVER_TEXT_MARK = "Loading..."

_SHELL = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>{head}'
    "</head><body>{body}<script>{script}</script></body></html>"
)


def _shell(title: str, body: str, script: str, head: str = "") -> str:
    return _SHELL.format(title=title, head=head, body=body, script=script)


def page(path: str) -> tuple[str, str] | None:
    """(body, media type) of a /js/ path, or None."""
    rest = path.removeprefix("/js/")
    if rest == "data.json":
        return msgspec.json.encode({"items": FETCHED_ITEMS}).decode(), "application/json"
    builder = _PAGES.get(rest)
    if builder is not None:
        return builder(), "text/html; charset=utf-8"
    if rest.startswith("app/") or rest == "app":
        return _app(), "text/html; charset=utf-8"
    if rest.startswith("bench/") and rest[6:].isdigit():
        return _bench(int(rest[6:])), "text/html; charset=utf-8"
    if rest.startswith("glyph/") and _glyph_code(rest[6:]) is not None:
        return _glyph(_glyph_code(rest[6:]) or 0), "text/html; charset=utf-8"
    return None


def _delayed() -> str:
    return _shell(
        "Delayed",
        f'<div id="root">{SERVER_TEXT_MARK}</div>',
        "setTimeout(() => { document.getElementById('root').innerHTML = "
        f"'<h1>Delayed</h1><p id=\"late\">{DELAYED_TEXT}</p>'; }}, 300);",
    )


def _fetch() -> str:
    return _shell(
        "Fetched",
        '<div id="app"></div>',
        "fetch('/js/data.json').then(r => r.json()).then(d => {"
        " document.getElementById('app').innerHTML = '<h1>Fetched</h1><ul>' +"
        " d.items.map(i => '<li>' + i + '</li>').join('') + '</ul>'; });",
    )


def _app() -> str:
    return _shell(
        "App",
        '<div id="root"></div>',
        "function show() { const route = location.pathname.replace('/js/app', '') || '/';"
        " document.getElementById('root').innerHTML = '<h1>Route: ' + route + '</h1>' +"
        ' \'<a href="/js/app/about" id="to-about">About</a>\'; }'
        " document.addEventListener('click', e => { const a = e.target.closest('a');"
        " if (a && a.id === 'to-about') { e.preventDefault(); history.pushState({}, '',"
        " a.href); show(); } }); show();",
    )


def _button() -> str:
    return _shell(
        "Button",
        '<main><h1>Button</h1><button id="reveal">Show more</button>'
        '<p id="more" hidden></p></main>',
        "document.getElementById('reveal').addEventListener('click', () => {"
        f" const p = document.getElementById('more'); p.textContent = '{REVEALED_TEXT}';"
        " p.hidden = false; });",
    )


def _infinite() -> str:
    return _shell(
        "Infinite",
        '<main><h1>Infinite</h1><ul id="list"></ul></main>',
        "let n = 0; function more() { const ul = document.getElementById('list');"
        " for (let k = 0; k < 10 && n < 50; k++, n++) { const li = document.createElement('li');"
        " li.textContent = 'Item ' + n; li.style.height = '120px'; ul.appendChild(li); } }"
        " more(); window.addEventListener('scroll', () => {"
        " if (window.innerHeight + window.scrollY >= document.body.offsetHeight - 200) more(); });",
    )


def _form() -> str:
    return _shell(
        "Form",
        '<main><h1>Search</h1><form id="f"><input id="q" name="q"></form>'
        '<p id="results"></p></main>',
        "document.getElementById('f').addEventListener('submit', e => { e.preventDefault();"
        " document.getElementById('results').textContent = 'Results for ' +"
        " document.getElementById('q').value; });",
    )


def _lazy() -> str:
    images = "".join(
        f'<div style="height: 1500px">Section {k}</div>'
        f'<img class="lazy" alt="picture {k}" data-src="/files/image.png?k={k}" src="">'
        for k in range(3)
    )
    return _shell(
        "Lazy",
        f"<main><h1>Lazy</h1>{images}</main>",
        "const io = new IntersectionObserver(es => es.forEach(e => { if (e.isIntersecting) {"
        " e.target.src = e.target.dataset.src; io.unobserve(e.target); } }));"
        " document.querySelectorAll('img.lazy').forEach(i => io.observe(i));",
    )


def _colors() -> str:
    return _shell(
        "Colors",
        '<div id="red" style="position:absolute;left:0;top:0;width:100px;height:100px;'
        'background:#ff0000"></div><div style="height:3000px"></div>',
        "document.body.dataset.ready = '1';",
        head="<style>html,body{margin:0;background:#0000ff}</style>",
    )


def _noscript() -> str:
    return _shell(
        "Noscript",
        "<noscript>You need to enable JavaScript to run this app.</noscript><div id=main></div>",
        "document.getElementById('main').innerHTML = '<h1>Built</h1><p>Made by a script.</p>';",
    )


def _hang() -> str:
    return _shell("Hang", "<p>about to hang</p>", "while (true) {}")


def _bench(i: int) -> str:
    return _shell(
        f"Bench {i}",
        '<div id="root"></div>',
        f"const items = []; for (let k = 0; k < 40; k++) items.push('<li>Row ' + k + ' of page"
        f" {i}</li>'); document.getElementById('root').innerHTML = '<h1>Bench page {i}</h1>' +"
        " '<p>' + 'Script-built paragraph. '.repeat(20) + '</p><ul>' + items.join('') + '</ul>';",
    )


_PAGES = {
    "delayed": _delayed,
    "fetch": _fetch,
    "button": _button,
    "infinite": _infinite,
    "form": _form,
    "lazy": _lazy,
    "colors": _colors,
    "noscript": _noscript,
    "hang": _hang,
}


def _glyph_code(text: str) -> int | None:
    try:
        code = int(text, 16)
    except ValueError:
        return None
    return code if 0x20 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else None


def _glyph(code: int) -> str:
    return (
        '<!doctype html><html lang="zh-CN"><head><meta charset="utf-8"><title>Glyph</title>'
        "<style>html,body{margin:0;background:#fff}"
        "#g{font:240px/1 sans-serif;color:#000;padding:20px}</style></head>"
        f'<body><div id="g">&#x{code:x};</div></body></html>'
    )
