"""Headless Chromium for tests: find (or install) Debian's chromium and drive it over the DevTools pipe.

`--remote-debugging-pipe` speaks the Chrome DevTools Protocol over file descriptors 3 (commands
in) and 4 (responses and events out), NUL-terminated JSON, so no websocket client, webdriver or
browser download is needed. Used by tests/test_report.py to open the HTML report offline and check
console errors, network requests, rendered figures and a screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
INSTALL_LOCK = Path(tempfile.gettempdir()) / "geocont-chromium-install.lock"


def find_or_install() -> tuple[Path | None, str]:
    """(path, "") when Debian's chromium is there or could be installed; (None, reason) otherwise.

    Installing runs `apt-get update` then `apt-get install -y chromium` (root only), under a file
    lock so that concurrent test processes do not race apt.
    """
    if CHROMIUM.exists():
        return CHROMIUM, ""
    if shutil.which("apt-get") is None:
        return None, "chromium is missing and apt-get is not available to install it"
    if os.geteuid() != 0:
        return None, "chromium is missing and installing it with apt-get needs root"
    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not CHROMIUM.exists():
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
                except subprocess.TimeoutExpired:
                    return None, f"`{' '.join(cmd)}` timed out"
                if done.returncode != 0:
                    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                    return None, f"`{' '.join(cmd)}` failed: {tail[0]}"
    return (CHROMIUM, "") if CHROMIUM.exists() else (None, "apt-get install chromium did not provide /usr/bin/chromium")


def _above_nine(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class DevToolsError(RuntimeError):
    pass


class Browser:
    """One headless Chromium process and one page, driven synchronously over the DevTools pipe."""

    def __init__(self, binary: Path, width: int = 1400, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="geocont-chromium-")
        self._log = open(Path(self.profile) / "stderr.log", "wb")  # a pipe nobody reads could fill and stall it
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Move the child's ends above 9 so that the shell's "3<&N 4>&M" never clobbers one with the other.
        to_child_r, from_child_w = (_above_nine(fd) for fd in (to_child_r, from_child_w))
        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--mute-audio",
            "--hide-scrollbars", "about:blank",
        ]  # fmt: skip
        # bash (dash allows one-digit fds only) puts our pipe ends on fds 3 and 4, where Chromium expects them.
        script = f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w} {to_child_r}<&- {from_child_w}>&-'
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", script, str(binary), *flags],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=True)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )

    # -- protocol --------------------------------------------------------------------------

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_child, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self._messages.put(json.loads(raw))

    def call(self, method: str, params: dict | None = None, session: bool = False, timeout: float = 30.0) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise DevToolsError(f"{method}: no answer within {timeout} s") from None
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    # -- what tests use --------------------------------------------------------------------

    def open(self, url: str, ready: str, timeout: float = 60.0) -> Any:
        """Navigate, then poll the JS expression `ready` until it is truthy; returns its value."""
        self.call("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(ready)
            if value:
                return value
            time.sleep(0.1)
        raise DevToolsError(f"page not ready after {timeout} s: {ready}")

    def screenshot(self) -> bytes:
        """PNG of the whole page (not just the viewport)."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
            session=True,
            timeout=60.0,
        )
        return base64.b64decode(shot["data"])

    def console_problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and error log entries seen so far."""
        self.drain()
        problems = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                problems.append(f"console.{params['type']}: {args}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                problems.append(f"exception: {details.get('exception', {}).get('description', details.get('text'))}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                problems.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return problems

    def requested_urls(self) -> list[str]:
        self.drain()
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def drain(self) -> None:
        while True:
            try:
                self.events.append(self._messages.get_nowait())
            except queue.Empty:
                return

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5.0)
        except (DevToolsError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        try:
            os.close(self._to_child)
        except OSError:
            pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
