"""A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe` (no websocket, no
port): Debian's Chromium reads commands on fd 3 and writes answers on fd 4, NUL-terminated JSON.
Blocking calls (run them with trio.to_thread in async tests); one reader thread files answers by
id and keeps every event, so a test can look for console errors and failed requests afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--mute-audio", "--no-default-browser-check",
    "--remote-debugging-pipe",
]  # fmt: skip


def chromium_path() -> str | None:
    return (
        os.environ.get("CRAWLD_CHROMIUM")
        or shutil.which("chromium")
        or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    )


class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="crawld-ui-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # above 9, so that moving them to 3 and 4 cannot overwrite one with the other
        for low in (to_child_r, from_child_w):
            high = fcntl.fcntl(low, fcntl.F_DUPFD, 10)
            os.close(low)
            if low == to_child_r:
                to_child_r = high
            else:
                from_child_w = high
        # bash (not dash: it takes fds above 9) moves our pipe ends to the fds Chromium expects (3 in, 4 out).
        command = " ".join([f"exec '{executable}'", *FLAGS, f"--user-data-dir='{self.profile}'",
                            f"3<&{to_child_r}", f"4>&{from_child_w}", "about:blank"])  # fmt: skip
        self.process = subprocess.Popen(
            ["bash", "-c", command],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("CRAWLD_UI_CHROMIUM_LOG") else subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._answers: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition(self._lock)
        self.events: list[dict[str, Any]] = []
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                with self._cond:
                    if "id" in message:
                        self._answers[message["id"]] = message
                    else:
                        self.events.append(message)
                    self._cond.notify_all()

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:  # fmt: skip
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while message_id not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise CDPError(f"no answer to {method} within {timeout}s")
                self._cond.wait(left)
            answer = self._answers.pop(message_id)
        if "error" in answer:
            raise CDPError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def new_page(self, width: int = 1200, height: int = 900) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        page = Page(self, session["sessionId"])
        for domain in ("Page", "Runtime", "Network", "Log"):
            page.call(f"{domain}.enable")
        page.resize(width, height)
        return page

    def close(self) -> None:
        with contextlib.suppress(CDPError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=10)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self.mark = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def resize(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                  "deviceScaleFactor": 1, "mobile": width < 500})  # fmt: skip

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def js(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})  # fmt: skip
        if "exceptionDetails" in answer:
            raise CDPError(f"{expression[:80]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.js(
                    f"(() => {{ const v = ({expression}); return v instanceof Node || v; }})()"
                )
            except CDPError:
                last = None
            if last:
                return last
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression!r} (last value {last!r})")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))

    def events(self) -> list[dict[str, Any]]:
        with self.browser._cond:
            return [e for e in self.browser.events if e.get("sessionId") == self.session]

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, failed requests and HTTP errors seen so far."""
        found = []
        for event in self.events():
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"request failed: {params.get('errorText')}")
            elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
                found.append(f"HTTP {params['response']['status']} {params['response']['url']}")
        return found


@contextmanager
def browser() -> Iterator[Browser]:
    executable = chromium_path()
    if executable is None:
        raise FileNotFoundError("chromium not found (apt-get install chromium)")
    opened = Browser(executable)
    try:
        yield opened
    finally:
        opened.close()
