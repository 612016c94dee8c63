"""Headless Chromium for UI tests, driven through chromedriver's W3C WebDriver HTTP API.

Debian's ``chromium`` and ``chromium-driver`` packages (scripts/bootstrap.sh installs them); the
protocol is a handful of JSON requests, so no client library is needed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def chromium_paths() -> tuple[str, str]:
    """``(chromium, chromedriver)``; fails (not skips) when they are missing: bootstrap installs them."""
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    missing = [p for p in (browser, driver) if not Path(p).exists()]
    if missing:
        pytest.fail(f"{missing} missing: run scripts/bootstrap.sh (apt-get install chromium chromium-driver)")
    return browser, driver


class Browser:
    """One WebDriver session of headless Chromium."""

    def __init__(self, driver_url: str, session: str) -> None:
        self.base = f"{driver_url}/session/{session}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"webdriver {method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def get(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def add_cookie(self, name: str, value: str) -> None:
        self._call("POST", "/cookie", {"cookie": {"name": name, "value": value, "path": "/"}})

    def script(self, source: str, *args: Any) -> Any:
        """Run ``source`` (a function body; ``arguments`` holds ``args``) and return its value."""
        return self._call("POST", "/execute/sync", {"script": source, "args": list(args)})

    def find_all(self, css: str) -> list[str]:
        found = self._call("POST", "/elements", {"using": "css selector", "value": css})
        return [e[ELEMENT] for e in found]

    def click(self, element: str) -> None:
        self._call("POST", f"/element/{element}/click", {})

    def attribute(self, element: str, name: str) -> str | None:
        value: str | None = self._call("GET", f"/element/{element}/attribute/{name}")
        return value

    def prop(self, element: str, name: str) -> Any:
        """A DOM property (``href`` resolved against the page, unlike the attribute)."""
        return self._call("GET", f"/element/{element}/property/{name}")

    def wait_for(self, css: str, *, count: int = 1, timeout: float = 30.0) -> list[str]:
        """The elements matching ``css`` once there are at least ``count`` (fails with the page's error)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find_all(css)
            if len(found) >= count:
                return found
            error = self.script("return document.body ? document.body.dataset.error || null : null;")
            if error:
                raise AssertionError(f"page error while waiting for {css!r}: {error}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{css!r}: {len(found)} element(s) after {timeout:g}s, wanted {count}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))


@contextlib.contextmanager
def headless_chromium(*, width: int = 1400, height: int = 900) -> Iterator[Browser]:
    """A chromedriver on a free port with one headless Chromium session; both end on exit."""
    binary, driver = chromium_paths()
    port = _free_port()
    proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/status", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("chromedriver did not start") from None
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": binary,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}"],
        }}}}
        request = urllib.request.Request(f"{url}/session", data=json.dumps(caps).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            session = json.loads(response.read())["value"]["sessionId"]
        browser = Browser(url, session)
        try:
            yield browser
        finally:
            with contextlib.suppress(Exception):
                browser._call("DELETE", "")
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
