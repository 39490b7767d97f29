"""A small headless-Chromium driver over the DevTools protocol, standard library only.

Chromium's `--remote-debugging-pipe` speaks the protocol over file descriptors 3 (commands
in) and 4 (replies and events out), NUL-separated JSON: no websocket library, no port to pick,
nothing reachable from outside the process. Used by the report tests and by
scripts/screenshot_report.py.
"""

from __future__ import annotations

import base64
import contextlib
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
from types import TracebackType
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",  # we run as root in containers; the sandbox refuses root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """The browser binary: $STITCHSIM_CHROMIUM, Debian's, or whatever is on PATH."""
    explicit = os.environ.get("STITCHSIM_CHROMIUM")
    if explicit:
        return explicit
    # Debian's /usr/bin/chromium is a shell wrapper; the real binary avoids its noise.
    if os.access("/usr/lib/chromium/chromium", os.X_OK):
        return "/usr/lib/chromium/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class DevToolsError(RuntimeError):
    pass


def _high_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose descriptors are numbered 10 or more."""
    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return ends[0], ends[1]


class Chromium:
    """One browser process; `new_page()` opens tabs in it."""

    def __init__(self, binary: str, timeout_s: float = 30.0) -> None:
        self.binary = binary
        self.timeout_s = timeout_s
        self._next_id = 0
        self._lock = threading.Lock()
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._events: list[dict[str, Any]] = []
        self._events_changed = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._profile = ""

    # -------------------------------------------------------------- process

    def __enter__(self) -> Chromium:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="stitchsim-chromium-")
        to_browser_r, self._to_browser = _high_pipe()
        self._from_browser, from_browser_w = _high_pipe()

        def wire_pipes() -> None:
            # The child must find the pipe ends at exactly fds 3 and 4. The sources sit at 10
            # and up, so neither dup2 clobbers the other's source nor is a no-op, and dup2
            # makes the copies inheritable while every other descriptor stays close-on-exec.
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        # Kept open for the browser's lifetime (closed in close()), so no `with` here.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            close_fds=False, preexec_fn=wire_pipes,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        threading.Thread(target=self._read_loop, daemon=True).start()
        try:
            self.call("Browser.getVersion")
        except (DevToolsError, OSError) as exc:
            code = self._proc.poll()
            self.close()
            raise DevToolsError(f"chromium did not start (exit {code}): {exc}") from exc

    def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        with contextlib.suppress(DevToolsError, OSError):
            self.call("Browser.close", timeout_s=5)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def stderr_tail(self, limit: int = 4000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    # -------------------------------------------------------------- protocol

    def _read_loop(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                self._dispatch(json.loads(raw))
        with self._events_changed:
            self._events.append({"method": "__closed__"})
            self._events_changed.notify_all()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            with self._lock:
                box = self._replies.get(message["id"])
            if box is not None:
                box.put(message)
            return
        with self._events_changed:
            self._events.append(message)
            self._events_changed.notify_all()

    def call(self, method: str, params: dict[str, Any] | None = None,
             session_id: str | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            box: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1)
            self._replies[ident] = box
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session_id:
            message["sessionId"] = session_id
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except OSError as exc:
            raise DevToolsError(f"{method}: browser gone ({exc})\n{self.stderr_tail()}") from exc
        try:
            reply = box.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty as exc:
            raise DevToolsError(f"{method}: no reply within {timeout_s or self.timeout_s}s\n"
                                f"{self.stderr_tail()}") from exc
        finally:
            with self._lock:
                self._replies.pop(ident, None)
        if "error" in reply:
            raise DevToolsError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def events(self, session_id: str) -> list[dict[str, Any]]:
        with self._events_changed:
            return [e for e in self._events if e.get("sessionId") == session_id]

    def wait_event(self, session_id: str, method: str, after: int,
                   timeout_s: float | None = None) -> dict[str, Any]:
        """The first `method` event of the session among events numbered `after` and up."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self._events_changed:
            while True:
                for event in self._events[after:]:
                    if event.get("method") == "__closed__":
                        raise DevToolsError(f"browser exited\n{self.stderr_tail()}")
                    if event.get("sessionId") == session_id and event.get("method") == method:
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DevToolsError(f"no {method} within the timeout")
                self._events_changed.wait(left)

    def event_count(self) -> int:
        with self._events_changed:
            return len(self._events)

    def new_page(self, width: int = 1200, height: int = 900) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        return page


class Page:
    """One tab, with everything it logged since it opened."""

    def __init__(self, browser: Chromium, target_id: str, session_id: str) -> None:
        self.browser = browser
        self.target_id = target_id
        self.session_id = session_id

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, session_id=self.session_id)

    def navigate(self, url: str) -> None:
        mark = self.browser.event_count()
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise DevToolsError(f"navigation to {url} failed: {result['errorText']}")
        self.browser.wait_event(self.session_id, "Page.loadEventFired", mark)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression!r} threw {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Errors and warnings the page logged: console calls, exceptions, browser log."""
        found: list[str] = []
        for event in self.browser.events(self.session_id):
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error", "assert", "warning"
            ):
                found.append(" ".join(str(a.get("value", a.get("description", "")))
                                      for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                found.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in (
                "error", "warning"
            ):
                found.append(params["entry"].get("text", ""))
        return found

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events(self.session_id)
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path | None = None, full_page: bool = True) -> bytes:
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            width = int(self.evaluate("window.innerWidth"))
            self.call("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": int(size["height"]) + 1,
                "deviceScaleFactor": 1, "mobile": False,
            })
        data = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
        if path is not None:
            path.write_bytes(data)
        return data

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target_id})
